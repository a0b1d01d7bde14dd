"""The quality gate: the pinned evaluation set answered greedily by one canary and one stable pod.

Over HTTP only (httpx; never the runtime), as any OpenAI-compatible client asks:
1. each cohort answers each item greedily (temperature 0, chat `logprobs: true` for the token
   strings, `usage.prompt_tokens` for where the answer starts);
2. each cohort scores stable's answer with teacher forcing, vLLM's way: the item's messages plus
   `{"role": "assistant", "content": stable_answer}`, `add_generation_prompt: false`,
   `continue_final_message: true`, `prompt_logprobs: k`, `max_tokens: 1`. The top-level
   `prompt_logprobs` holds one entry per prompt token (the first null): the token's id, its
   log-probability and the k most likely tokens; the answer's entries are those from the cohort's
   own `usage.prompt_tokens` of step 1 to the end.
quality_checks.py checks each answer; quality_verdict.py (with divergence.py) turns both cohorts'
answers and scores into figures, a verdict and the evidence of the items that diverged.
`QualityRunner` runs a gate in a daemon thread, as the conformance gate does (gate.py): the reconcile
loop only polls.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import TypeAdapter, ValidationError

from modeldeploy.operator.analysis.divergence import TOP_K, TokenScore, parse_entry
from modeldeploy.operator.analysis.quality_checks import check
from modeldeploy.operator.analysis.quality_set import DEFAULT_ITEMS
from modeldeploy.operator.analysis.quality_verdict import (
    Answer,
    Thresholds,
    divergent,
    evidence,
    failed_figures,
    figures,
    verdict,
)
from modeldeploy.operator.api.v1alpha1.quality import EvalItem, Quality, eval_set_digest
from modeldeploy.operator.api.v1alpha1.status import QualityResult

PASSED, FAILED, MISMATCH, INVALID = "QualityPassed", "QualityFailed", "EvalSetMismatch", "EvalSetInvalid"
_ITEMS = TypeAdapter(list[EvalItem])


class EvalSetError(ValueError):
    """The evaluation set cannot be used as pinned; `reason` is EvalSetMismatch or EvalSetInvalid."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class EvalSetRef:
    items: tuple[EvalItem, ...]
    digest: str
    name: str  # built-in, inline or configmap/<name>:<key>


def resolve(q: Quality, configmap: dict[str, Any] | None = None) -> EvalSetRef:
    """The items to ask and their digest. `configmap`: the referenced ConfigMap as read (None: absent).
    A ConfigMap whose items no longer match the pinned digest raises EvalSetError(EvalSetMismatch)."""
    es = q.eval_set
    if es is None:
        return EvalSetRef(DEFAULT_ITEMS, eval_set_digest(list(DEFAULT_ITEMS)), "built-in")
    if es.inline is not None:
        return EvalSetRef(tuple(es.inline), eval_set_digest(es.inline), "inline")
    ref = es.config_map_ref
    assert ref is not None and es.digest is not None  # the API type requires one source, and a digest here
    name = f"configmap/{ref.name}:{ref.key}"
    if configmap is None:
        raise EvalSetError(INVALID, f"evalSet {name}: ConfigMap {ref.name} not found")
    raw = (configmap.get("data") or {}).get(ref.key)
    if raw is None:
        raise EvalSetError(INVALID, f"evalSet {name}: the ConfigMap has no key {ref.key!r}")
    try:
        items = _ITEMS.validate_python(json.loads(raw))
    except (ValueError, ValidationError) as e:
        raise EvalSetError(INVALID, f"evalSet {name}: not a JSON list of evaluation items: {e}"[:1000]) from e
    if not items:
        raise EvalSetError(INVALID, f"evalSet {name}: no items")
    got = eval_set_digest(items)
    if got != es.digest:
        raise EvalSetError(
            MISMATCH,
            f"evalSet {name} changed: its items hash to {got}, the spec pins {es.digest}; "
            "refused (pin the new digest in spec.rollout.analysis.quality.evalSet.digest to use it)",
        )
    return EvalSetRef(tuple(items), got, name)


@dataclass(frozen=True)
class Cohort:
    url: str  # http://<pod ip>:<port>
    api_key: str | None = None


class _Client:
    """One cohort's pod: its model name and model digest from /v1/bundle, greedy answers, scores."""

    def __init__(self, c: Cohort, timeout_s: float) -> None:
        headers = {"Authorization": f"Bearer {c.api_key}"} if c.api_key else {}
        self.url = c.url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)
        self.deadline = time.monotonic() + timeout_s
        info = self._ok(self.http.get("/v1/bundle"))
        self.model = info.get("served_model_name") or ""
        # The pod's running slots: more requests in flight only queue behind them, and a pod with a
        # queue budget refuses (429) what it expects to wait too long, so the gate never asks a
        # cohort for more at once than it runs.
        self.slots = max(1, int((info.get("server") or {}).get("max_num_seqs") or 1))
        self.model_digest = (info.get("model") or {}).get("digest")
        self.dtype = info.get("dtype")  # resolved ("auto" on CPU serves float32)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST, waiting out 429s (admission: queue full or over budget) as the pod's Retry-After
        asks, until the gate's deadline: a busy pod is slow, not wrong, and the deadline ends in
        QualityTimeout's territory rather than a failed verdict."""
        while True:
            r = self.http.post(path, json=body)
            if r.status_code != 429 or time.monotonic() >= self.deadline:
                return self._ok(r)
            try:
                wait = float(r.headers.get("retry-after", "1"))
            except ValueError:
                wait = 1.0
            time.sleep(min(max(wait, 0.2), 5.0, max(self.deadline - time.monotonic(), 0.0)))

    def _ok(self, r: httpx.Response) -> dict[str, Any]:
        if r.status_code != 200:
            raise httpx.HTTPStatusError(
                f"{r.request.method} {r.request.url.path}: HTTP {r.status_code}: {r.text[:300]}",
                request=r.request,
                response=r,
            )
        return r.json()

    def answer(self, item: EvalItem) -> tuple[str, tuple[str, ...], int]:
        """(greedy answer, its token strings, prompt tokens) for one item."""
        body = {
            "model": self.model,
            "messages": item.chat(),
            "max_tokens": item.max_tokens,
            "temperature": 0,
            "logprobs": True,
        }
        out = self._post("/v1/chat/completions", body)
        choice = out["choices"][0]
        tokens = tuple(t["token"] for t in ((choice.get("logprobs") or {}).get("content") or []))
        return choice["message"].get("content") or "", tokens, int(out["usage"]["prompt_tokens"])

    def score(self, item: EvalItem, answer: str, start: int) -> tuple[TokenScore, ...]:
        """Each token of `answer` after the item's messages, scored with teacher forcing: its id, its
        log-probability and the top k; `start`: where the answer begins (this cohort's prompt tokens
        for the item)."""
        body = {
            "model": self.model,
            "messages": [*item.chat(), {"role": "assistant", "content": answer}],
            "add_generation_prompt": False,
            "continue_final_message": True,
            "prompt_logprobs": TOP_K,
            "max_tokens": 1,
            "temperature": 0,
        }
        out = self._post("/v1/chat/completions", body)
        entries = out.get("prompt_logprobs")
        if not isinstance(entries, list):
            raise ValueError(f"{self.url}: no prompt_logprobs in the response (prompt_logprobs unsupported?)")
        return tuple(parse_entry(e) for e in entries[start:] if e)

    def close(self) -> None:
        self.http.close()


def serving_share(slots: int) -> int:
    """Requests the gate keeps in flight at a pod that serves production traffic meanwhile: half its
    running slots, at least one."""
    return max(1, slots // 2)


def run_quality(
    q: Quality,
    es: EvalSetRef,
    stable: Cohort,
    canary: Cohort,
    timeout_s: float = 60.0,
    parallel: int = 8,
    clock: Callable[[], float] = time.monotonic,
    canary_serving: bool = False,
) -> QualityResult:
    """Ask both pods, compute the figures and the verdict (no Kubernetes: the caller found the pods).
    `canary_serving`: the canary takes production traffic too (a gate at a canary step)."""
    t0 = clock()
    s, c = _Client(stable, timeout_s), _Client(canary, timeout_s)
    try:
        items = list(es.items)
        n = range(len(items))
        # Both pods at once, up to `parallel` requests each but never more than the pod's slots. A pod
        # that serves production traffic meanwhile (stable always, the canary at a step) gives the
        # gate at most half its slots, so production requests still find a free slot instead of
        # queueing behind the gate until the pod's queue budget refuses them (429).
        s_n = min(parallel, serving_share(s.slots))
        c_n = min(parallel, serving_share(c.slots) if canary_serving else c.slots)
        with ThreadPoolExecutor(s_n) as sp, ThreadPoolExecutor(c_n) as cp:
            s_fut, c_fut = sp.map(s.answer, items), cp.map(c.answer, items)
            s_ans, c_ans = list(s_fut), list(c_fut)
            s_fut = sp.map(lambda i: s.score(items[i], s_ans[i][0], s_ans[i][2]), n)
            c_fut = cp.map(lambda i: c.score(items[i], s_ans[i][0], c_ans[i][2]), n)
            s_lp, c_lp = list(s_fut), list(c_fut)
        pairs = [
            (
                Answer(sa[0], sa[1], check(it, sa[0])[0], sl if sa[0] else None),
                Answer(ca[0], ca[1], check(it, ca[0])[0], cl if sa[0] else None),
            )
            for it, sa, ca, sl, cl in zip(items, s_ans, c_ans, s_lp, c_lp, strict=True)
        ]
        float32 = s.dtype == c.dtype == "float32"
        change = None
        if s.model_digest and c.model_digest and s.model_digest != c.model_digest:
            change = f"model digest {s.model_digest[:19]} -> {c.model_digest[:19]}"
    finally:
        s.close()
        c.close()
    f = figures(pairs, q.agreement_tokens)
    ok, metrics, summary = verdict(f, q, change, float32=float32)
    rows = divergent(items, pairs, f, Thresholds.of(q, float32, f.items).logprob_delta)
    result = QualityResult(
        verdict="Pass" if ok else "Fail",
        reason=PASSED if ok else FAILED,
        eval_set=es.name,
        digest=es.digest,
        items=f.items,
        seconds=round(clock() - t0, 2),
        metrics=metrics,
        message=summary,
        divergent=rows,
    )
    if not ok:
        why = f"{summary}; failing: {failed_figures(result)}" + (
            f"; diverged: {evidence(rows)}" if rows else ""
        )
        result = result.model_copy(update={"message": why[:2048]})
    return result


def refused(reason: str, message: str, es_name: str | None = None) -> QualityResult:
    """A gate that could not run as pinned (eval set refused, pods unreachable): a failed verdict."""
    return QualityResult(verdict="Fail", reason=reason, eval_set=es_name, message=message[:2048])


GateKey = tuple[str, str, int]  # (md uid, canary bundle id, step: -1 for Verifying)


@dataclass
class _Run:
    started: float
    thread: threading.Thread
    result: QualityResult | None = None


class QualityRunner:
    """Runs quality gates in daemon threads; the reconcile loop polls `ensure()` once per pass.

    At most one run per key and `max_parallel` overall. The rollout machine bounds the wait
    (timeoutSeconds -> QualityTimeout); a run past that keeps its key busy until it ends."""

    def __init__(self, max_parallel: int = 2, clock: Callable[[], float] = time.monotonic) -> None:
        self._slots = threading.BoundedSemaphore(max_parallel)
        self._lock = threading.Lock()
        self._runs: dict[GateKey, _Run] = {}
        self._clock = clock

    def ensure(self, key: GateKey, job: Callable[[], QualityResult]) -> QualityResult | None:
        """Start `job` unless this key has a run; its result once finished, else None."""
        with self._lock:
            run = self._runs.get(key)
            if run is None:
                t = threading.Thread(
                    target=self._work, args=(key, job), name=f"quality-{key[1]}", daemon=True
                )
                self._runs[key] = run = _Run(self._clock(), t)
                t.start()
            return run.result

    def has(self, key: GateKey) -> bool:
        with self._lock:
            return key in self._runs

    def wait(self, key: GateKey, timeout: float) -> QualityResult | None:
        """Block up to `timeout` for a result: for tests, never for the reconcile loop."""
        with self._lock:
            run = self._runs.get(key)
        if run is not None:
            run.thread.join(timeout)
        with self._lock:
            return run.result if run is not None else None

    def forget_md(self, md_uid: str) -> None:
        """Drop the finished runs of a settled or deleted ModelDeployment."""
        with self._lock:
            for k in [k for k, r in self._runs.items() if k[0] == md_uid and not r.thread.is_alive()]:
                del self._runs[k]

    def holds(self, md_uid: str) -> bool:
        with self._lock:
            return any(k[0] == md_uid for k in self._runs)

    def _work(self, key: GateKey, job: Callable[[], QualityResult]) -> None:
        with self._slots:
            try:
                out = job()
            except EvalSetError as e:
                out = refused(e.reason, str(e))
            except (httpx.HTTPError, ValueError, KeyError, TypeError, OSError) as e:
                out = refused(FAILED, f"quality gate could not run: {type(e).__name__}: {e}")
            except Exception as e:  # noqa: BLE001 - a bug must read as a failed gate, not hang Verifying
                out = refused(FAILED, f"quality gate crashed: {type(e).__name__}: {e}")
        with self._lock:
            run = self._runs.get(key)
            if run is not None:
                run.result = out
