"""The rollout state machine, table by table, with no cluster."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from modeldeploy.operator.api.v1alpha1.status import AnalysisResult, MetricVerdict
from modeldeploy.operator.rollout.machine import (
    Policy,
    RolloutState,
    Signals,
    Step,
    advance,
)
from modeldeploy.operator.rollout.sizing import canary_weight, cohort_replicas, serving_bundles

P = Policy(
    replicas=4,
    steps=(Step(10, 60), Step(50, 60)),
    load_timeout_seconds=300,
    progress_deadline_seconds=1800,
    keep_previous_replicas=1,
    keep_previous_seconds=600,
)
STABLE = RolloutState(phase="Stable", stable="old", phase_since=0.0)


@dataclass
class Story:
    """Run `advance` until it settles, keeping the events (a command acts once)."""

    events: list[tuple[str, str, str]] = field(default_factory=list)

    def settle(self, s: RolloutState, p: Policy, sig: Signals, now: float, limit: int = 10) -> RolloutState:
        for _ in range(limit):
            t = advance(s, p, sig, now)
            if t.event is None or t.state == s:
                if t.event and t.event not in self.events[-1:]:
                    self.events.append(t.event)
                return t.state
            self.events.append(t.event)
            s = t.state
            sig = replace(sig, command=None)
        return s


def result(verdict: str, step: int) -> AnalysisResult:
    return AnalysisResult(
        step=step,
        verdict=verdict,
        metrics=[
            MetricVerdict(
                metric="ttft_p95_seconds",
                stable=0.1,
                canary=0.5 if verdict == "Fail" else 0.1,
                threshold=0.12,
                samples=80,
                verdict=verdict,
            )
        ],
    )


def test_first_bundle_becomes_stable():
    t = advance(RolloutState(), P, Signals(desired="b1"), 0.0)
    assert t.state.stable == "b1" and t.state.phase == "Stable" and t.event[1] == "Initial"
    assert advance(t.state, P, Signals(desired="b1"), 1.0).event is None


def test_good_bundle_walks_every_phase_to_promotion():
    s = advance(STABLE, P, Signals(desired="new"), 10.0).state
    assert (s.phase, s.canary, s.started_at) == ("Deploying", "new", 10.0)
    assert cohort_replicas(s, P, 10.0) == {"old": 4, "new": 1} and canary_weight(s, P) == 0
    assert serving_bundles(s) == ["old"]  # no traffic before the gate
    assert advance(s, P, Signals(desired="new", canary_ready=0), 20.0).event is None
    s = advance(s, P, Signals(desired="new", canary_ready=1), 30.0).state
    assert s.phase == "Verifying"
    s = advance(s, P, Signals(desired="new", canary_ready=1, conformance=(True, "12/12 checks")), 40.0).state
    assert (s.phase, s.step, canary_weight(s, P)) == ("Canary", 0, 10)
    assert serving_bundles(s) == ["old", "new"]
    early = Signals(desired="new", canary_ready=1, analysis=result("Pass", 0), analysis_at=70.0)
    assert advance(s, P, early, 70.0).event is None  # still in the 60 s pause
    s = advance(s, P, replace(early, analysis_at=101.0), 101.0).state
    assert (s.phase, s.step) == ("Canary", 1)
    assert cohort_replicas(s, P, 101.0) == {"old": 4, "new": 4}
    stale = Signals(desired="new", canary_ready=4, analysis=result("Pass", 0), analysis_at=101.0)
    assert advance(s, P, stale, 200.0).event is None  # step 0's verdict cannot pass step 1
    s = advance(
        s, P, Signals(desired="new", canary_ready=4, analysis=result("Pass", 1), analysis_at=170.0), 170.0
    ).state
    assert s.phase == "Promoting"
    s = advance(s, P, Signals(desired="new", canary_ready=4), 180.0).state
    assert (s.phase, s.stable, s.canary, s.previous, s.history) == ("Stable", "new", None, "old", ("old",))
    assert cohort_replicas(s, P, 181.0) == {"new": 4, "old": 1}  # prior bundle warm
    assert cohort_replicas(s, P, 180.0 + 601) == {"new": 4}  # ...for keepPrevious.seconds
    assert advance(s, P, Signals(desired="new"), 800.0).state.previous is None


def canary_at_step0() -> RolloutState:
    return replace(STABLE, phase="Canary", canary="bad", step=0, started_at=100.0, phase_since=100.0)


def test_failed_analysis_rolls_back_and_is_not_retried():
    story = Story()
    sig = Signals(desired="bad", canary_ready=1, analysis=result("Fail", 0), analysis_at=130.0)
    s = story.settle(canary_at_step0(), P, sig, 130.0)  # fails even before the pause ends
    assert [e[1] for e in story.events] == ["AnalysisFailed", "RolledBack", "BundleFailed"]
    assert "ttft_p95_seconds canary=0.5 stable=0.1 threshold=0.12" in story.events[0][2]
    assert (s.phase, s.stable, s.canary, s.failed) == ("Stable", "old", None, ("bad",))
    assert cohort_replicas(s, P, 131.0) == {"old": 4} and serving_bundles(s) == ["old"]
    assert advance(s, P, Signals(desired="bad"), 500.0).event is None  # same spec: held, no retry
    s = advance(s, P, Signals(desired="fixed"), 600.0).state  # the spec changed: go
    assert (s.phase, s.canary) == ("Deploying", "fixed")


def test_load_timeout_crash_and_conformance_failures_roll_back():
    dep = replace(STABLE, phase="Deploying", canary="c", started_at=0.0, phase_since=0.0)
    t = advance(dep, P, Signals(desired="c"), 301.0)
    assert (t.state.phase, t.event[1]) == ("RollingBack", "LoadTimeout")
    t = advance(dep, P, Signals(desired="c", canary_failure="digest mismatch for /models/m"), 5.0)
    assert t.event[1] == "CanaryFailed" and "digest mismatch" in t.event[2]
    ver = replace(dep, phase="Verifying")
    t = advance(
        ver, P, Signals(desired="c", canary_ready=1, conformance=(False, "failed: unsupported_param")), 9.0
    )
    assert t.event[1] == "ConformanceFailed" and "unsupported_param" in t.event[2]
    assert canary_weight(t.state, P) == 0


def test_inconclusive_holds_until_the_deadline():
    s = canary_at_step0()
    sig = Signals(desired="bad", canary_ready=1, analysis=result("Inconclusive", 0), analysis_at=500.0)
    assert advance(s, P, sig, 500.0).event is None
    t = advance(s, P, sig, 100.0 + 1801)
    assert t.event[1] == "ProgressDeadlineExceeded"


def test_on_inconclusive_rollback_rolls_back_after_the_pause_and_holds_the_bundle():
    p = replace(P, on_inconclusive="Rollback")
    s = canary_at_step0()
    sig = Signals(desired="bad", canary_ready=1, analysis=result("Inconclusive", 0), analysis_at=130.0)
    assert advance(s, p, sig, 130.0).event is None  # inside the 60 s pause: samples may still come
    assert advance(s, P, replace(sig, analysis_at=170.0), 170.0).event is None  # Hold (the default)
    story = Story()
    out = story.settle(s, p, replace(sig, analysis_at=170.0), 170.0)
    assert [e[1] for e in story.events] == ["AnalysisInconclusive", "RolledBack", "BundleFailed"]
    assert "onInconclusive: Rollback" in story.events[0][2] and "80 samples" in story.events[0][2]
    assert (out.phase, out.stable, out.failed) == ("Stable", "old", ("bad",))
    stale = replace(sig, analysis=result("Inconclusive", 0), analysis_at=90.0)  # before the step began
    assert advance(s, p, stale, 170.0).event is None


def test_manual_controls():
    s = canary_at_step0()
    t = advance(s, P, Signals(desired="bad", command="promote"), 110.0)
    assert (t.state.phase, t.event[1]) == ("Promoting", "ManualPromote")
    t = advance(s, P, Signals(desired="bad", command="abort"), 110.0)
    assert (t.state.phase, t.event[1]) == ("RollingBack", "Aborted")
    promoted = replace(STABLE, stable="v3", history=("v1", "v2"), previous="v2", previous_until=1e9)
    t = advance(promoted, P, Signals(desired="v3", command="rollback-to:v2"), 50.0)
    assert (t.state.stable, t.state.phase, t.event[1]) == ("v2", "Stable", "RolledBackTo")
    assert t.state.failed == ("v3",) and t.state.history == ("v1", "v3")
    held = advance(t.state, P, Signals(desired="v3"), 51.0)  # v3 not re-deployed
    assert held.event[1] == "BundleFailed" and held.state.phase == "Stable" and held.state.canary is None
    assert advance(held.state, P, Signals(desired="v3"), 52.0).event is None
    t = advance(promoted, P, Signals(desired="v3", command="rollback-to:nope"), 50.0)
    assert t.event[1] == "UnknownRollbackTarget" and t.state.stable == "v3"


def test_spec_change_mid_rollout():
    s = canary_at_step0()
    t = advance(s, P, Signals(desired="newer"), 120.0)
    assert (t.state.phase, t.state.canary, t.event[1]) == ("Deploying", "newer", "Superseded")
    t = advance(s, P, Signals(desired="old"), 120.0)
    assert (t.state.phase, t.state.canary) == ("Stable", None)


def test_replica_ratio_and_gateway_sizes():
    s = canary_at_step0()
    assert cohort_replicas(s, Policy(replicas=1), 0.0) == {"old": 1, "bad": 1}
    assert cohort_replicas(s, Policy(replicas=10, steps=(Step(10, 0),)), 0.0) == {"old": 10, "bad": 2}
    gw = Policy(replicas=10, steps=(Step(10, 0), Step(50, 0)), gateway=True)
    assert cohort_replicas(s, gw, 0.0) == {"old": 10, "bad": 1}
    assert canary_weight(replace(s, phase="Promoting"), gw) == 100


def test_step_replicas_apart_from_weight():
    """A step's `replicas` (count or percentage of spec.replicas) sizes the canary; weight stays traffic."""
    s = canary_at_step0()
    p = Policy(replicas=16, steps=(Step(5, 0, replicas="25%"), Step(50, 0, replicas=2), Step(60, 0)))
    assert cohort_replicas(s, p, 0.0) == {"old": 16, "bad": 4} and canary_weight(s, p) == 5
    assert cohort_replicas(replace(s, step=1), p, 0.0) == {"old": 16, "bad": 2}
    assert cohort_replicas(replace(s, step=2), p, 0.0) == {"old": 16, "bad": 16}  # by weight: 60/40 ratio
    assert cohort_replicas(replace(s, phase="Promoting"), p, 0.0)["bad"] == 16
    big = Policy(replicas=3, steps=(Step(10, 0, replicas=9), Step(20, 0, replicas="1%")))
    assert cohort_replicas(s, big, 0.0)["bad"] == 3  # at most spec.replicas
    assert cohort_replicas(replace(s, step=1), big, 0.0)["bad"] == 1  # rounded up, at least 1
    scaled = replace(p, replicas=32)
    assert cohort_replicas(s, scaled, 0.0) == {"old": 32, "bad": 8}  # a percentage follows a scale


def test_await_promotion_step_holds_past_the_deadline_until_a_manual_promote():
    p = replace(P, steps=(Step(10, 60, await_promotion=True), Step(50, 60)), progress_deadline_seconds=300)
    s = replace(
        STABLE,
        phase="Canary",
        canary="new",
        step=0,
        started_at=0.0,
        phase_since=0.0,
        reason="ConformancePassed",
    )
    ok = Signals(desired="new", canary_ready=1, analysis=result("Pass", 0), analysis_at=61.0)
    t = advance(s, p, ok, 61.0)
    assert (t.state.phase, t.state.step, t.state.reason) == ("Canary", 0, "AwaitingPromotion"), t
    assert t.event[0] == "Normal" and "modeldeploy rollout promote" in t.event[2]
    held = t.state
    later = replace(ok, analysis_at=900.0)
    assert advance(held, p, later, 900.0).event is None  # no deadline while a human decides
    assert canary_weight(held, p) == 10
    bad = advance(held, p, replace(later, analysis=result("Fail", 0)), 901.0)
    assert (bad.state.phase, bad.state.reason) == ("RollingBack", "AnalysisFailed")  # analysis still guards
    go = advance(held, p, replace(later, command="promote"), 902.0)
    assert (go.state.phase, go.state.reason) == ("Promoting", "ManualPromote")


def test_a_new_rollout_retires_the_warm_prior_bundle():
    """Stable and canary share `<name>` by the instance label only: a warm prior bundle's pods
    would match it too and take live traffic during the canary step, so it goes first."""
    s = replace(STABLE, phase="Stable", stable="new", previous="old", previous_until=600.0, history=("old",))
    assert cohort_replicas(s, P, 10.0) == {"new": 4, "old": 1}
    t = advance(s, P, Signals(desired="newer"), 10.0)
    assert (t.state.phase, t.state.canary, t.state.previous) == ("Deploying", "newer", None)
    assert "prior bundle old no longer kept warm" in t.event[2]
    assert cohort_replicas(t.state, P, 10.0) == {"new": 4, "newer": 1}
    assert t.state.history == ("old",)  # still a rollback-to target (cold)
