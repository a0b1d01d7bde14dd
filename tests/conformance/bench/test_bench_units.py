"""`modeldeploy bench` pieces without a server: arrivals, workload, SLOs, capacity search, verdicts."""

from __future__ import annotations

import json
import random

import pytest

from modeldeploy.conformance import measures as M
from modeldeploy.conformance.bench import arrivals, stats
from modeldeploy.conformance.bench import workload as W
from modeldeploy.conformance.bench.client import Record
from modeldeploy.conformance.bench.runner import BenchConfig, CapacitySearch


def test_arrivals_have_the_asked_mean_and_shape():
    rng = random.Random(1)
    for kind in ("poisson", "gamma"):
        gaps = [arrivals.gap(kind, 4.0, rng, burstiness=0.5) for _ in range(20000)]
        assert abs(sum(gaps) / len(gaps) - 0.25) < 0.01
    # gamma shape 0.5 is burstier than Poisson: coefficient of variation sqrt(2) vs 1
    g = [arrivals.gap("gamma", 4.0, rng, burstiness=0.5) for _ in range(20000)]
    p = [arrivals.gap("poisson", 4.0, rng) for _ in range(20000)]

    def cv(xs):
        m = sum(xs) / len(xs)
        return (sum((x - m) ** 2 for x in xs) / len(xs)) ** 0.5 / m

    assert cv(g) > 1.3 > 1.1 > cv(p) > 0.9
    assert arrivals.schedule("constant", 2.0, rng, count=5) == [0.0, 0.5, 1.0, 1.5, 2.0]


def test_schedule_is_bounded_by_count_or_duration_and_never_unbounded():
    rng = random.Random(0)
    assert len(arrivals.schedule("constant", 10.0, rng, duration_s=1.0)) == 10
    assert len(arrivals.schedule("constant", 10.0, rng, duration_s=100.0, count=3)) == 3
    with pytest.raises(ValueError, match="--duration or --requests"):
        arrivals.schedule("poisson", 1.0, rng)
    with pytest.raises(ValueError, match="--rates"):
        arrivals.schedule("poisson", 0.0, rng, count=1)


def test_same_seed_same_workload_and_the_mix_is_70_25_5():
    counter = W.TokenCounter()
    a = W.synthetic(W.DEFAULT_MIX, 2000, random.Random(7), counter)
    b = W.synthetic(W.DEFAULT_MIX, 2000, random.Random(7), counter)
    assert [x.prompt for x in a] == [x.prompt for x in b]
    share = {s.name: sum(x.shape == s.name for x in a) / len(a) for s in W.DEFAULT_MIX}
    assert abs(share["short"] - 0.70) < 0.03 and abs(share["medium"] - 0.25) < 0.03
    assert abs(share["long"] - 0.05) < 0.015
    assert len({x.prompt for x in a}) == len(a)  # no two prompts alike: no accidental prefix hits
    short = [x for x in a if x.shape == "short"]
    assert all(0.85 * 128 <= x.prompt_tokens <= 128 for x in short)


def test_tokenizer_counts_real_tokens(llama_dir):
    counter = W.TokenCounter(str(llama_dir))
    assert counter.method.startswith("tokenizers:")
    items = W.synthetic((W.Shape("s", 1, 50, 8),), 20, random.Random(0), counter)
    assert all(44 <= it.prompt_tokens <= 51 for it in items), [it.prompt_tokens for it in items]
    with pytest.raises(ValueError, match="--tokenizer: .* has no tokenizer.json"):
        W.TokenCounter("/nonexistent")


def test_mix_parse_errors_name_the_flag():
    assert W.parse_mix("a:1:10:5,b:3:20:6")[1] == W.Shape("b", 3.0, 20, 6)
    for bad in ("a:1:10", "a:x:10:5", "a:0:10:5", "a:1:0:5", "a:1:10:9-5", "a:1:10:0-5", "a:1:10:5-x"):
        with pytest.raises(ValueError, match="--mix"):
            W.parse_mix(bad)


def test_a_length_range_is_drawn_from_the_range_and_not_jittered():
    (shape,) = W.parse_mix("s:1:64:64-128")
    assert shape == W.Shape("s", 1.0, 64, 128, None, 64)
    items = W.synthetic((shape,), 400, random.Random(3), W.TokenCounter(), jitter=0.5)
    outs = [it.output_tokens for it in items]
    assert min(outs) >= 64 and max(outs) <= 128
    assert min(outs) < 72 and max(outs) > 120  # the whole range, not a jittered 128
    assert all(32 <= it.prompt_tokens <= 64 for it in items)  # a plain length still jitters


def test_dataset_jsonl_and_sharegpt(tmp_path):
    counter = W.TokenCounter()
    jl = tmp_path / "d.jsonl"
    jl.write_text(
        json.dumps({"prompt": "hello there", "output_tokens": 7})
        + "\n"
        + json.dumps({"messages": [{"role": "user", "content": "hi"}]})
        + "\n"
    )
    items = W.load_dataset(str(jl), counter)
    assert [i.output_tokens for i in items] == [7, 128]
    assert items[1].messages == [{"role": "user", "content": "hi"}]
    sg = tmp_path / "sg.json"
    sg.write_text(
        json.dumps(
            [
                {"conversations": [{"from": "human", "value": "why?"}, {"from": "gpt", "value": "x" * 40}]},
                {"conversations": []},
            ]
        )
    )
    items = W.load_dataset(str(sg), counter)
    assert len(items) == 1 and items[0].output_tokens == 10 and items[0].prompt == "why?"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\nnot json\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        W.load_dataset(str(bad), counter)
    bad.write_text(json.dumps({"text": "a"}))
    with pytest.raises(ValueError, match="none of prompt, messages, conversations"):
        W.load_dataset(str(bad), counter)


def test_slo_flags_parse_and_refuse_nonsense():
    assert stats.parse_slo([]) == {"ttft": 1.0, "tpot": 0.1}
    assert stats.parse_slo(["ttft=0.5,ttft_p95=2", "error_rate=0.01"]) == {
        "ttft": 0.5,
        "ttft_p95": 2.0,
        "error_rate": 0.01,
    }
    assert stats.parse_slo([], "ttft:500,tpot:50,e2el:4000") == {"ttft": 0.5, "tpot": 0.05, "e2e": 4.0}
    with pytest.raises(ValueError, match="--slo"):
        stats.parse_slo(["latency=1"])
    with pytest.raises(ValueError, match="> 0"):
        stats.parse_slo(["ttft=0"])
    with pytest.raises(ValueError, match="--goodput"):
        stats.parse_slo([], "ttft=5")


def _rec(i: int, ttft: float, gap: float, n: int = 10, outcome: str = "completed") -> Record:
    r = Record(i, "s", 0.0, status=200 if outcome == "completed" else 429, outcome=outcome)
    if outcome == "completed":
        r.ttft, r.itl = ttft, [gap] * (n - 1)
        r.e2e = ttft + gap * (n - 1)
        r.output_tokens = n
        r.tpot = gap
    return r


def test_goodput_counts_only_requests_within_every_slo():
    rs = [_rec(0, 0.1, 0.01), _rec(1, 2.0, 0.01), _rec(2, 0.1, 0.5), _rec(3, 0, 0, outcome="rejected")]
    s = stats.summarize(rs, {"ttft": 1.0, "tpot": 0.1, "ttft_p50": 0.05}, rate=1.0)
    assert [r.good for r in rs] == [True, False, False, False]
    assert s["good_share"] == 0.25 and s["error_rate"] == 0.25
    assert s["slo_flags"]["ttft_p50"] == {
        "bound": 0.05,
        "value": M.quantile([0.1, 2.0, 0.1], 0.5),
        "ok": False,
    }


def test_refusal_latency_counts_only_refused_requests():
    refused = [_rec(i, 0, 0, outcome="rejected") for i in range(3)]
    for r, t in zip(refused, (0.004, 0.010, 0.030), strict=True):
        r.e2e = t
    s = stats.summarize([_rec(9, 2.0, 0.01), *refused], {"ttft": 1.0}, rate=1.0)
    assert s["refusal_s"]["count"] == 3 and s["refusal_s"]["max"] == 0.030
    assert s["refusal_s"]["p50"] == 0.010
    assert stats.summarize([_rec(0, 0.1, 0.01)], {}, rate=1.0)["refusal_s"]["max"] is None


def test_quantile_matches_numpy_linear_and_histogram_agrees_within_bucket():
    xs = [0.3, 0.1, 0.2, 0.4, 0.5]
    assert M.quantile(xs, 0.5) == 0.3 and abs(M.quantile(xs, 0.95) - 0.48) < 1e-12
    h = M.Histogram(((0.1, 1.0), (0.25, 2.0), (0.5, 5.0), (float("inf"), 5.0)), 5.0, 1.5)
    lo, hi = h.bucket_of(M.quantile(xs, 0.95))
    assert lo <= h.quantile(0.95) <= hi


def test_capacity_search_brackets_the_true_capacity():
    s = CapacitySearch(start=1.0, max_rate=256.0, steps=4)
    true_capacity = 11.0
    while s.next_rate is not None:
        r = s.next_rate
        s.update(r, r <= true_capacity, "")
    assert 8.0 <= s.capacity <= true_capacity
    assert [p["rate"] for p in s.probes][:5] == [1.0, 2.0, 4.0, 8.0, 16.0]
    low = CapacitySearch(start=1.0, max_rate=8.0, steps=2)
    while low.next_rate is not None:
        low.update(low.next_rate, False, "")
    assert low.capacity == 0.0 and min(p["rate"] for p in low.probes) >= 1.0 / 16


def test_bootstrap_verdicts_flag_a_slower_b_and_not_an_equal_one():
    rng = random.Random(3)
    a = [_rec(i, rng.uniform(0.05, 0.15), rng.uniform(0.01, 0.02)) for i in range(60)]
    same = [_rec(i, r.ttft, r.itl[0]) for i, r in enumerate(a)]
    slow = [_rec(i, r.ttft * 2, r.itl[0] * 3) for i, r in enumerate(a)]
    for r in a + same + slow:
        r.good = True
    by = {m.name: m for m in stats.COMPARED}
    for name in (M.TTFT_P95, M.ITL_P95, "tpot_mean_seconds"):
        point, lo, hi = stats.bootstrap(a, slow, by[name], 200, random.Random(0))
        v = stats.verdict(by[name], "B", 4.0, point, lo, hi, 0.05)
        assert v["verdict"] == "worse", v
        assert v["text"].startswith(f"B is {point * 100:.1f} % worse on {name} at rate 4")
        point, lo, hi = stats.bootstrap(a, same, by[name], 200, random.Random(0))
        assert stats.verdict(by[name], "B", 4.0, point, lo, hi, 0.05)["verdict"] == "no difference"


def test_config_errors_name_the_flag():
    for kw, msg in (
        ({"urls": ["127.0.0.1:8000"], "rates": [1]}, "http://"),
        ({"urls": ["http://x"]}, "--rates or --find-capacity"),
        ({"urls": ["http://x"], "rates": [1], "find_capacity": True}, "exclude"),
        ({"urls": ["http://x"], "rates": [1], "cancel_fraction": 2}, "--cancel-fraction"),
        ({"urls": ["http://x"], "rates": [1], "names": ["a", "b"]}, "--name"),
    ):
        with pytest.raises(ValueError, match=msg):
            BenchConfig(**kw).validate()


def test_offered_rate_is_sends_over_the_send_span_not_the_backlog():
    rs = [_rec(i, 0.1, 0.01) for i in range(5)]
    for i, r in enumerate(rs):
        r.sent_s, r.e2e = i * 0.5, 30.0  # a slow server: every answer 30 s later
    s = stats.summarize(rs, {"ttft": 1.0}, rate=2.0)
    assert s["offered_rps"] == 2.0 and s["window_s"] == 32.0
    assert stats.offered_rps(rs[:1], 3.0) == 3.0  # one send: the nominal rate
