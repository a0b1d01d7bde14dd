"""LoRA adapters in the engine: equality with transformers + peft, mixed-adapter batches in
one forward, residency, prefix-cache isolation, and refusal of what cannot be served right."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import torch

from modeldeploy.digest import DigestMismatch, dir_digest
from modeldeploy.kernels import reference
from modeldeploy.runtime import LLM, EngineConfig, SamplingParams
from modeldeploy.runtime.engine.core.kv_budget import auto_blocks
from modeldeploy.runtime.engine.llm_engine import LLMEngine
from modeldeploy_dev.lora_fixtures import hf_greedy, make_adapters

MAX_NEW = 12
G = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], list(range(20, 61)), [300, 4, 77]]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def setup(request, tiny_model, tmp_path_factory):
    """(model dir, {adapter name: dir}, pins with digests) per architecture."""
    base = tiny_model(request.param)
    adapters = make_adapters(base, tmp_path_factory.mktemp(f"lora-{request.param}"))
    pins = [
        {"name": n, "path": str(p), "digest": dir_digest(p), "revision": "r1"} for n, p in adapters.items()
    ]
    return base, adapters, pins


def _llm(setup, **kw) -> LLM:
    base, _, pins = setup
    kw.setdefault("max_loras", 2)
    return LLM(base, dtype="float32", device="cpu", adapters=pins, **kw)


def test_greedy_matches_transformers_peft_for_base_and_each_adapter(setup):
    base, adapters, _ = setup
    llm = _llm(setup)
    got = {}
    for name in (None, *adapters):
        outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_NEW), adapter=name)
        got[name] = [o.token_ids for o in outs]
        want = hf_greedy(base, adapters[name] if name else None, PROMPTS, MAX_NEW)
        assert got[name] == want, name
    # The adapters really change the answer (otherwise equality would prove little).
    assert (
        got["tenant-a"] != got[None] and got["tenant-b"] != got[None] and got["tenant-a"] != got["tenant-b"]
    )


def _record_steps(engine: LLMEngine) -> tuple[list[list[tuple[int, int, bool]]], list[int]]:
    """Wrap the runner: per step, (adapter id, tokens, is_decode) per row; count model forwards."""
    steps: list[list[tuple[int, int, bool]]] = []
    forwards = [0]
    run, fwd = engine.runner.run, engine.runner.model.forward

    def recording_run(batch):
        steps.append(
            [
                (s.adapter_id, n, n == 1 and s.num_uncomputed_tokens == 1)
                for s, n in zip(batch.seqs, batch.num_tokens, strict=True)
            ]
        )
        return run(batch)

    def counting_forward(*a, **k):
        forwards[0] += 1
        return fwd(*a, **k)

    engine.runner.run = recording_run
    engine.runner.model.forward = counting_forward
    return steps, forwards


def test_one_step_mixes_base_a_and_b_rows_prefill_and_decode(setup):
    llm = _llm(setup)
    names = [None, "tenant-a", "tenant-b"]
    alone = [llm.generate(p, G, adapter=n)[0].token_ids for p, n in zip(PROMPTS, names, strict=True)]

    engine = llm.engine
    steps, forwards = _record_steps(engine)
    steps_before = engine.steps_total
    engine.add_request("base", PROMPTS[0], G)
    engine.add_request("a", PROMPTS[1], G, adapter="tenant-a")
    outs = {o.request_id: o for o in engine.step()}  # step 1: base and A prefill together
    engine.add_request("b", PROMPTS[2], G, adapter="tenant-b")
    while engine.has_work():  # step 2: base and A decode while B prefills, then all decode
        for o in engine.step():
            outs[o.request_id] = o
    # B joined one step late and every sequence emits one token per step: all batched.
    assert engine.steps_total - steps_before == MAX_NEW + 1
    assert forwards[0] == MAX_NEW + 1  # one forward per step, never one per adapter
    assert sorted((a, d) for a, _, d in steps[0]) == [(-1, False), (0, False)]
    assert sorted((a, d) for a, _, d in steps[1]) == [(-1, True), (0, True), (1, False)]
    assert all(sorted(a for a, _, _ in s) == [-1, 0, 1] for s in steps[1:MAX_NEW])
    assert [outs["base"].token_ids, outs["a"].token_ids, outs["b"].token_ids] == alone


def test_prefix_cache_isolated_across_adapters_and_shared_within_one(setup):
    llm = _llm(setup, block_size=8)
    bm = llm.engine.block_manager
    prompt = list(range(30, 70))  # 40 tokens: 4 full blocks can be reused (never the last token)

    def run(adapter):
        before = bm.hits
        out = llm.generate(prompt, G, adapter=adapter)[0].token_ids
        return bm.hits - before, out

    hit_base, out_base = run(None)
    hit_a, out_a = run("tenant-a")
    hit_b, out_b = run("tenant-b")
    assert (hit_base, hit_a, hit_b) == (0, 0, 0)  # same prompt, three different caches
    again = {name: run(name) for name in (None, "tenant-a", "tenant-b")}
    for name, first in ((None, out_base), ("tenant-a", out_a), ("tenant-b", out_b)):
        hits, out = again[name]
        assert hits >= 32, name  # the first 4 blocks of this adapter's own earlier run
        assert out == first, name
    assert len({tuple(out_base), tuple(out_a), tuple(out_b)}) == 3


def test_prefix_blocks_never_shared_between_adapters_in_one_batch(setup):
    """Concurrently: sequences of different adapters hold disjoint blocks; same adapter shares."""
    llm = _llm(setup, block_size=8)
    engine, bm = llm.engine, llm.engine.block_manager
    prompt = list(range(100, 140))
    llm.generate(prompt, G, adapter="tenant-a")  # A's prefix now cached
    engine.add_request("a2", prompt, G, adapter="tenant-a")
    engine.add_request("b", prompt, G, adapter="tenant-b")
    engine.add_request("base", prompt, G)
    engine.step()
    tables = {s.request_id: set(s.block_table) for s in engine.scheduler.running}
    assert (
        not tables["b"] & tables["base"]
        and not tables["b"] & tables["a2"]
        and not tables["a2"] & tables["base"]
    )
    assert bm.hits >= 32  # a2 reused A's cached blocks
    while engine.has_work():
        engine.step()


def test_more_adapters_than_slots_rotate_through_one_slot(setup):
    llm = _llm(setup, max_loras=1)
    names = [None, "tenant-a", "tenant-b", "tenant-a"]
    prompts = PROMPTS + [PROMPTS[0]]
    alone = [_llm(setup).generate(p, G, adapter=n)[0].token_ids for p, n in zip(prompts, names, strict=True)]
    steps, _ = _record_steps(llm.engine)
    outs = llm.generate(prompts, G, adapter=names)
    assert [o.token_ids for o in outs] == alone
    assert all(len({a for a, _, _ in s if a >= 0}) <= 1 for s in steps)  # never two adapters at once
    stats = llm.engine.stats()
    assert stats.lora_loads_total >= 2 and len(stats.lora_resident) == 1
    info = llm.engine.info()["lora"]
    assert info["max_loras"] == 1 and info["device_bytes"] == info["slot_bytes"]


def test_info_reports_pins_residency_and_memory(setup):
    llm = _llm(setup)
    info = llm.engine.info()
    assert [a["name"] for a in info["adapters"]] == ["tenant-a", "tenant-b"]
    a, b = info["adapters"]
    assert (a["rank"], a["scaling"], a["targets"]) == (4, 4.0, ["q", "v", "down"])
    assert (b["rank"], b["rslora"], b["scaling"]) == (8, True, pytest.approx(8 / 8**0.5))
    assert a["digest"].startswith("sha256:") and a["revision"] == "r1"
    assert info["lora"]["resident"] == [] and not a["resident"]
    llm.generate(PROMPTS[0], G, adapter="tenant-b")
    assert llm.engine.info()["lora"]["resident"] == ["tenant-b"]
    assert llm.engine.stats().lora_resident == ("tenant-b",)
    assert info["lora"]["device_bytes"] == 2 * info["lora"]["slot_bytes"] > 0


def test_unknown_adapter_is_refused_naming_the_adapters(setup):
    llm = _llm(setup)
    with pytest.raises(ValueError, match="unknown adapter 'tenant-c'; adapters: tenant-a, tenant-b"):
        llm.engine.add_request("x", PROMPTS[0], G, adapter="tenant-c")
    assert not llm.engine.has_work()


def test_wrong_adapter_digest_refuses_to_start(setup):
    base, adapters, pins = setup
    bad = [dict(pins[0]), dict(pins[1], digest="sha256:" + "0" * 64)]
    with pytest.raises(DigestMismatch, match=f"digest mismatch for {adapters['tenant-b']}"):
        LLM(base, dtype="float32", device="cpu", adapters=bad)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"use_dora": True}, "use_dora=True is not supported"),
        ({"bias": "lora_only"}, "bias='lora_only' is not supported"),
        ({"rank_pattern": {"q_proj": 2}}, "rank_pattern"),
        ({"peft_type": "IA3"}, "peft_type 'IA3' is not supported"),
        ({"r": 3}, r"lora_A \(4, \d+\) / lora_B \(\d+, 4\), expected \(3,"),
    ],
)
def test_unservable_adapter_is_refused_by_name(setup, tmp_path, change, message):
    base, adapters, _ = setup
    bad = tmp_path / "bad"
    shutil.copytree(adapters["tenant-a"], bad)
    cfg = json.loads((bad / "adapter_config.json").read_text())
    (bad / "adapter_config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(ValueError, match=message):
        LLM(base, dtype="float32", device="cpu", adapters=[{"name": "bad", "path": str(bad)}])


@pytest.mark.parametrize(
    "adapters, max_loras, message",
    [
        ([{"name": "Bad_Name", "path": "/x"}], 2, r"adapters\[0\].name: 'Bad_Name' is not a DNS label"),
        (
            [{"name": "a", "path": "/x"}, {"name": "a", "path": "/y"}],
            2,
            r"adapters\[1\].name: 'a' is given twice",
        ),
        ([{"name": "a", "path": "/x", "digest": "md5:1"}], 2, r"adapters\[0\].digest"),
        ([{"name": "a", "path": ""}], 2, r"adapters\[0\].path"),
        ([{"name": "a", "path": "/x", "rank": "8"}], 2, r"adapters\[0\]: unknown field\(s\) rank"),
        ([], 0, "max_loras: must be an integer >= 1"),
    ],
)
def test_adapter_config_errors_name_the_field(adapters, max_loras, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(model="/m", adapters=adapters, max_loras=max_loras).validate()


def test_adapter_memory_is_taken_before_kv_blocks_are_sized(monkeypatch, setup):
    """On a GPU the KV cache gets (free - activations - adapter slots) * fraction."""
    from modeldeploy.runtime.models.llama import ModelArgs

    base, _, _ = setup
    from transformers import AutoConfig

    args = ModelArgs.from_hf(AutoConfig.from_pretrained(base))
    loaded = SimpleNamespace(
        args=args, rank_args=args, dtype=torch.float16, device=torch.device("cuda"), max_model_len=64
    )
    cfg = EngineConfig(model=str(base), kv_cache_fraction=1.0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2 << 30, 4 << 30))
    without = auto_blocks(cfg, loaded, 0)
    reserved = 256 << 20
    with_lora = auto_blocks(cfg, loaded, reserved)
    per_block = 2 * args.num_layers * cfg.block_size * args.num_kv_heads * args.head_dim * 2
    assert without - with_lora == pytest.approx(reserved / per_block, abs=1)


def test_reference_twin_equals_per_token_lora():
    g = torch.Generator().manual_seed(0)
    T, K, N, R, L = 11, 24, 18, 6, 3
    out = torch.randn(T, N, generator=g)
    x = torch.randn(T, K, generator=g)
    a, b = torch.randn(L, R, K, generator=g), torch.randn(L, R, N, generator=g)
    scales = torch.tensor([0.5, 2.0, 1.5])
    slots = torch.tensor([2, -1, 0, 0, 1, -1, 2, 2, 1, 0, -1], dtype=torch.int32)
    want = out.clone()
    for t in range(T):
        s = int(slots[t])
        if s >= 0:
            want[t] += (b[s].T @ (a[s] @ x[t])) * scales[s]
    reference.lora_apply(out, x, a, b, scales, slots)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
