"""The rollout state machine, pure: `advance(state, policy, signals, now) -> Transition`.

    Stable --spec.bundle changes--> [Prefetching: images pulled onto the nodes] --> Deploying(canary)
      --canary Ready--> Verifying(conformance, then quality)
      --pass--> Canary(step i: weight, pause, analysis) --all steps pass--> Promoting --> Stable
    any step --fail/timeout/crash/abort--> RollingBack --> Stable(prior) + Degraded reason

Everything it needs to resume lives in `RolloutState`, which the operator keeps in
status, so a restarted operator continues where it stopped. Every transition carries the
Event (reason, message) that explains it, with the figures that decided it. Times are
epoch seconds; the operator converts status timestamps at its edge.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Literal

from modeldeploy.operator.analysis.verdicts import fmt
from modeldeploy.operator.api.v1alpha1.status import AnalysisResult, QualityResult

Phase = Literal["Stable", "Prefetching", "Deploying", "Verifying", "Canary", "Promoting", "RollingBack"]
DEPLOYED: tuple[Phase, ...] = (
    "Deploying",
    "Verifying",
    "Canary",
    "Promoting",
)  # the canary Deployment exists
ACTIVE_PHASES: tuple[Phase, ...] = ("Prefetching", *DEPLOYED)  # a canary is moving
IN_FLIGHT: tuple[Phase, ...] = (*ACTIVE_PHASES, "RollingBack")  # a canary exists: the reconcile keeps ticking
TAKING_TRAFFIC: tuple[Phase, ...] = ("Canary", "Promoting")  # the canary is behind the main Service
UNDER_TEST: tuple[Phase, ...] = ("Verifying", "Canary")  # gated or analysed: observe reads its pods
PROMOTABLE: tuple[Phase, ...] = (
    "Prefetching",
    "Deploying",
    "Verifying",
    "Canary",
)  # a manual promote applies
AWAITING = "AwaitingPromotion"  # reason of a Canary step held for a manual promote
INCONCLUSIVE = "AnalysisInconclusive"  # rollback reason under analysis.onInconclusive: Rollback
CONFORMANCE_PASSED = "ConformancePassed"  # Verifying's reason while the quality gate runs after conformance
QUALITY_TIMEOUT = "QualityTimeout"
PREFETCHED = "Prefetched"  # Deploying's reason once the pre-pull finished
PREFETCH_TIMEOUT = "PrefetchTimeout"
PREFETCH_FAILED = "PrefetchFailed"


@dataclass(frozen=True)
class Step:
    weight: int
    pause_seconds: int
    await_promotion: bool = False  # hold after a passing analysis until a manual promote
    replicas: int | str | None = None  # canary replicas (count or "N%" of spec.replicas); None: by weight


@dataclass(frozen=True)
class Policy:
    """The parts of spec the machine reads (spec.replicas, .readiness, .rollout)."""

    replicas: int
    steps: tuple[Step, ...] = (Step(10, 60), Step(50, 60))
    conformance_gate: bool = True
    quality_gate: bool = False  # spec.rollout.analysis.quality set and enabled: Verifying runs it next
    quality_timeout_seconds: int = 300
    quality_each_step: bool = False  # quality.atEachStep: each canary step waits for its own gate
    load_timeout_seconds: int = 600
    progress_deadline_seconds: int = 1800
    keep_previous_replicas: int = 1
    keep_previous_seconds: int = 3600
    gateway: bool = False  # Gateway API weights instead of replica ratio
    on_inconclusive: Literal["Hold", "Rollback"] = "Hold"  # an Inconclusive verdict after the pause
    capacity: Literal["Surge", "Replace", "Auto"] = "Auto"  # where the canary's GPUs come from
    min_available: int = 0  # Ready replicas (stable + canary) Replace never goes below
    keep_gpus: int | None = None  # keepPrior.maxGPUs (None: no GPU budget), for the status message
    prefetch: bool = False  # pre-pull a new bundle's images onto the nodes before its canary (Prefetching)
    prefetch_timeout_seconds: int = 900


@dataclass(frozen=True)
class RolloutState:
    phase: Phase = "Stable"
    stable: str | None = None
    canary: str | None = None
    step: int | None = None
    started_at: float | None = None  # rollout began
    phase_since: float | None = None  # current phase / step began
    reason: str = ""
    message: str = ""
    failed: tuple[str, ...] = ()
    previous: str | None = None  # prior bundle kept warm after a promotion
    previous_until: float | None = None
    history: tuple[str, ...] = ()  # prior stable bundles, oldest first
    capacity: str = ""  # Surge | Replace, decided when the rollout starts ("" before any)
    capacity_reason: str = ""  # why (spec, or the Auto fit check's figures)
    restore: str = ""  # Replace rollback order: StableFirst | CanaryFirst ("" until rolling back)
    prior: str = ""  # Warm | Cold: the prior bundle after the last promotion
    prior_reason: str = ""


@dataclass(frozen=True)
class Signals:
    desired: str  # bundle id of spec.bundle now
    canary_ready: int = 0
    canary_failure: str | None = None  # e.g. CrashLoopBackOff / digest mismatch, from pod status
    conformance: tuple[bool, str] | None = None  # (passed, summary) once the suite ran on the canary
    quality: QualityResult | None = None  # the quality gate's verdict on this canary, once it ran
    analysis: AnalysisResult | None = None
    analysis_at: float | None = None  # when `analysis` was computed
    command: str | None = None  # "promote" | "abort" | "rollback-to:<bundle>"
    surge_fits: tuple[bool, str] | None = None  # the canary at full size fits beside stable (None: unknown)
    stable_ready: int = 0
    restore_fits: bool | None = None  # Replace: the stable's freed replicas fit on spare GPUs again
    prior_fits: tuple[bool, str] | None = None  # Replace: the warm prior's replicas fit on spare GPUs
    prefetch: tuple[int, int] | None = None  # (pre-pull pods Ready, pre-pull pods wanted); None: none yet
    prefetch_waiting: str | None = None  # what the pre-pull pods not Ready wait on (prefetch.summary)


@dataclass(frozen=True)
class Transition:
    state: RolloutState
    event: tuple[str, str, str] | None = None  # (Normal|Warning, Reason, message)


def _go(
    s: RolloutState, now: float, phase: Phase, reason: str, message: str, warn: bool = False, **changes
) -> Transition:
    new = replace(s, phase=phase, phase_since=now, reason=reason, message=message, **changes)
    return Transition(new, ("Warning" if warn else "Normal", reason, message))


def _rollback(s: RolloutState, now: float, reason: str, message: str) -> Transition:
    return _go(s, now, "RollingBack", reason, f"rolling back {s.canary}: {message}", warn=True)


def advance(s: RolloutState, p: Policy, sig: Signals, now: float) -> Transition:
    """One decision per call; call again until the returned event is None."""
    t = _advance(s, p, sig, now)
    if t.state.phase == "RollingBack" and s.phase != "RollingBack" and t.state.capacity == "Replace":
        # decided as the rollback begins, before the stable's new pods take the spare GPUs
        order = "StableFirst" if sig.restore_fits else "CanaryFirst"
        t = replace(t, state=replace(t.state, restore=order))
    return t


def _advance(s: RolloutState, p: Policy, sig: Signals, now: float) -> Transition:
    if s.previous and s.previous_until is not None and now >= s.previous_until:
        s = replace(
            s,
            previous=None,
            previous_until=None,
            prior="Cold",
            prior_reason=f"warm time over: {s.previous} scaled to zero, a cold rollback target",
        )
    if s.stable is None:  # first deployment: no canary to compare
        return _go(
            s,
            now,
            "Stable",
            "Initial",
            f"bundle {sig.desired} is the first stable bundle",
            stable=sig.desired,
        )
    manual = _manual(s, sig, now)
    if manual is not None:
        return manual
    if s.phase in ACTIVE_PHASES and sig.desired != s.canary:  # spec moved on mid-rollout
        if sig.desired == s.stable:
            return _go(
                s,
                now,
                "Stable",
                "Superseded",
                f"spec returned to stable {s.stable}; canary {s.canary} dropped",
                canary=None,
                step=None,
                started_at=None,
            )
        return _go(
            s,
            now,
            "Prefetching" if p.prefetch else "Deploying",
            "Superseded",
            f"spec changed to {sig.desired} during the rollout of {s.canary}",
            canary=sig.desired,
            step=None,
            started_at=now,
        )
    elapsed = 0.0 if s.phase_since is None else now - s.phase_since
    if s.phase in ACTIVE_PHASES and sig.canary_failure:
        reason = PREFETCH_FAILED if s.phase == "Prefetching" else "CanaryFailed"
        return _rollback(s, now, reason, sig.canary_failure)
    waiting = s.reason == AWAITING  # a human's pace: no progress deadline
    if (
        s.phase in ACTIVE_PHASES
        and not waiting
        and s.started_at is not None
        and now - s.started_at > p.progress_deadline_seconds
    ):
        return _rollback(
            s,
            now,
            "ProgressDeadlineExceeded",
            f"not promoted within {p.progress_deadline_seconds}s (phase {s.phase})",
        )
    return _PHASES[s.phase](s, p, sig, now, elapsed)


def _manual(s: RolloutState, sig: Signals, now: float) -> Transition | None:
    cmd = sig.command or ""
    if cmd == "abort" and s.phase in ACTIVE_PHASES:
        return _rollback(s, now, "Aborted", "aborted by annotation modeldeploy.dev/abort")
    if cmd == "promote" and s.phase in PROMOTABLE:
        return _go(
            s,
            now,
            "Promoting",
            "ManualPromote",
            f"promoting {s.canary} by annotation modeldeploy.dev/promote",
        )
    if cmd.startswith("rollback-to:"):
        target = cmd.split(":", 1)[1]
        if target == s.stable and s.phase == "Stable":
            return None
        if target not in s.history and target != s.previous:
            return Transition(
                s,
                (
                    "Warning",
                    "UnknownRollbackTarget",
                    f"rollback-to {target}: not in status.history ({', '.join(s.history) or 'empty'})",
                ),
            )
        failed = s.failed + ((sig.desired,) if sig.desired != target and sig.desired not in s.failed else ())
        return _go(
            s,
            now,
            "Stable",
            "RolledBackTo",
            f"all traffic to {target} by rollback-to; "
            f"spec bundle {sig.desired} held as failed until the spec changes",
            warn=True,
            stable=target,
            canary=None,
            step=None,
            started_at=None,
            previous=s.stable if s.stable != target else s.previous,
            history=tuple(h for h in s.history if h != target) + (s.stable,),
            failed=failed,
        )
    return None


def _stable(s, p, sig, now, elapsed) -> Transition:
    if sig.desired == s.stable:
        return Transition(s)
    if sig.desired in s.failed:
        note = f"{sig.desired} held: not retried until spec.bundle changes"
        if note in s.message:
            return Transition(s)
        # the reason stays the one that failed the bundle (e.g. AnalysisFailed), with its figures
        held = replace(
            s, reason=s.reason or "BundleFailed", message=f"{s.message}; {note}" if s.message else note
        )
        return Transition(held, ("Warning", "BundleFailed", note))
    failed = tuple(f for f in s.failed if f == s.stable)  # a new bundle: forget older failures
    # The warm prior bundle retires: once stable and canary share `<name>` (no bundle key in its
    # selector), its pods would match too and take live traffic. The stable is the rollback now.
    retired = f"; prior bundle {s.previous} no longer kept warm" if s.previous else ""
    mode, why = capacity_mode(p, sig)
    how = "next to" if mode == "Surge" else "in place of replicas of"
    first = "pre-pulling the images of" if p.prefetch else "deploying"
    return _go(
        s,
        now,
        "Prefetching" if p.prefetch else "Deploying",
        "NewBundle",
        f"{first} canary {sig.desired} {how} stable {s.stable}{retired}; capacity {mode} ({why})",
        canary=sig.desired,
        step=None,
        started_at=now,
        failed=failed,
        previous=None,
        previous_until=None,
        prior="Cold" if s.previous else s.prior,
        prior_reason=f"{s.previous} retired by the rollout of {sig.desired}, a cold rollback target"
        if s.previous
        else s.prior_reason,
        capacity=mode,
        capacity_reason=why,
        restore="",
    )


def capacity_mode(p: Policy, sig: Signals) -> tuple[str, str]:
    """Surge or Replace for a new rollout, and why: the spec's choice, or Auto asking the fit check."""
    if p.capacity != "Auto":
        return p.capacity, f"spec.rollout.capacity: {p.capacity}"
    if sig.surge_fits is None:
        return "Surge", "Auto: node GPUs not known yet"
    fits, figures = sig.surge_fits
    return ("Surge" if fits else "Replace"), f"Auto: {figures}"


def _prefetching(s, p, sig, now, elapsed) -> Transition:
    """Pre-pull pods on the canary's nodes: Deploying once all are Ready, whose clock (loadTimeoutSeconds)
    then measures loading alone; not done within prefetch.timeoutSeconds: a rollback, like a load timeout."""
    ready, total = sig.prefetch or (0, 0)
    if total > 0 and ready >= total:
        return _go(
            s,
            now,
            "Deploying",
            PREFETCHED,
            f"images of {s.canary} pulled onto {total} node{'s' if total != 1 else ''} in {elapsed:.0f}s; "
            "deploying the canary",
        )
    if elapsed > p.prefetch_timeout_seconds:
        # a pull that kept failing on an error that may pass (a registry or network error) ends here, named
        waits = f"; {sig.prefetch_waiting}" if sig.prefetch_waiting else ""
        return _rollback(
            s,
            now,
            PREFETCH_TIMEOUT,
            f"images pulled on {ready}/{total} nodes within "
            f"prefetch.timeoutSeconds={p.prefetch_timeout_seconds}{waits}",
        )
    return Transition(s)


def _deploying(s, p, sig, now, elapsed) -> Transition:
    if sig.canary_ready >= 1:
        if p.conformance_gate or p.quality_gate:
            gate = "conformance gate" if p.conformance_gate else "quality gate"
            return _go(s, now, "Verifying", "CanaryReady", f"canary {s.canary} Ready; running the {gate}")
        return _enter_step(s, p, now, 0, "CanaryReady")
    if elapsed > p.load_timeout_seconds:
        return _rollback(
            s, now, "LoadTimeout", f"canary not Ready within loadTimeoutSeconds={p.load_timeout_seconds}"
        )
    return Transition(s)


def quality_stage(p: Policy, reason: str) -> bool:
    """Whether Verifying waits on the quality gate now: it runs after conformance passed (or alone)."""
    return p.quality_gate and (not p.conformance_gate or reason == CONFORMANCE_PASSED)


def _verifying(s, p, sig, now, elapsed) -> Transition:
    if quality_stage(p, s.reason):
        return _quality(s, p, sig, now, elapsed)
    if sig.conformance is None:
        if elapsed > p.load_timeout_seconds:
            return _rollback(s, now, "ConformanceTimeout", "no conformance result in time")
        return Transition(s)
    passed, summary = sig.conformance
    if not passed:
        return _rollback(s, now, "ConformanceFailed", summary)
    if p.quality_gate:  # the clock restarts: timeoutSeconds is the quality gate's own
        return _go(s, now, "Verifying", CONFORMANCE_PASSED, f"{summary}; running the quality gate")
    return _enter_step(s, p, now, 0, CONFORMANCE_PASSED, summary)


def _quality(s, p, sig, now, elapsed) -> Transition:
    q = sig.quality
    if q is None:
        if elapsed > p.quality_timeout_seconds:
            return _rollback(
                s,
                now,
                QUALITY_TIMEOUT,
                f"no quality verdict within timeoutSeconds={p.quality_timeout_seconds}",
            )
        return Transition(s)
    if q.verdict != "Pass":
        return _rollback(s, now, q.reason or "QualityFailed", q.message or "quality gate failed")
    return _enter_step(s, p, now, 0, "QualityPassed", q.message or "")


def _enter_step(s, p, now, i, reason, detail="") -> Transition:
    st = p.steps[i]
    msg = f"step {i + 1}/{len(p.steps)}: canary weight {st.weight}%, pause {st.pause_seconds}s" + (
        f" ({detail})" if detail else ""
    )
    return _go(s, now, "Canary", reason, msg, step=i)


def _step_quality(s, p, sig, now, elapsed) -> Transition | None:
    """quality.atEachStep: a failed gate for this step rolls back, a missing one past timeoutSeconds too;
    while it runs the step holds (Transition(s)); None when the step may go on."""
    i = s.step or 0
    q = sig.quality if sig.quality is not None and sig.quality.step == i else None
    if q is not None and q.verdict != "Pass":
        return _rollback(
            s, now, q.reason or "QualityFailed", f"step {i + 1}: {q.message or 'quality gate failed'}"
        )
    if q is None and elapsed > p.quality_timeout_seconds:
        return _rollback(
            s,
            now,
            QUALITY_TIMEOUT,
            f"step {i + 1}: no quality verdict within timeoutSeconds={p.quality_timeout_seconds}",
        )
    return Transition(s) if q is None else None


def _canary(s, p, sig, now, elapsed) -> Transition:
    i = s.step or 0
    held = _step_quality(s, p, sig, now, elapsed) if p.quality_each_step else None
    if held is not None and held.state.phase == "RollingBack":
        return held
    a = sig.analysis
    fresh = (
        a is not None
        and a.step == i
        and sig.analysis_at is not None
        and sig.analysis_at >= (s.phase_since or 0)
    )
    if a is not None and fresh and a.verdict == "Fail":
        figures = "; ".join(
            f"{m.metric} canary={fmt(m.canary)} stable={fmt(m.stable)} threshold={fmt(m.threshold)}"
            for m in a.metrics
            if m.verdict == "Fail"
        )
        return _rollback(s, now, "AnalysisFailed", f"step {i + 1}: {figures}")
    if a is None or not fresh or elapsed < p.steps[i].pause_seconds or held is not None:
        return Transition(s)  # pausing, or no verdict (analysis, or this step's quality gate) yet
    if a.verdict == "Inconclusive":
        if p.on_inconclusive == "Rollback":
            why = a.message or f"{a.metrics[0].samples if a.metrics else 0} samples"
            return _rollback(
                s, now, INCONCLUSIVE, f"step {i + 1}: analysis Inconclusive ({why}), onInconclusive: Rollback"
            )
        return Transition(s)  # Hold: until a verdict or the progress deadline
    if p.steps[i].await_promotion:
        if s.reason == AWAITING:
            return Transition(s)
        return _go(
            s,
            now,
            "Canary",
            AWAITING,
            f"step {i + 1}/{len(p.steps)} passed on {a.metrics[0].samples if a.metrics else 0}"
            f" samples; holding at {p.steps[i].weight}% until `modeldeploy rollout promote`",
            step=i,
        )
    if i + 1 < len(p.steps):
        return _enter_step(
            s,
            p,
            now,
            i + 1,
            "AnalysisPassed",
            f"step {i + 1} passed on {a.metrics[0].samples} samples" if a.metrics else "",
        )
    return _go(
        s, now, "Promoting", "AnalysisPassed", f"all {len(p.steps)} steps passed; promoting {s.canary}"
    )


def _prior(s: RolloutState, p: Policy, sig: Signals) -> tuple[bool, str]:
    """Whether the prior bundle stays warm after this promotion, and why (status.rollout.prior)."""
    budget = f" (maxGPUs {p.keep_gpus})" if p.keep_gpus is not None else ""
    if p.keep_previous_replicas <= 0 or p.keep_previous_seconds <= 0:
        return False, f"no warm replicas within keepPrior{budget}: scaled to zero, a cold rollback target"
    if s.capacity == "Replace" and sig.prior_fits is not None and not sig.prior_fits[0]:
        return False, f"GPUs not spare: {sig.prior_fits[1]}; scaled to zero, a cold rollback target"
    return True, f"{p.keep_previous_replicas} replicas warm for {p.keep_previous_seconds}s{budget}"


def _promoting(s, p, sig, now, elapsed) -> Transition:
    if sig.canary_ready >= p.replicas:
        keep, why = _prior(s, p, sig)
        return _go(
            s,
            now,
            "Stable",
            "Promoted",
            f"{s.canary} promoted; prior {s.stable} " + ("kept warm: " if keep else "cold: ") + why,
            prior="Warm" if keep else "Cold",
            prior_reason=why,
            stable=s.canary,
            canary=None,
            step=None,
            started_at=None,
            previous=s.stable if keep else None,
            previous_until=now + p.keep_previous_seconds if keep else None,
            history=(s.history + (s.stable,))[-50:],
        )
    if elapsed > p.load_timeout_seconds:
        return _rollback(
            s, now, "PromotionTimeout", f"canary not scaled to {p.replicas} Ready replicas in time"
        )
    return Transition(s)


def _rolling_back(s, p, sig, now, elapsed) -> Transition:
    restoring = s.restore == "StableFirst" and sig.stable_ready < p.replicas
    if restoring and elapsed <= p.load_timeout_seconds:
        return Transition(s)  # Replace: stable back to full size first, the canary still serving
    failed = (s.failed + (s.canary,))[-50:] if s.canary and s.canary not in s.failed else s.failed
    gap = ""
    if s.capacity == "Replace" and sig.stable_ready < p.replicas:
        gap = (
            f"; capacity gap: stable {sig.stable_ready}/{p.replicas} Ready, the rest come back as the "
            "canary's GPUs are freed"
            + (" (no spare GPUs to restore stable first)" if s.restore == "CanaryFirst" else "")
        )
    return Transition(
        replace(s, phase="Stable", phase_since=now, canary=None, step=None, started_at=None, failed=failed),
        ("Warning", "RolledBack", f"{s.canary} rolled back ({s.reason}); {s.stable} serves all traffic{gap}"),
    )


_PHASES = MappingProxyType(
    {
        "Stable": _stable,
        "Prefetching": _prefetching,
        "Deploying": _deploying,
        "Verifying": _verifying,
        "Canary": _canary,
        "Promoting": _promoting,
        "RollingBack": _rolling_back,
    }
)
