"""The quality gate's pure parts: an answer's check, the figures over a set, and the verdict.

Figures, from the same items answered greedily by one canary pod and one stable pod:
- accuracy: the share of items whose answer passes its check, per cohort;
- greedy agreement: the share of items whose first N answer tokens are identical;
- log-probability drop (the divergence figure): the mean over items of stable's mean per-token
  log-probability of its own answer minus the canary's of the same answer (teacher forcing).

How they combine (measured on the real model: accuracy on ~30 prompts is noisy, agreement drops even
for harmless drift, the teacher-forced log-probability moves monotonically with the size of the drift):
the log-probability drop is the sensitive figure and fails past its threshold; accuracy fails only
on a drop of more than `maxAccuracyDrop` items; agreement fails only below `minAgreement`, set low.
An intended model change (a new model digest) with `accuracyFloor` is judged by that floor alone.
No I/O here: analysis/quality.py asks the pods, the rollout machine reads the verdict.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from modeldeploy.conformance.bench.checks import json_doc
from modeldeploy.operator.api.v1alpha1.quality import EvalItem, Quality
from modeldeploy.operator.api.v1alpha1.status import MetricVerdict, QualityResult

ACCURACY, AGREEMENT, LOGPROB = "accuracy", "greedy_agreement", "mean_logprob"


_TYPES: Mapping[str, Callable[[Any], bool]] = MappingProxyType(
    {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "null": lambda v: v is None,
    }
)


def schema_violations(doc: Any, schema: dict[str, Any], at: str = "$") -> list[str]:
    """Why `doc` does not satisfy `schema` (empty: it does), for the keywords the API admits
    (api/v1alpha1/quality.py SCHEMA_KEYWORDS): no jsonschema dependency in the operator image."""
    t = schema.get("type")
    types = t if isinstance(t, list) else [t] if t is not None else []
    if types and not any(_TYPES[x](doc) for x in types):
        return [f"{at}: {type(doc).__name__} is not {'/'.join(types)}"]
    out: list[str] = []
    if "enum" in schema and doc not in schema["enum"]:
        out.append(f"{at}: {doc!r} not in {schema['enum']}")
    if "const" in schema and doc != schema["const"]:
        out.append(f"{at}: {doc!r} is not {schema['const']!r}")
    if isinstance(doc, int | float) and not isinstance(doc, bool):
        if doc < schema.get("minimum", -math.inf) or doc > schema.get("maximum", math.inf):
            out.append(f"{at}: {doc} outside the schema's minimum/maximum")
    elif isinstance(doc, str):
        if not schema.get("minLength", 0) <= len(doc) <= schema.get("maxLength", math.inf):
            out.append(f"{at}: length {len(doc)} outside the schema's minLength/maxLength")
        if "pattern" in schema and not re.search(schema["pattern"], doc):
            out.append(f"{at}: {doc!r} does not match {schema['pattern']!r}")
    elif isinstance(doc, list):
        out += _array(doc, schema, at)
    elif isinstance(doc, dict):
        out += _object(doc, schema, at)
    return out


def _array(doc: list[Any], schema: dict[str, Any], at: str) -> list[str]:
    out: list[str] = []
    if not schema.get("minItems", 0) <= len(doc) <= schema.get("maxItems", math.inf):
        out.append(f"{at}: {len(doc)} items outside the schema's minItems/maxItems")
    if isinstance(schema.get("items"), dict):
        for i, v in enumerate(doc):
            out += schema_violations(v, schema["items"], f"{at}[{i}]")
    return out


def _object(doc: dict[str, Any], schema: dict[str, Any], at: str) -> list[str]:
    props = schema.get("properties") or {}
    out = [f"{at}: missing required {k!r}" for k in schema.get("required") or [] if k not in doc]
    extra = schema.get("additionalProperties", True)
    for k, v in doc.items():
        if k in props:
            out += schema_violations(v, props[k], f"{at}.{k}")
        elif extra is False:
            out.append(f"{at}: unexpected property {k!r}")
        elif isinstance(extra, dict):
            out += schema_violations(v, extra, f"{at}.{k}")
    return out


def check(item: EvalItem, answer: str) -> tuple[bool, str]:
    """(passed, why not) for one answer against the item's one check."""
    if item.exact is not None:
        ok = answer.strip() == item.exact.strip()
        return ok, "" if ok else f"not exactly {item.exact!r}"
    if item.contains is not None:
        ok = item.contains.casefold() in answer.casefold()
        return ok, "" if ok else f"does not contain {item.contains!r}"
    if item.regex is not None:
        ok = re.search(item.regex, answer) is not None
        return ok, "" if ok else f"does not match {item.regex!r}"
    try:
        doc = json_doc(answer)
    except ValueError as e:
        return False, f"not JSON: {e}"
    bad = schema_violations(doc, item.json_schema or {})
    return not bad, "; ".join(bad[:3])


@dataclass(frozen=True)
class Answer:
    """One cohort's greedy answer to one item, and its score of stable's answer."""

    text: str
    tokens: tuple[str, ...]  # the answer's token strings, in order (chat logprobs)
    passed: bool
    logprob: float | None = None  # mean per-token log-probability this cohort gives stable's answer


@dataclass(frozen=True)
class Figures:
    items: int
    stable_passed: int
    canary_passed: int
    agreement: float  # share of items whose first N tokens are identical
    stable_logprob: float | None  # mean over scored items of stable's mean per-token logprob
    canary_logprob: float | None
    scored: int  # items both cohorts scored (stable's answer not empty)

    @property
    def divergence(self) -> float | None:
        """Mean over items of (stable's - canary's) mean per-token log-probability of stable's answer."""
        if self.stable_logprob is None or self.canary_logprob is None:
            return None
        return self.stable_logprob - self.canary_logprob


def figures(pairs: list[tuple[Answer, Answer]], agreement_tokens: int) -> Figures:
    """The figures over (stable, canary) answers to the same items."""
    n = len(pairs)
    agree = sum(s.tokens[:agreement_tokens] == c.tokens[:agreement_tokens] for s, c in pairs)
    scored = [(s.logprob, c.logprob) for s, c in pairs if s.logprob is not None and c.logprob is not None]
    mean = (lambda xs: sum(xs) / len(xs)) if scored else (lambda xs: None)  # noqa: E731
    return Figures(
        items=n,
        stable_passed=sum(s.passed for s, _ in pairs),
        canary_passed=sum(c.passed for _, c in pairs),
        agreement=agree / n if n else 0.0,
        stable_logprob=mean([s for s, _ in scored]),
        canary_logprob=mean([c for _, c in scored]),
        scored=len(scored),
    )


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


# maxLogprobDrop when the spec leaves it unset. Float32 on both sides: every harmless change measured
# on the real model (other max_num_seqs, batch budget, TP=3, file layout; bench/results/quality.md)
# moved the drop by under 5e-5, so 0.005 keeps a 100x margin and still sees a 100x-wrong rms_norm_eps
# (0.0064) or a 10x-low rope_theta (0.044). Lower precision reorders more; until its spread is
# measured on a GPU, the conservative 0.1.
LOGPROB_DROP_FLOAT32, LOGPROB_DROP_OTHER = 0.005, 0.1


def logprob_threshold(q: Quality, float32: bool) -> float:
    """The log-probability drop allowed: the spec's, else the default for the cohorts' precision."""
    if q.max_logprob_drop is not None:
        return q.max_logprob_drop
    return LOGPROB_DROP_FLOAT32 if float32 else LOGPROB_DROP_OTHER


def verdict(
    f: Figures, q: Quality, model_change: str | None = None, float32: bool = False
) -> tuple[bool, list[MetricVerdict], str]:
    """(passed, per-figure verdicts, summary). `model_change`: "old -> new" model digests when the canary
    serves another model; with `accuracyFloor` set such a canary is judged by the floor alone.
    `float32`: both cohorts compute in float32 (their /v1/bundle dtype), which tightens the default
    log-probability threshold."""
    n = max(f.items, 1)
    s_acc, c_acc = f.stable_passed / n, f.canary_passed / n
    floor_mode = model_change is not None and q.accuracy_floor is not None
    v = lambda ok: "Pass" if ok else "Fail"  # noqa: E731
    if floor_mode:
        assert q.accuracy_floor is not None
        acc_ok = c_acc >= q.accuracy_floor
        metrics = [
            MetricVerdict(metric=ACCURACY, stable=_r(s_acc), canary=_r(c_acc), threshold=q.accuracy_floor,
                          samples=f.items, verdict=v(acc_ok)),
            MetricVerdict(metric=AGREEMENT, canary=_r(f.agreement), samples=f.items, verdict="Pass"),
            MetricVerdict(metric=LOGPROB, stable=_r(f.stable_logprob), canary=_r(f.canary_logprob),
                          samples=f.scored, verdict="Pass"),
        ]  # fmt: skip
        how = f"intended model change ({model_change}): judged by accuracyFloor {q.accuracy_floor:g} alone"
        return acc_ok, metrics, _summary(acc_ok, f, how)
    acc_ok = f.stable_passed - f.canary_passed <= q.max_accuracy_drop
    if q.accuracy_floor is not None:
        acc_ok = acc_ok and c_acc >= q.accuracy_floor
    agree_ok = f.agreement >= q.min_agreement
    div = f.divergence
    max_drop = logprob_threshold(q, float32)
    lp_ok = div is None or div <= max_drop  # nothing scored: not judged (stated in the summary)
    lp_threshold = None if f.stable_logprob is None else _r(f.stable_logprob - max_drop)
    acc_threshold = max((f.stable_passed - q.max_accuracy_drop) / n, q.accuracy_floor or 0.0)
    metrics = [
        MetricVerdict(metric=ACCURACY, stable=_r(s_acc), canary=_r(c_acc), threshold=_r(acc_threshold),
                      samples=f.items, verdict=v(acc_ok)),
        MetricVerdict(metric=AGREEMENT, canary=_r(f.agreement), threshold=q.min_agreement,
                      samples=f.items, verdict=v(agree_ok)),
        MetricVerdict(metric=LOGPROB, stable=_r(f.stable_logprob), canary=_r(f.canary_logprob),
                      threshold=lp_threshold, samples=f.scored, verdict=v(lp_ok)),
    ]  # fmt: skip
    ok = acc_ok and agree_ok and lp_ok
    return ok, metrics, _summary(ok, f, "canary against stable" if model_change is None else model_change)


def _summary(ok: bool, f: Figures, how: str) -> str:
    div = "n/a (nothing scored)" if f.divergence is None else f"{f.divergence:.4f}"
    return (
        f"quality {'passed' if ok else 'failed'}: accuracy canary {f.canary_passed}/{f.items} stable "
        f"{f.stable_passed}/{f.items}, greedy agreement {f.agreement:.2f}, log-prob drop {div} nats/token "
        f"over {f.scored} items ({how})"
    )


def failed_figures(result: QualityResult) -> str:
    """The failing figures in words, for the rollback message: value, stable's and the threshold."""
    bad = [m for m in result.metrics if m.verdict == "Fail"]
    return "; ".join(f"{m.metric} canary={m.canary} stable={m.stable} threshold={m.threshold}" for m in bad)
