"""`modeldeploy bench` goodput that counts quality: a workload item's output check (exact, contains,
regex, JSON schema) must pass, beside the latency SLO, for the request to be good; the pass rate is
reported beside goodput. Pure accounting plus the client's streamed text on a mock transport."""

from __future__ import annotations

import json

import httpx
import pytest

from modeldeploy.conformance.bench import stats
from modeldeploy.conformance.bench import workload as W
from modeldeploy.conformance.bench.checks import parse_check, run_check
from modeldeploy.conformance.bench.client import Record, Settings, body, send

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 5}},
    "required": ["city"],
}


@pytest.mark.parametrize(
    ("check", "text", "ok"),
    [
        ({"exact": "Paris"}, "  Paris\n", True),
        ({"exact": "Paris"}, "Paris.", False),
        ({"contains": "paris"}, "The capital is PARIS.", True),
        ({"contains": "paris"}, "Lyon", False),
        ({"regex": r"\b4\b"}, "2 + 2 = 4", True),
        ({"regex": r"\b4\b"}, "2 + 2 = 42", False),
        ({"json_schema": SCHEMA}, '{"city": "Paris"}', True),
        ({"json_schema": SCHEMA}, 'Sure: {"city": "Paris"} done', True),  # first JSON span
        ({"json_schema": SCHEMA}, '{"city": "Parisian"}', False),  # maxLength
        ({"json_schema": SCHEMA}, '{"city": "Par', False),  # truncated
        ({"json_schema": SCHEMA}, "no json here", False),
    ],
)
def test_each_check_kind(check, text, ok):
    passed, why = run_check(parse_check(check, "w"), text)
    assert passed is ok and (why is None) is ok


@pytest.mark.parametrize(
    ("check", "message"),
    [
        ({"exact": "a", "regex": "b"}, "exactly one of exact, contains, regex, json_schema"),
        ({"similar": "a"}, "exactly one of"),
        ({"regex": "("}, "check.regex does not compile"),
        ({"contains": 3}, "check.contains must be a string"),
        ({"json_schema": {"type": "nonsense"}}, "check.json_schema is not a valid schema"),
    ],
)
def test_bad_checks_are_refused_naming_the_entry(check, message):
    with pytest.raises(ValueError, match="entry 3") as e:
        parse_check(check, "--dataset: d.jsonl entry 3")
    assert message in str(e.value)


def _rec(i: int, ttft: float, check_passed: bool | None, outcome: str = "completed") -> Record:
    r = Record(i, "s", 0.0, status=200, outcome=outcome)
    if outcome == "completed":
        r.ttft, r.itl, r.e2e, r.output_tokens, r.tpot = ttft, [0.01] * 9, ttft + 0.09, 10, 0.01
    r.check_passed = check_passed
    return r


def test_goodput_needs_the_slo_and_the_check():
    rs = [
        _rec(0, 0.1, True),  # fast, right: good
        _rec(1, 0.1, False),  # fast, wrong: not good
        _rec(2, 5.0, True),  # right, too slow: not good
        _rec(3, 5.0, False),
        _rec(4, 0.1, None, outcome="error"),
    ]
    rs[1].check_error = "does not contain 'paris'"
    s = stats.summarize(rs, {"ttft": 1.0, "tpot": 0.1}, rate=1.0)
    assert [r.good for r in rs] == [True, False, False, False, False]
    assert s["good_share"] == pytest.approx(1 / 5)
    assert s["checked"] == 4 and s["check_pass_rate"] == pytest.approx(2 / 4)
    assert s["goodput_tok_s"] == pytest.approx(10 / s["window_s"])
    assert s["check_failures"] == {"does not contain 'paris'": 1}


def test_without_checks_goodput_is_latency_only():
    rs = [_rec(0, 0.1, None), _rec(1, 5.0, None)]
    s = stats.summarize(rs, {"ttft": 1.0}, rate=1.0)
    assert [r.good for r in rs] == [True, False]
    assert s["check_pass_rate"] is None and s["checked"] == 0


def test_dataset_rows_carry_checks_and_response_format(tmp_path):
    rf = {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}}
    d = tmp_path / "d.jsonl"
    d.write_text(
        "\n".join(
            json.dumps(r)
            for r in (
                {"prompt": "Capital of France?", "check": {"contains": "Paris"}},
                {"messages": [{"role": "user", "content": "a city"}], "check": {"json_schema": SCHEMA}}
                | {"response_format": rf},
                {"prompt": "free"},
            )
        )
    )
    items = W.load_dataset(str(d), W.TokenCounter())
    assert [i.check for i in items] == [{"contains": "Paris"}, {"json_schema": SCHEMA}, None]
    assert (
        items[1].response_format == rf and "check" in items[0].to_dict() and "check" not in items[2].to_dict()
    )
    assert body(items[1], Settings("m", endpoint="chat"))["response_format"] == rf
    d.write_text(json.dumps({"prompt": "x", "check": {"regex": "("}}))
    with pytest.raises(ValueError, match=r"entry 1: check.regex does not compile"):
        W.load_dataset(str(d), W.TokenCounter())


async def test_the_client_checks_the_streamed_text():
    """The check runs on the whole streamed output (every chunk's text), only when completed."""

    def handler(request: httpx.Request) -> httpx.Response:
        pieces = ["The capital", " of France is", " Paris."]
        lines = [
            "data: " + json.dumps({"choices": [{"index": 0, "text": p, "finish_reason": None}]})
            for p in pieces
        ]
        lines.append("data: " + json.dumps({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}))
        lines.append("data: [DONE]")
        return httpx.Response(
            200, text="\n\n".join(lines) + "\n\n", headers={"content-type": "text/event-stream"}
        )

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://x") as client:
        s = Settings("m")
        right = W.Item("dataset", "q", 3, 8, check={"regex": r"is Paris\.$"})
        wrong = W.Item("dataset", "q", 3, 8, check={"exact": "Lyon"})
        r1 = await send(client, right, s, 0, 0.0, 0.0, cancel=False)
        r2 = await send(client, wrong, s, 1, 0.0, 0.0, cancel=False)
        r3 = await send(client, wrong, s, 2, 0.0, 0.0, cancel=True)
    assert r1.outcome == "completed" and r1.check_passed is True and r1.chunks == 3
    assert r2.check_passed is False and r2.check_error == "not exactly 'Lyon'"
    assert r3.outcome == "cancelled" and r3.check_passed is None  # a cancelled stream is not judged
