"""ModelDeployment status types (written only by the operator); the object itself is in modeldeployment.py."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from modeldeploy.operator.api.v1alpha1._model import _Model


class Condition(_Model):
    type: str = Field(max_length=64, description="Ready, Progressing or Degraded (the rollout may add more).")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(max_length=128, description="CamelCase machine-readable reason.")
    message: str = Field(default="", max_length=4096, description="Human-readable detail.")
    observed_generation: int | None = Field(default=None, description="Generation this condition reflects.")
    last_transition_time: str | None = Field(
        default=None, description="RFC 3339 time the status last changed."
    )


class CohortStatus(_Model):
    bundle: str = Field(max_length=64, description="Bundle id served by this cohort.")
    revision: str | None = Field(default=None, max_length=256, description="Model revision of the bundle.")
    deployment: str | None = Field(default=None, max_length=253, description="Deployment running the cohort.")
    replicas: int = Field(default=0, description="Desired replicas.")
    ready_replicas: int = Field(default=0, description="Replicas passing /health/ready.")
    load_progress: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Ready replicas plus the /health/ready progress of loading ones, over desired (0..1).",
    )


class HistoryEntry(_Model):
    bundle: str = Field(max_length=64, description="Bundle id.")
    revision: str | None = Field(default=None, max_length=256, description="Model revision.")
    promoted_at: str | None = Field(default=None, description="When it became stable.")
    replaced_at: str | None = Field(default=None, description="When it stopped being stable.")


class MetricVerdict(_Model):
    metric: str = Field(max_length=64, description="Metric name.")
    stable: float | None = Field(default=None, description="Stable cohort value.")
    canary: float | None = Field(default=None, description="Canary cohort value.")
    threshold: float | None = Field(default=None, description="Threshold applied.")
    samples: int = Field(default=0, description="Requests observed per cohort (minimum of both).")
    verdict: Literal["Pass", "Fail", "Inconclusive"] = Field(description="Pass, Fail or Inconclusive.")


class AnalysisResult(_Model):
    time: str | None = Field(default=None, description="When the analysis ran.")
    step: int | None = Field(default=None, description="Rollout step analysed.")
    verdict: Literal["Pass", "Fail", "Inconclusive"] = Field(description="Overall verdict.")
    metrics: list[MetricVerdict] = Field(default_factory=list, description="Per-metric figures.")
    message: str | None = Field(
        default=None,
        max_length=1024,
        description="What could not be read this interval "
        "(unreachable pods, a Prometheus error naming the query).",
    )


class DivergentItem(_Model):
    """One evaluation item on which the canary answered or scored differently from stable: the evidence a
    human reads to see why a gate failed."""

    index: int = Field(ge=0, description="The item's position in the evaluation set (0-based).")
    prompt: str = Field(default="", max_length=160, description="The item's last message, shortened.")
    at: int | None = Field(
        default=None,
        ge=0,
        description="The first answer token where the greedy answers differ (none: the answers are identical "
        "and only the scores moved).",
    )
    stable: str = Field(
        default="", max_length=160, description="Stable's answer from that token on, shortened."
    )
    canary: str = Field(default="", max_length=160, description="The canary's answer from that token on.")
    logprob_delta: float | None = Field(
        default=None, description="Mean |Δ log-probability| per token of stable's answer (nats)."
    )
    kl: float | None = Field(default=None, description="Mean KL(stable || canary) per token (top-k, nats).")
    aligned: bool = Field(
        default=True, description="False: the canary tokenized stable's answer into other token ids."
    )


class QualityResult(_Model):
    """The quality gate's last verdict: canary against stable on the pinned evaluation set."""

    time: str | None = Field(default=None, description="When the gate finished.")
    step: int | None = Field(
        default=None, description="Canary step the gate ran at (none: Verifying, before any traffic)."
    )
    canary: str | None = Field(default=None, max_length=64, description="Canary bundle id judged.")
    stable: str | None = Field(default=None, max_length=64, description="Stable bundle id compared with.")
    verdict: Literal["Pass", "Fail"] = Field(description="Pass or Fail.")
    reason: str = Field(
        default="",
        max_length=64,
        description="QualityPassed, QualityFailed, EvalSetMismatch (a ConfigMap no longer matching its "
        "pinned digest) or EvalSetInvalid (missing or unreadable).",
    )
    eval_set: str | None = Field(
        default=None, max_length=128, description="The evaluation set: built-in, inline or configmap/<name>."
    )
    digest: str | None = Field(
        default=None, max_length=71, description="sha256 of the items' canonical JSON."
    )
    items: int = Field(default=0, description="Items answered by each cohort.")
    seconds: float | None = Field(default=None, description="Wall time of the gate.")
    metrics: list[MetricVerdict] = Field(
        default_factory=list, description="accuracy, greedy agreement and log-probability figures."
    )
    message: str | None = Field(default=None, max_length=2048, description="The verdict in words.")
    divergent: list[DivergentItem] = Field(
        default_factory=list,
        max_length=5,
        description="The items that diverged most (at most 5, the worst first): where the answers part and "
        "both continuations.",
    )


class PrefetchWait(_Model):
    """One pre-pull pod that is not Ready, as the kubelet (or the scheduler) reports it."""

    node: str = Field(
        default="", max_length=253, description="Node of the pre-pull pod; empty until scheduled."
    )
    reason: str = Field(
        max_length=128,
        description="The container's waiting reason (ContainerCreating, ErrImagePull, ImagePullBackOff, ...) "
        "or the scheduler's (Unschedulable).",
    )
    message: str = Field(
        default="",
        max_length=1024,
        description="Its message: for a failed pull the registry's or the container runtime's error, e.g. a "
        "blob whose bytes do not match its digest.",
    )


class RolloutStatus(_Model):
    """What the rollout state machine needs beyond the fields above, so a restarted operator resumes."""

    started_at: str | None = Field(default=None, description="RFC 3339 time the current rollout began.")
    phase_since: str | None = Field(
        default=None, description="RFC 3339 time the current phase or step began."
    )
    reason: str = Field(
        default="", max_length=128, description="CamelCase reason of the last rollout decision."
    )
    message: str = Field(
        default="", max_length=4096, description="The last rollout decision, with its figures."
    )
    previous: str | None = Field(
        default=None, max_length=64, description="Prior bundle kept warm after a promotion."
    )
    previous_until: str | None = Field(
        default=None, description="RFC 3339 time the prior bundle stops being warm."
    )
    prior: str | None = Field(
        default=None, max_length=8, description="The prior bundle after the last promotion: Warm or Cold."
    )
    prior_reason: str | None = Field(default=None, max_length=1024, description="Why warm or cold.")
    capacity: str | None = Field(
        default=None,
        max_length=16,
        description="Capacity mode of the current or last rollout: Surge or Replace.",
    )
    capacity_reason: str | None = Field(
        default=None, max_length=1024, description="Why that mode: the spec, or the Auto fit check's figures."
    )
    restore: str | None = Field(
        default=None,
        max_length=16,
        description="Replace rollback order: StableFirst (spare GPUs: stable back before the canary goes) "
        "or CanaryFirst (no spare GPUs: canary removed first, the capacity gap reported).",
    )
    prefetch_nodes: int | None = Field(
        default=None, ge=0, description="Phase Prefetching: nodes the new bundle's images are pulled onto."
    )
    prefetched_nodes: int | None = Field(
        default=None,
        ge=0,
        description="Phase Prefetching: nodes whose pre-pull pod is Ready (images pulled).",
    )
    prefetch_waiting: list[PrefetchWait] | None = Field(
        default=None,
        max_length=16,
        description="Phase Prefetching: the pre-pull pods not Ready yet and what each waits on (pull "
        "errors first, at most 16): ContainerCreating while the pull runs, ErrImagePull or ImagePullBackOff "
        "with the kubelet's message when a pull fails.",
    )


class ModelDeploymentStatus(_Model):
    model_config = ConfigDict(extra="ignore")
    observed_generation: int | None = Field(
        default=None, description="metadata.generation the status reflects."
    )
    phase: str | None = Field(
        default=None,
        max_length=64,
        description="Stable, Prefetching, Deploying, Verifying, Canary, Promoting, RollingBack, Degraded.",
    )
    conditions: list[Condition] = Field(default_factory=list, description="Ready, Progressing, Degraded.")
    stable: CohortStatus | None = Field(default=None, description="The bundle serving production traffic.")
    canary: CohortStatus | None = Field(default=None, description="The bundle being rolled out, if any.")
    canary_weight: int = Field(default=0, ge=0, le=100, description="Percent of traffic on the canary.")
    current_step: int | None = Field(default=None, description="Index into spec.rollout.steps.")
    replicas: int = Field(
        default=0,
        description="Scale subresource: the serving slots stable and canary fill together, comparable with "
        "spec.replicas (a surge canary beside a full stable and a warm prior bundle are not counted).",
    )
    ready_replicas: int = Field(default=0, description="Serving pods ready, all cohorts.")
    selector: str | None = Field(
        default=None, description="Label selector of the serving pods (scale subresource)."
    )
    history: list[HistoryEntry] = Field(
        default_factory=list, max_length=50, description="Prior stable bundles."
    )
    last_analysis: AnalysisResult | None = Field(default=None, description="Latest canary analysis.")
    last_quality: QualityResult | None = Field(default=None, description="Latest quality gate verdict.")
    failed_bundles: list[str] = Field(
        default_factory=list, max_length=50, description="Bundle ids not retried until spec changes."
    )
    rollout: RolloutStatus | None = Field(default=None, description="Rollout state machine bookkeeping.")
