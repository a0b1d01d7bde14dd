"""The quality gate: checks, figures and verdict (tables), eval-set pinning, API refusals, the rollout
machine's Verifying stages, the status/CLI view, and the HTTP client against real HTTP servers."""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from pydantic import ValidationError
from support.operator_fixtures import md

from modeldeploy.operator.analysis.divergence import TokenScore, coarse_kl, item_divergence, parse_entry
from modeldeploy.operator.analysis.quality import (
    FAILED,
    INVALID,
    MISMATCH,
    Cohort,
    EvalSetError,
    QualityRunner,
    resolve,
    run_quality,
    serving_share,
)
from modeldeploy.operator.analysis.quality_checks import check, schema_violations
from modeldeploy.operator.analysis.quality_set import DEFAULT_ITEMS
from modeldeploy.operator.analysis.quality_verdict import (
    Answer,
    Thresholds,
    divergent,
    evidence,
    figures,
    logprob_threshold,
    verdict,
)
from modeldeploy.operator.api.v1alpha1.modeldeployment import ModelDeploymentSpec
from modeldeploy.operator.api.v1alpha1.quality import EvalItem, Quality, canonical, eval_set_digest
from modeldeploy.operator.api.v1alpha1.status import DivergentItem, MetricVerdict, QualityResult
from modeldeploy.operator.rollout import progression
from modeldeploy.operator.rollout.machine import Policy, RolloutState, Signals, Step, advance
from modeldeploy.operator.rollout.sizing import canary_weight
from modeldeploy.operator.rollout_cli import render_text

# ---- one answer's check ----


def item(**kw: Any) -> EvalItem:
    return EvalItem.model_validate({"prompt": "q", **kw})


@pytest.mark.parametrize(
    ("check_kw", "answer", "ok"),
    [
        ({"contains": "Paris"}, "The capital of France is Paris.", True),
        ({"contains": "paris"}, "PARIS", True),  # case-insensitive
        ({"contains": "Paris"}, "The capital of France is Lyon.", False),
        ({"exact": "4"}, "  4\n", True),
        ({"exact": "4"}, "4.", False),
        ({"regex": r"\b15\b"}, "10 + 5 = 15", True),
        ({"regex": r"\b15\b"}, "10 + 5 = 150", False),
        ({"jsonSchema": {"type": "object", "required": ["a"]}}, '{"a": 1}', True),
        ({"jsonSchema": {"type": "object", "required": ["a"]}}, 'Sure:\n```json\n{"a": 1}\n```', True),
        ({"jsonSchema": {"type": "object", "required": ["a"]}}, '{"b": 1}', False),
        ({"jsonSchema": {"type": "object"}}, "no json here", False),
        ({"jsonSchema": {"type": "array", "minItems": 3}}, "[1, 2,", False),  # truncated
    ],
)
def test_check(check_kw: dict[str, Any], answer: str, ok: bool) -> None:
    assert check(item(**check_kw), answer)[0] is ok


@pytest.mark.parametrize(
    ("doc", "schema", "bad"),
    [
        ({"n": 5}, {"properties": {"n": {"type": "integer", "minimum": 5, "maximum": 5}}}, False),
        ({"n": 6}, {"properties": {"n": {"type": "integer", "minimum": 5, "maximum": 5}}}, True),
        ({"n": True}, {"properties": {"n": {"type": "integer"}}}, True),  # a bool is no integer
        ({"s": "abc"}, {"properties": {"s": {"type": "string", "maxLength": 2}}}, True),
        ({"s": "Paris"}, {"properties": {"s": {"pattern": "^P"}}}, False),
        ({"x": 1}, {"properties": {}, "additionalProperties": False}, True),
        ([1, "a"], {"type": "array", "items": {"type": "integer"}}, True),
        ("ok", {"const": "ok"}, False),
        ("no", {"enum": ["yes"]}, True),
        (None, {"type": ["null", "string"]}, False),
    ],
)
def test_schema_violations(doc: Any, schema: dict[str, Any], bad: bool) -> None:
    assert bool(schema_violations(doc, schema)) is bad


# ---- figures and verdict ----


def scores(lp: float, ids: tuple[int, ...] = (1, 2)) -> tuple[TokenScore, ...]:
    return tuple(TokenScore(i, lp, {i: lp}) for i in ids)


def pairs(
    n: int, s_pass: int, c_pass: int, agree: int, s_lp: float, c_lp: float, same_answers: int | None = None
) -> list[tuple[Answer, Answer]]:
    """n items; the first `agree` share their first two tokens, of those the first `same_answers`
    (default: all of them) their whole answers; stable's answer scored s_lp per token by stable and
    c_lp by the canary."""
    same = agree if same_answers is None else same_answers
    out = []
    for i in range(n):
        s = Answer("a", ("t1", "t2"), i < s_pass, scores(s_lp))
        tokens = ("t1", "t2") if i < same else ("t1", "t2", "t3") if i < agree else ("t1", "X")
        out.append((s, Answer("a", tokens, i < c_pass, scores(c_lp))))
    return out


def test_figures() -> None:
    f = figures(pairs(10, 9, 7, 6, -0.5, -0.8, same_answers=5), agreement_tokens=2)
    assert (f.items, f.stable_passed, f.canary_passed, f.scored, f.aligned) == (10, 9, 7, 10, 10)
    assert f.agreement == pytest.approx(0.6) and f.answer_agreement == pytest.approx(0.5)
    assert f.divergence == pytest.approx(0.3) and f.logprob_delta == pytest.approx(0.3)
    assert f.kl is not None and f.kl > 0 and f.tokenization == 1.0
    assert figures(pairs(10, 9, 7, 6, -0.5, -0.8), agreement_tokens=1).agreement == 1.0  # only t1 compared
    none = figures([(Answer("", (), False, None), Answer("", (), False, None))], 8)
    assert none.divergence is None and none.logprob_delta is None and none.scored == 0


def test_the_delta_is_two_sided_and_the_kl_sees_the_distribution() -> None:
    """A canary more confident in stable's answers (the config-only positional change of the issue
    moved the log-prob up) passes the one-way drop and fails the two-sided figures."""
    up = figures(pairs(10, 10, 10, 10, -0.6, -0.3), 8)
    assert up.divergence == pytest.approx(-0.3) and up.logprob_delta == pytest.approx(0.3)
    # the actual token's log-probability unchanged, the rest of the mass moved between other tokens
    s = Answer("a", ("t",), True, (TokenScore(1, -0.1, {1: -0.1, 2: -2.5, 3: -4.0}),))
    c = Answer("a", ("t",), True, (TokenScore(1, -0.1, {1: -0.1, 3: -2.5, 2: -4.0}),))
    moved = figures([(s, c)], 8)
    assert moved.logprob_delta == 0.0 and moved.kl is not None and moved.kl > 0.05
    assert coarse_kl({1: -0.1, 2: -2.5}, {1: -0.1, 2: -2.5}) == pytest.approx(0.0, abs=1e-12)


def test_a_canary_whose_scored_region_starts_early_is_aligned_on_the_answer() -> None:
    """A template without a generation prompt: the canary's prompt ends before the assistant header,
    so its scored region holds the header's tokens, then stable's answer."""
    d = item_divergence(list(scores(-0.5, (1, 2))), list(scores(-0.5, (90, 91, 1, 2))))
    assert d.aligned and d.tokens == 2 and d.logprob_delta == 0.0
    assert not item_divergence(list(scores(-0.5, (1, 2))), list(scores(-0.5, (2,)))).aligned  # starts late


Q = (
    Quality()
)  # cohorts not both float32: the wider tolerances (accuracy 10 % of items, agreement 0.5, 0.1 nats)
M = [
    "accuracy",
    "greedy_agreement",
    "answer_agreement",
    "tokenization",
    "mean_logprob",
    "logprob_delta",
    "kl",
]


@pytest.mark.parametrize(
    ("case", "s_pass", "c_pass", "agree", "c_lp", "ok", "failing"),
    [
        ("identical", 30, 30, 34, -0.600, True, []),
        ("harmless drift: agreement lower, accuracy noisy", 30, 28, 24, -0.605, True, []),
        ("canary scores a little higher", 30, 31, 34, -0.55, True, []),
        ("canary far more confident: two-sided figures", 30, 30, 34, -0.3, False, ["logprob_delta", "kl"]),
        ("log-prob drop past the threshold", 30, 30, 34, -0.75, False, ["mean_logprob", "logprob_delta"]),
        ("accuracy drop of 4 items", 30, 26, 34, -0.6, False, ["accuracy"]),
        ("accuracy drop of exactly 3 items (10 % of 34)", 30, 27, 34, -0.6, True, []),
        ("agreement very low", 30, 30, 10, -0.6, False, ["greedy_agreement"]),
        ("everything worse", 30, 10, 3, -2.0, False,
         ["accuracy", "greedy_agreement", "mean_logprob", "logprob_delta", "kl"]),
    ],
)  # fmt: skip
def test_verdict_table(
    case: str, s_pass: int, c_pass: int, agree: int, c_lp: float, ok: bool, failing: list[str]
) -> None:
    f = figures(pairs(34, s_pass, c_pass, agree, -0.6, c_lp), Q.agreement_tokens)
    passed, metrics, summary = verdict(f, Q)
    assert passed is ok, case
    assert [m.metric for m in metrics] == M
    assert [m.metric for m in metrics if m.verdict == "Fail"] == failing, case
    assert summary.startswith("quality passed" if ok else "quality failed")
    lp = next(m for m in metrics if m.metric == "mean_logprob")
    assert lp.threshold == pytest.approx(-0.7)  # stable's figure minus maxLogprobDrop


@pytest.mark.parametrize(
    ("case", "agree", "same", "c_pass", "c_lp", "failing"),
    [
        ("harmless float32 change: identical answers, 4e-5 apart", 34, 34, 30, -0.60004, []),
        ("one near-tie flipped", 33, 33, 30, -0.6, []),
        ("config-only positional change: agreement 0.76, log-prob up", 26, 26, 29, -0.59,
         ["greedy_agreement", "answer_agreement", "logprob_delta"]),
        ("end-of-turn id changed: first tokens agree, answers run on", 34, 10, 30, -0.6,
         ["answer_agreement"]),
        ("normalization change: answers identical, scores 0.0064 lower", 34, 34, 30, -0.6064,
         ["mean_logprob", "logprob_delta"]),
        ("two items fewer right", 34, 34, 28, -0.6, ["accuracy"]),
        ("rms_norm_eps 10x in config.json: one answer moved, scores 0.0019 apart", 33, 33, 30, -0.6019,
         ["logprob_delta"]),
    ],
)  # fmt: skip
def test_float32_tolerances_come_from_the_harmless_spread(
    case: str, agree: int, same: int, c_pass: int, c_lp: float, failing: list[str]
) -> None:
    f = figures(pairs(34, 30, c_pass, agree, -0.6, c_lp, same_answers=same), agreement_tokens=2)
    passed, metrics, _ = verdict(f, Q, float32=True)
    assert [m.metric for m in metrics if m.verdict == "Fail"] == failing, case
    assert passed is (not failing)
    t = Thresholds.of(Q, True, 34)
    assert (t.accuracy_drop, t.agreement, t.answer_agreement) == (1, 0.9, 0.85)


def test_a_canary_that_tokenizes_stable_answers_otherwise_fails_and_says_where() -> None:
    items = [EvalItem.model_validate({"prompt": f"q{i}", "contains": "a"}) for i in range(4)]
    ps = pairs(4, 4, 4, 4, -0.6, -0.6)
    s, c = ps[0]
    ps[0] = (s, Answer(c.text, c.tokens, c.passed, scores(-0.6, (1, 7))))  # the canary split it differently
    ps[1] = (ps[1][0], Answer("b", ("t1", "Y"), True, scores(-0.9)))
    f = figures(ps, 8)
    assert (f.scored, f.aligned, f.tokenization) == (4, 3, 0.75)
    passed, metrics, _ = verdict(f, Q, float32=True)
    assert not passed and "tokenization" in [m.metric for m in metrics if m.verdict == "Fail"]
    rows = divergent(items, ps, f, 0.005)
    assert [(r.index, r.aligned, r.at) for r in rows] == [(0, False, None), (1, True, 1)]
    assert (rows[1].stable, rows[1].canary, rows[1].prompt) == ("t2", "Y", "q1")
    text = evidence(rows)
    assert (
        "item 0 'q0': tokenized differently" in text
        and "answers part at token 1: stable 't2' canary 'Y'" in text
    )


def test_the_default_logprob_threshold_follows_the_cohorts_precision() -> None:
    assert logprob_threshold(Quality(), True) == 0.005 and logprob_threshold(Quality(), False) == 0.1
    assert logprob_threshold(Quality(max_logprob_drop=0.01), True) == 0.01  # the spec's own wins
    t = Thresholds.of(Quality(max_kl=0.5, min_agreement=0.2, max_accuracy_drop=7), True, 34)
    assert (t.kl, t.agreement, t.accuracy_drop, t.logprob_delta) == (0.5, 0.2, 7, 0.001)


def test_accuracy_floor_judges_an_intended_model_change_alone() -> None:
    q = Quality(accuracy_floor=0.8)
    f = figures(pairs(20, 15, 17, 2, -0.6, -3.0), q.agreement_tokens)  # another model: diverges widely
    passed, metrics, summary = verdict(f, q, "model digest sha256:aa -> sha256:bb", float32=True)
    assert passed and "accuracyFloor 0.8" in summary
    assert [m.verdict for m in metrics] == ["Pass"] * len(M)
    f = figures(pairs(20, 15, 15, 2, -0.6, -3.0), q.agreement_tokens)
    assert not verdict(f, q, "model digest sha256:aa -> sha256:bb")[0]  # 0.75 < floor
    # the same model (no change): the floor adds to the relative thresholds, it does not replace them
    assert not verdict(figures(pairs(20, 17, 17, 20, -0.6, -3.0), 8), q)[0]


# ---- the evaluation set: API refusals, digest pinning ----


def quality_spec(q: dict[str, Any]) -> dict[str, Any]:
    return md(rollout={"analysis": {"quality": q}})["spec"]


@pytest.mark.parametrize(
    ("q", "needle"),
    [
        ({"evalSet": {"inline": []}}, "at least 1 item"),
        ({"evalSet": {"inline": [{"prompt": "q", "contains": "a", "regex": "b"}]}}, "exactly one check"),
        ({"evalSet": {"inline": [{"prompt": "q"}]}}, "exactly one check"),
        ({"evalSet": {"inline": [{"contains": "a"}]}}, "exactly one of prompt or messages"),
        (
            {
                "evalSet": {
                    "inline": [{"prompt": "q", "messages": [{"role": "user", "content": "q"}], "exact": "a"}]
                }
            },
            "exactly one of prompt or messages",
        ),
        ({"evalSet": {"inline": [{"prompt": "q", "regex": "("}]}}, "regex: not a Python regular expression"),
        (
            {"evalSet": {"inline": [{"prompt": "q", "jsonSchema": {"type": "object", "uniqueItems": True}}]}},
            "unsupported JSON Schema keyword 'uniqueItems'",
        ),
        ({"evalSet": {"configMapRef": {"name": "evals"}}}, "needs evalSet.digest"),
        ({"evalSet": {}}, "exactly one of inline or configMapRef"),
        ({"evalSet": {"configMapRef": {"name": "e"}, "digest": "sha256:xyz"}}, "String should match pattern"),
        (
            {"evalSet": {"inline": [{"prompt": "q", "exact": "a"}], "digest": "sha256:" + "0" * 64}},
            "does not match",
        ),
        ({"maxLogprobDrop": -1}, "greater than or equal to 0"),
    ],
)
def test_bad_quality_specs_are_refused_naming_the_field(q: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError) as e:
        ModelDeploymentSpec.model_validate(quality_spec(q))
    assert needle in str(e.value)
    assert "quality" in str(e.value)


def test_cel_rules_say_what_pydantic_says() -> None:
    from modeldeploy.operator.api import crd

    text = crd.render()
    for needle in (
        "an evaluation item needs exactly one check",
        "an evaluation item needs exactly one of prompt or messages",
        "evalSet needs exactly one of inline or configMapRef",
        "evalSet.configMapRef needs evalSet.digest",
        "x-kubernetes-preserve-unknown-fields: true",
    ):
        assert needle in text


ITEMS = [
    {"prompt": "What is the capital of France?", "contains": "Paris"},
    {"messages": [{"role": "user", "content": "2+2?"}], "maxTokens": 8, "regex": r"\b4\b"},
]


def cm(items: list[dict[str, Any]], key: str = "items.json") -> dict[str, Any]:
    return {"data": {key: json.dumps(items)}}


def test_digest_is_canonical_and_pins_a_configmap() -> None:
    parsed = [EvalItem.model_validate(i) for i in ITEMS]
    digest = eval_set_digest(parsed)
    # the same items written differently (key order, explicit default) hash the same
    reordered = [{"contains": "Paris", "maxTokens": 32, "prompt": "What is the capital of France?"}, ITEMS[1]]
    assert eval_set_digest([EvalItem.model_validate(i) for i in reordered]) == digest
    assert b'"maxTokens":32' in canonical(parsed)
    q = Quality.model_validate({"evalSet": {"configMapRef": {"name": "evals"}, "digest": digest}})
    es = resolve(q, cm(ITEMS))
    assert (len(es.items), es.digest, es.name) == (2, digest, "configmap/evals:items.json")
    changed = [ITEMS[0], {**ITEMS[1], "regex": r"\b5\b"}]  # someone edited the ConfigMap
    with pytest.raises(EvalSetError) as e:
        resolve(q, cm(changed))
    assert e.value.reason == MISMATCH and digest in str(e.value) and "refused" in str(e.value)
    for bad, needle in (
        (None, "not found"),
        ({"data": {}}, "no key 'items.json'"),
        ({"data": {"items.json": "[{"}}, "not a JSON list"),
        (cm([{"prompt": "q"}]), "exactly one check"),
    ):
        with pytest.raises(EvalSetError) as e:
            resolve(q, bad)
        assert e.value.reason == INVALID and needle in str(e.value)


def test_inline_and_builtin_sets() -> None:
    q = Quality.model_validate({"evalSet": {"inline": ITEMS}})
    es = resolve(q, None)
    assert es.name == "inline" and es.digest == eval_set_digest(list(es.items))
    pinned = Quality.model_validate({"evalSet": {"inline": ITEMS, "digest": es.digest}})
    assert resolve(pinned).digest == es.digest
    builtin = resolve(Quality())
    assert builtin.name == "built-in" and builtin.digest.startswith("sha256:")
    assert len(builtin.items) == len(DEFAULT_ITEMS) >= 20
    checks = {
        k for i in DEFAULT_ITEMS for k in ("contains", "regex", "json_schema") if getattr(i, k) is not None
    }
    assert checks == {"contains", "regex", "json_schema"}
    longest = max(len(m["content"]) for i in DEFAULT_ITEMS for m in i.chat())
    assert longest > 6000  # a long-context retrieval item (~1.5k tokens)
    assert any(i.chat()[0]["role"] == "system" for i in DEFAULT_ITEMS)  # facts given in a system turn only


# ---- the rollout machine ----

P = Policy(
    replicas=2,
    steps=(Step(50, 60),),
    load_timeout_seconds=300,
    quality_gate=True,
    quality_timeout_seconds=120,
)
DEPLOYING = RolloutState(phase="Deploying", stable="old", canary="new", started_at=0.0, phase_since=0.0)


def qresult(ok: bool, reason: str = "") -> QualityResult:
    return QualityResult(
        verdict="Pass" if ok else "Fail",
        reason=reason or ("QualityPassed" if ok else FAILED),
        items=25,
        metrics=[
            MetricVerdict(metric="mean_logprob", stable=-0.6, canary=-0.9, threshold=-0.7, verdict="Fail")
        ],
        message="quality failed: log-prob drop 0.3000 nats/token" if not ok else "quality passed",
    )


def test_verifying_runs_conformance_then_quality_then_traffic() -> None:
    s = advance(DEPLOYING, P, Signals(desired="new", canary_ready=1), 10.0).state
    assert (s.phase, s.reason) == ("Verifying", "CanaryReady")
    t = advance(s, P, Signals(desired="new", canary_ready=1, conformance=(True, "conformance passed")), 20.0)
    assert (t.state.phase, t.state.reason, t.state.phase_since) == ("Verifying", "ConformancePassed", 20.0)
    assert "running the quality gate" in t.event[2] and canary_weight(t.state, P) == 0
    s = t.state
    # no quality verdict yet: wait (conformance's result no longer matters)
    assert advance(s, P, Signals(desired="new", canary_ready=1, conformance=(True, "")), 100.0).event is None
    t = advance(s, P, Signals(desired="new", canary_ready=1, quality=qresult(True)), 110.0)
    assert (t.state.phase, t.state.step, t.event[1]) == ("Canary", 0, "QualityPassed")
    assert canary_weight(t.state, P) == 50


def test_quality_failure_rolls_back_with_the_figures_and_holds_the_bundle() -> None:
    s = replace(DEPLOYING, phase="Verifying", reason="ConformancePassed", phase_since=20.0)
    t = advance(s, P, Signals(desired="new", canary_ready=1, quality=qresult(False)), 30.0)
    assert (t.state.phase, t.event[0], t.event[1]) == ("RollingBack", "Warning", "QualityFailed")
    assert "log-prob drop 0.3000" in t.event[2]
    t = advance(t.state, P, Signals(desired="new", stable_ready=2), 31.0)
    assert (t.state.phase, t.state.stable, t.state.failed) == ("Stable", "old", ("new",))
    assert "QualityFailed" in t.event[2]
    assert "QualityFailed" in progression.FAILURE_REASONS  # Degraded=True names it while spec asks for it
    t = advance(s, P, Signals(desired="new", canary_ready=1, quality=qresult(False, MISMATCH)), 30.0)
    assert t.event[1] == MISMATCH


def test_quality_timeout_counts_from_the_quality_stage() -> None:
    s = replace(DEPLOYING, phase="Verifying", reason="ConformancePassed", phase_since=200.0)
    assert advance(s, P, Signals(desired="new", canary_ready=1), 319.0).event is None
    t = advance(s, P, Signals(desired="new", canary_ready=1), 321.0)
    assert (t.state.phase, t.event[1]) == ("RollingBack", "QualityTimeout")
    assert "timeoutSeconds=120" in t.event[2]


def test_quality_gate_alone_and_off() -> None:
    alone = replace(P, conformance_gate=False)
    s = advance(DEPLOYING, alone, Signals(desired="new", canary_ready=1), 10.0).state
    assert (s.phase, s.reason) == ("Verifying", "CanaryReady")
    t = advance(s, alone, Signals(desired="new", canary_ready=1, quality=qresult(True)), 20.0)
    assert t.state.phase == "Canary"
    off = replace(P, quality_gate=False)
    s = advance(DEPLOYING, off, Signals(desired="new", canary_ready=1), 10.0).state
    t = advance(s, off, Signals(desired="new", canary_ready=1, conformance=(True, "ok")), 20.0)
    assert (t.state.phase, t.event[1]) == ("Canary", "ConformancePassed")


def test_policy_from_spec() -> None:
    spec = ModelDeploymentSpec.model_validate(quality_spec({"timeoutSeconds": 90}))
    p = progression.policy(spec)
    assert (p.quality_gate, p.quality_timeout_seconds) == (True, 90)
    assert not progression.policy(
        ModelDeploymentSpec.model_validate(quality_spec({"enabled": False}))
    ).quality_gate
    bare = ModelDeploymentSpec.model_validate(md()["spec"])
    assert not progression.policy(bare).quality_gate


# ---- status and `modeldeploy rollout status` ----


def test_rollout_status_shows_the_quality_verdict() -> None:
    q = qresult(False).model_copy(
        update={
            "canary": "new",
            "stable": "old",
            "evalSet": None,
            "digest": "sha256:" + "ab" * 32,
            "seconds": 41.5,
            "divergent": [DivergentItem(index=3, prompt="What is 2 + 2?", at=2, stable=" 4.", canary=" 5.")],
        }
    )
    status = {"phase": "Stable", "lastQuality": q.model_dump(mode="json", by_alias=True, exclude_none=True)}
    text = render_text({"metadata": {"name": "m", "namespace": "d"}, "status": status}, width=200)
    assert "quality gate (Verifying) new vs old" in text
    assert "Fail" in text and "mean_logprob" in text and "-0.7" in text
    assert "sha256:abab" in text and "41.5s" in text and "log-prob drop 0.3000" in text
    assert "item 3 'What is 2 + 2?': answers part at token 2: stable ' 4.' | canary ' 5.'" in text


# ---- the HTTP client against real HTTP servers speaking the runtime's contract ----


class FakeLM:
    """A deterministic 'model' behind a real HTTP server: each answer is fixed per prompt, and every
    answer token's log-probability is `lp` (a canary with drift scores lower)."""

    def __init__(
        self, answers: dict[str, str], lp: float, digest: str = "sha256:m1", slots: int | None = None
    ) -> None:
        self.answers, self.lp, self.digest = answers, lp, digest
        self.requests: list[dict[str, Any]] = []
        self.slots = slots  # /v1/bundle's server.max_num_seqs, when set
        self.refuse = 0  # answer this many POSTs 429 (Retry-After: 0) first: a busy pod's admission
        self.inflight = self.most_inflight = 0
        self.lock = threading.Lock()

    def tokens(self, messages: list[dict[str, str]], generation_prompt: bool) -> list[str]:
        out = []
        for m in messages:
            out += [f"<{m['role']}>", *m["content"].split()]
        return out + (["<assistant>"] if generation_prompt else [])

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(body)
        msgs = body["messages"]
        if body.get("prompt_logprobs") is not None:
            assert (
                body["continue_final_message"]
                and not body["add_generation_prompt"]
                and body["max_tokens"] == 1
            )
            toks = self.tokens(msgs, False)
            n_answer = len(msgs[-1]["content"].split())
            entries: list[Any] = [None]
            for i, _ in enumerate(toks[1:], start=1):
                lp = self.lp if i >= len(toks) - n_answer else -9.0
                entries.append({str(100 + i): {"logprob": lp, "rank": 1, "decoded_token": toks[i]}})
            return {"choices": [{"message": {"content": "x"}}], "prompt_logprobs": entries,
                    "usage": {"prompt_tokens": len(toks)}}  # fmt: skip
        prompt = self.tokens(msgs, True)
        answer = self.answers.get(msgs[-1]["content"], "I do not know")
        words = answer.split()[: body["max_tokens"]]
        return {
            "choices": [{"message": {"content": " ".join(words)},
                         "logprobs": {"content": [{"token": w, "logprob": self.lp} for w in words]}}],
            "usage": {"prompt_tokens": len(prompt)},  # the answer starts where the generation prompt ends
        }  # fmt: skip


def serve(lm: FakeLM) -> tuple[ThreadingHTTPServer, str]:
    class H(BaseHTTPRequestHandler):
        def _send(self, code: int, body: dict[str, Any]) -> None:
            raw = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/v1/bundle":
                server = {"max_num_seqs": lm.slots} if lm.slots else {}
                self._send(200, {"served_model_name": "m", "model": {"digest": lm.digest}, "server": server})
            else:
                self._send(404, {"error": {"message": "no"}})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            with lm.lock:
                busy, lm.refuse = lm.refuse > 0, max(lm.refuse - 1, 0)
                lm.inflight += 1
                lm.most_inflight = max(lm.most_inflight, lm.inflight)
            # The request stops counting before its answer is written: counted after, a client that
            # sends its next request as soon as it reads this answer could be seen twice at once
            # (a cold CI run on a loaded machine saw most_inflight 2 at one slot).
            try:
                if not busy:
                    time.sleep(0.01)  # long enough for concurrent requests to overlap
                    answer = lm.chat(body)
            finally:
                with lm.lock:
                    lm.inflight -= 1
            if busy:
                self.send_response(429)
                self.send_header("retry-after", "0")
                self.send_header("content-length", "0")
                self.end_headers()
                return
            self._send(200, answer)

        def log_message(self, *a: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


GOOD = {"What is the capital of France?": "The capital of France is Paris.", "2+2?": "2 + 2 = 4"}


@pytest.fixture
def cohorts():
    started: list[ThreadingHTTPServer] = []

    def make(stable: FakeLM, canary: FakeLM) -> tuple[Cohort, Cohort]:
        (s, su), (c, cu) = serve(stable), serve(canary)
        started.extend([s, c])
        return Cohort(su), Cohort(cu)

    yield make
    for s in started:
        s.shutdown()
        s.server_close()


def test_client_passes_a_same_model_canary(cohorts) -> None:
    stable, canary = FakeLM(GOOD, -0.5), FakeLM(GOOD, -0.52)
    es = resolve(Quality.model_validate({"evalSet": {"inline": ITEMS}}))
    r = run_quality(Quality(), es, *cohorts(stable, canary))
    assert (r.verdict, r.reason, r.items, r.digest) == ("Pass", "QualityPassed", 2, es.digest)
    by = {m.metric: m for m in r.metrics}
    assert by["accuracy"].canary == by["accuracy"].stable == 1.0
    assert by["greedy_agreement"].canary == 1.0
    # only the answer's tokens are averaged (the prompt's -9.0 entries are left out)
    assert by["mean_logprob"].stable == pytest.approx(-0.5) and by["mean_logprob"].canary == pytest.approx(
        -0.52
    )
    scoring = [b for b in canary.requests if b.get("prompt_logprobs") is not None]
    scored = sorted(b["messages"][-1]["content"] for b in scoring)  # the pool sends them in any order
    assert scored == sorted(GOOD.values()) and all(b["messages"][-1]["role"] == "assistant" for b in scoring)
    greedy = [b for b in canary.requests if b.get("prompt_logprobs") is None]
    assert all(b["temperature"] == 0 and b["logprobs"] is True and b["model"] == "m" for b in greedy)


def test_client_fails_a_drifted_canary_and_a_wrong_one(cohorts) -> None:
    es = resolve(Quality.model_validate({"evalSet": {"inline": ITEMS}}))
    r = run_quality(Quality(), es, *cohorts(FakeLM(GOOD, -0.5), FakeLM(GOOD, -0.8)))
    assert r.verdict == "Fail" and r.reason == FAILED
    assert "mean_logprob" in (r.message or "") and "log-prob drop 0.3000" in (r.message or "")
    wrong = {"What is the capital of France?": "Lyon", "2+2?": "five"}
    r = run_quality(Quality(max_accuracy_drop=1), es, *cohorts(FakeLM(GOOD, -0.5), FakeLM(wrong, -0.5)))
    by = {m.metric: m for m in r.metrics}
    assert r.verdict == "Fail" and by["accuracy"].canary == 0.0 and by["accuracy"].verdict == "Fail"
    # an intended model change judged by the floor: a new digest that answers right passes
    q = Quality(accuracy_floor=0.5)
    r = run_quality(q, es, *cohorts(FakeLM(GOOD, -0.5), FakeLM(GOOD, -3.0, digest="sha256:m2")))
    assert r.verdict == "Pass" and "intended model change" in (r.message or "")


def test_client_asks_a_pod_no_more_at_once_than_its_slots_and_waits_out_429s(cohorts) -> None:
    """A correct canary with one slot and a queue budget must not fail the gate because the gate
    flooded it (seen in the demo: 8 requests at a maxNumSeqs 1 pod, answered 429)."""
    stable, canary = FakeLM(GOOD, -0.5, slots=4), FakeLM(GOOD, -0.5, slots=1)
    canary.refuse = 3
    es = resolve(Quality.model_validate({"evalSet": {"inline": ITEMS}}))
    r = run_quality(Quality(), es, *cohorts(stable, canary), parallel=8)
    assert r.verdict == "Pass", r.message
    assert canary.most_inflight == 1 and canary.refuse == 0
    assert stable.most_inflight <= 2  # half the stable pod's slots: production traffic keeps the rest


def test_the_gate_leaves_a_serving_pod_half_its_slots_for_production_traffic(cohorts) -> None:
    """The demo's base cohort saw a 429 during a good bundle's gate: 8 gate requests plus 4 production
    ones at a maxNumSeqs 8 stable pod with a queue budget. In Verifying the canary takes no traffic
    and the gate may use all its slots; at a step (atEachStep) it serves too and gets the same half."""
    assert [serving_share(n) for n in (1, 2, 3, 8)] == [1, 1, 1, 4]
    es = resolve(Quality.model_validate({"evalSet": {"inline": ITEMS * 3}}))
    for canary_serving, canary_bound in ((False, 8), (True, 4)):  # Verifying, then a gate at a step
        stable, canary = FakeLM(GOOD, -0.5, slots=8), FakeLM(GOOD, -0.5, slots=8)
        r = run_quality(Quality(), es, *cohorts(stable, canary), parallel=8, canary_serving=canary_serving)
        assert r.verdict == "Pass", r.message
        assert 1 <= stable.most_inflight <= 4 and 1 <= canary.most_inflight <= canary_bound


def test_parse_entry() -> None:
    e = parse_entry(
        {"17": {"logprob": -1.5, "rank": 3, "decoded_token": "x"}, "4": {"logprob": -0.2, "rank": 1}}
    )
    assert (e.token_id, e.logprob, e.top) == (17, -1.5, {17: -1.5, 4: -0.2})  # the actual token first
    assert math.isclose(parse_entry({"17": -0.25}).logprob, -0.25)


def test_runner_reports_an_unreachable_pod_and_a_refused_set_as_failed() -> None:
    runner = QualityRunner()
    es = resolve(Quality.model_validate({"evalSet": {"inline": ITEMS}}))
    key = ("uid", "new", -1)
    job = lambda: run_quality(Quality(), es, Cohort("http://127.0.0.1:9"), Cohort("http://127.0.0.1:9"), 2.0)  # noqa: E731
    assert runner.ensure(key, job) is None or runner.has(key)
    r = runner.wait(key, 30)
    assert r is not None and r.verdict == "Fail" and "could not run" in (r.message or "")
    assert runner.ensure(key, job) is r  # one run per key
    runner.forget_md("uid")
    assert not runner.holds("uid")

    def refused_set() -> QualityResult:
        raise EvalSetError(MISMATCH, "evalSet configmap/e:items.json changed")

    runner.ensure(("uid", "b2", -1), refused_set)
    r = runner.wait(("uid", "b2", -1), 10)
    assert r is not None and (r.verdict, r.reason) == ("Fail", MISMATCH)


# ---- through plan(): status.lastQuality, Events, Degraded, the per-object metrics ----


def test_plan_records_the_quality_verdict_events_degraded_and_metrics() -> None:
    from support.plan_driver import advance_to, at, stable_then_change

    from modeldeploy.operator.controller.object_metrics import series
    from modeldeploy.operator.rollout.actions import Event

    obj, obs, old, _ = stable_then_change()
    obj["spec"]["rollout"]["analysis"] = {"quality": {"timeoutSeconds": 60}}
    obj, obs, _ = advance_to(obj, obs, at(0), ready={})
    new = obj["status"]["canary"]["bundle"]
    obj, obs, _ = advance_to(obj, obs, at(1))
    assert (obj["status"]["phase"], obj["status"]["rollout"]["reason"]) == ("Verifying", "CanaryReady")
    obj, obs, acts = advance_to(obj, obs, at(1, 10), conformance=(True, "conformance passed: 9 checks"))
    assert (obj["status"]["phase"], obj["status"]["rollout"]["reason"]) == ("Verifying", "ConformancePassed")
    assert obj["status"]["canaryWeight"] == 0
    bad = qresult(False).model_copy(update={"canary": new, "stable": old, "time": at(1, 40)})
    obj, obs, acts = advance_to(obj, obs, at(1, 40), quality=bad)
    st = obj["status"]
    assert st["phase"] == "RollingBack" and st["lastQuality"]["verdict"] == "Fail"
    assert st["lastQuality"]["canary"] == new and st["lastQuality"]["metrics"][0]["metric"] == "mean_logprob"
    warn = [a for a in acts if isinstance(a, Event) and a.reason == "QualityFailed"]
    assert warn and warn[0].type == "Warning" and "log-prob drop 0.3000" in warn[0].message
    obj, obs, acts = advance_to(obj, obs, at(1, 42))
    st = obj["status"]
    degraded = next(c for c in st["conditions"] if c["type"] == "Degraded")
    assert (st["phase"], degraded["status"], degraded["reason"]) == ("Stable", "True", "QualityFailed")
    assert st["lastQuality"]["verdict"] == "Fail"  # kept after the rollback, for `rollout status`
    got = {
        (g._name, labels[2:]): v
        for g, labels, v in series(obj, st)
        if g._name.startswith("modeldeploy_quality")
    }
    assert got[("modeldeploy_quality_verdict", (new, "QualityFailed"))] == 0.0
    assert got[("modeldeploy_quality_figure", ("mean_logprob", "canary"))] == -0.9
    assert got[("modeldeploy_quality_figure", ("mean_logprob", "threshold"))] == -0.7


def test_plan_quality_timeout() -> None:
    from support.plan_driver import advance_to, at, stable_then_change

    obj, obs, _, _ = stable_then_change()
    obj["spec"]["rollout"]["analysis"] = {"quality": {"timeoutSeconds": 60}}
    obj["spec"]["rollout"]["conformanceGate"] = False
    obj, obs, _ = advance_to(obj, obs, at(0), ready={})
    obj, obs, _ = advance_to(obj, obs, at(1))
    assert obj["status"]["phase"] == "Verifying"
    obj, obs, _ = advance_to(obj, obs, at(1, 59))
    assert obj["status"]["phase"] == "Verifying"
    obj, obs, _ = advance_to(obj, obs, at(2, 2))
    assert (obj["status"]["phase"], obj["status"]["rollout"]["reason"]) == ("RollingBack", "QualityTimeout")


def test_the_example_pins_its_configmap_items() -> None:
    from pathlib import Path

    import yaml

    docs = list(
        yaml.safe_load_all((Path(__file__).parents[3] / "examples/modeldeployment-quality.yaml").read_text())
    )
    configmap = next(d for d in docs if d["kind"] == "ConfigMap")
    spec = ModelDeploymentSpec.model_validate(next(d for d in docs if d["kind"] == "ModelDeployment")["spec"])
    q = spec.rollout.analysis.quality
    assert q is not None
    es = resolve(q, configmap)
    assert es.digest == q.eval_set.digest and len(es.items) == 3  # type: ignore[union-attr]


# ---- observe(): the Verifying phase starts the gate on one Ready pod of each cohort ----


def _observer_world(q: dict[str, Any], stable_url: str, canary_url: str, configmap: dict[str, Any] | None):
    from support.fake_kube import FakeKube

    from modeldeploy.operator.analysis.gate import ConformanceRunner
    from modeldeploy.operator.analysis.scrape import Baselines
    from modeldeploy.operator.controller.observe import LoadProbe, NodeCache, Observer
    from modeldeploy.operator.rollout.bundle import BUNDLE_LABEL, INSTANCE_LABEL, MANAGED_BY

    class Kube(FakeKube):
        def get_configmap(self, ns: str, name: str) -> dict[str, Any] | None:
            return configmap if name == "evals" else None

    kube = Kube()
    for name, bundle, url in (("chat-s-0", "old", stable_url), ("chat-c-0", "new", canary_url)):
        labels = {INSTANCE_LABEL: "chat", "app.kubernetes.io/managed-by": MANAGED_BY, BUNDLE_LABEL: bundle}
        kube.put({
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "labels": labels},
            "spec": {"nodeName": "n1"},
            "status": {"phase": "Running", "podIP": url.removeprefix("http://"),
                       "conditions": [{"type": "Ready", "status": "True"}]},
        })  # fmt: skip
    obj = md(rollout={"analysis": {"quality": q}})
    obj["status"] = {
        "phase": "Verifying",
        "stable": {"bundle": "old"},
        "canary": {"bundle": "new"},
        "rollout": {"reason": "ConformancePassed"},
    }
    runner = QualityRunner()
    observer = Observer(
        kube, NodeCache(kube), LoadProbe(8000), ConformanceRunner(), Baselines(), quality=runner
    )
    return observer, runner, obj


def test_observe_runs_the_gate_on_the_cohorts_pods(cohorts) -> None:
    stable_lm, canary_lm = FakeLM(GOOD, -0.5), FakeLM(GOOD, -0.9)
    s, c = cohorts(stable_lm, canary_lm)
    observer, runner, obj = _observer_world({"evalSet": {"inline": ITEMS}}, s.url, c.url, None)
    first = observer.observe(obj)
    assert first.quality is None and first.conformance is None  # started in the background
    runner.wait(("uid-1", "new", -1), 30)
    r = observer.observe(obj).quality
    assert r is not None and (r.verdict, r.reason, r.canary, r.stable) == ("Fail", FAILED, "new", "old")
    assert r.time and r.eval_set == "inline" and "mean_logprob" in (r.message or "")
    assert len(canary_lm.requests) == 4  # 2 greedy answers + 2 scorings: the run was not repeated
    obj["status"]["rollout"]["reason"] = "CanaryReady"  # conformance still running: no quality gate yet
    assert observer.observe(obj).quality is None


def test_observe_refuses_a_changed_configmap_without_asking_the_pods(cohorts) -> None:
    stable_lm, canary_lm = FakeLM(GOOD, -0.5), FakeLM(GOOD, -0.5)
    s, c = cohorts(stable_lm, canary_lm)
    pinned = eval_set_digest([EvalItem.model_validate(i) for i in ITEMS])
    edited = cm([ITEMS[0]])
    q = {"evalSet": {"configMapRef": {"name": "evals"}, "digest": pinned}}
    observer, runner, obj = _observer_world(q, s.url, c.url, edited)
    observer.observe(obj)
    runner.wait(("uid-1", "new", -1), 30)
    r = observer.observe(obj).quality
    assert r is not None and (r.verdict, r.reason) == ("Fail", MISMATCH) and pinned in (r.message or "")
    assert stable_lm.requests == canary_lm.requests == []


# ---- against the real runtime: `modeldeploy serve` processes of a tiny random model ----


@pytest.mark.slow
def test_gate_against_real_runtime_servers(tmp_path, tiny_model) -> None:
    """Two `modeldeploy serve` of the same weights with another maxNumSeqs (a harmless change) pass with a
    log-prob drop of ~0; a canary with other weights (seed 1) fails on its figures."""
    from support.canary_server import Serve

    base, other = tiny_model("llama"), tiny_model("llama", seed=1)
    stable = Serve(tmp_path, base, "--max-num-seqs", "4", bundle="bundle-q-stable")
    same = Serve(tmp_path, base, "--max-num-seqs", "2", bundle="bundle-q-same")
    moved = Serve(tmp_path, other, "--max-num-seqs", "4", bundle="bundle-q-other")
    try:
        for s in (stable, same, moved):
            s.wait_ready()
        items = [
            {"prompt": p, "maxTokens": 12, "contains": "zzz"} for p in ("hello there", "the cat", "one two")
        ]
        es = resolve(Quality.model_validate({"evalSet": {"inline": items}}))
        ok = run_quality(Quality(), es, Cohort(stable.url), Cohort(same.url))
        by = {m.metric: m for m in ok.metrics}
        assert ok.verdict == "Pass", ok.message
        assert by["greedy_agreement"].canary == 1.0 and by["mean_logprob"].samples == 3
        assert by["mean_logprob"].stable is not None and by["mean_logprob"].stable < 0
        assert abs(by["mean_logprob"].stable - (by["mean_logprob"].canary or 0)) < 1e-3
        bad = run_quality(Quality(), es, Cohort(stable.url), Cohort(moved.url))
        assert bad.verdict == "Fail" and "mean_logprob" in (bad.message or ""), bad.message
    finally:
        for s in (stable, same, moved):
            s.stop()


def test_at_each_step_holds_each_step_for_its_own_gate() -> None:
    from modeldeploy.operator.api.v1alpha1.status import AnalysisResult

    p = replace(P, steps=(Step(20, 30), Step(60, 30)), quality_each_step=True)
    s = RolloutState(phase="Canary", stable="old", canary="new", step=0, started_at=0.0, phase_since=100.0)
    passing = AnalysisResult(step=0, verdict="Pass", metrics=[])
    sig = Signals(desired="new", canary_ready=1, analysis=passing, analysis_at=140.0)
    assert advance(s, p, sig, 140.0).event is None  # the pause is over but no gate for step 1 yet
    verifying = qresult(True)  # the Verifying gate's result (step None) does not count for a step
    assert advance(s, p, replace(sig, quality=verifying), 140.0).event is None
    t = advance(s, p, replace(sig, quality=qresult(True).model_copy(update={"step": 0})), 141.0)
    assert (t.state.step, t.event[1]) == (1, "AnalysisPassed")
    bad = qresult(False).model_copy(update={"step": 0})
    t = advance(s, p, replace(sig, quality=bad, analysis=None), 110.0)  # fails even during the pause
    assert (t.state.phase, t.event[1]) == ("RollingBack", "QualityFailed") and t.event[2].count(
        "step 1:"
    ) == 1
    t = advance(s, p, replace(sig, analysis=None), 100.0 + 121)
    assert (t.state.phase, t.event[1]) == ("RollingBack", "QualityTimeout")
    assert advance(s, replace(p, quality_each_step=False), sig, 140.0).event[1] == "AnalysisPassed"
    spec = ModelDeploymentSpec.model_validate(quality_spec({"atEachStep": True}))
    assert progression.policy(spec).quality_each_step


def test_observe_runs_a_gate_per_canary_step_with_at_each_step(cohorts, monkeypatch) -> None:
    from modeldeploy.operator.controller import observe

    serving: list[bool] = []  # a step's gate tells run_quality the canary serves production traffic too

    def spy(*a, canary_serving: bool = False, **k):  # noqa: ANN002, ANN003, ANN202
        serving.append(canary_serving)
        return run_quality(*a, canary_serving=canary_serving, **k)

    monkeypatch.setattr(observe, "run_quality", spy)
    s, c = cohorts(FakeLM(GOOD, -0.5), FakeLM(GOOD, -0.5))
    observer, runner, obj = _observer_world(
        {"evalSet": {"inline": ITEMS}, "atEachStep": True}, s.url, c.url, None
    )
    obj["status"] |= {"phase": "Canary", "currentStep": 1}
    assert observer.observe(obj).quality is None
    runner.wait(("uid-1", "new", 1), 30)
    r = observer.observe(obj).quality
    assert r is not None and (r.verdict, r.step) == ("Pass", 1)
    assert not runner.has(("uid-1", "new", -1))  # the Verifying gate is not rerun in Canary
    assert serving == [True]
