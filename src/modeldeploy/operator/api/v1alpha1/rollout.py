"""How a bundle change is rolled out (spec.rollout): canary steps, traffic routing, capacity, warm prior.

The canary's analysis settings are in the analysis module; this module holds the steps and what moves
traffic and replicas between them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from modeldeploy.operator.api.v1alpha1._model import _Model
from modeldeploy.operator.api.v1alpha1.analysis import Analysis
from modeldeploy.operator.api.v1alpha1.common import CountOrPercent, _cel

MSG_STEPS = "rollout.steps weights must be strictly increasing"
DNS_LABEL_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class RolloutStep(_Model):
    """One canary step: traffic weight, then a pause with analysis."""

    weight: int = Field(ge=1, le=100, description="Canary traffic percent at this step.")
    pause_seconds: int = Field(default=60, ge=0, le=86400, description="Hold before analysis may advance.")
    replicas: CountOrPercent | None = Field(
        default=None,
        description="Canary replicas at this step, apart from its traffic weight: a count or a percentage "
        "of spec.replicas ('25%', rounded up; at least 1, at most spec.replicas). Default: proportional to "
        "weight (replica ratio: weight% of the pods beside a full stable; Gateway API: weight% of "
        "spec.replicas).",
    )
    await_promotion: bool = Field(
        default=False,
        description="After the pause and a passing analysis, hold until `modeldeploy rollout promote` "
        "(Argo CD: Suspended); analysis keeps running and a failure still rolls back.",
    )


class GatewayParentRef(_Model):
    """A Gateway (and listener) the HTTPRoute attaches to."""

    name: str = Field(max_length=253, description="Gateway name.")
    # a DNS label, as Gateway API's Namespace type says: the NetworkPolicy's namespace selector is built from
    # it, and a value that is no label value failed every reconcile (bench/crd_fuzz.py found it)
    namespace: str | None = Field(
        default=None, max_length=63, pattern=DNS_LABEL_RE, description="Gateway namespace (a DNS label)."
    )
    section_name: str | None = Field(default=None, max_length=253, description="Listener name.")


class GatewayAPI(_Model):
    parent_refs: list[GatewayParentRef] = Field(
        min_length=1, max_length=16, description="Gateways the HTTPRoute attaches to."
    )
    hostnames: list[str] = Field(default_factory=list, max_length=16, description="HTTPRoute hostnames.")
    cohort_header: str = Field(
        default="x-modeldeploy-cohort",
        max_length=256,
        description="Header whose value 'canary' pins to canary.",
    )


class TrafficRouting(_Model):
    gateway_api: GatewayAPI | None = Field(
        default=None,
        alias="gatewayAPI",
        description="Route by Gateway API HTTPRoute weights; default: by replica ratio.",
    )


class KeepPrevious(_Model):
    replicas: int = Field(default=1, ge=0, description="Warm replicas of the prior bundle after promotion.")
    seconds: int = Field(default=3600, ge=0, description="How long the prior bundle stays warm.")


class KeepPrior(_Model):
    """The prior bundle kept warm after a promotion, within a GPU budget and only on spare GPUs."""

    replicas: int = Field(default=1, ge=0, description="Warm replicas of the prior bundle after promotion.")
    max_gpus: int | None = Field(
        default=None,
        ge=0,
        alias="maxGPUs",
        description="GPU budget of the warm prior: at most maxGPUs / topology.gpusPerReplica replicas "
        "(default: no budget beyond replicas).",
    )
    seconds: int = Field(default=3600, ge=0, description="How long the prior bundle stays warm.")


class Prefetch(_Model):
    """Pre-pull a new bundle's images onto the nodes before its canary is created."""

    enabled: bool | None = Field(
        default=None,
        description="Pull the new bundle's engine image and image volumes onto every node the canary may "
        "run on (the nodes matching its nodeSelector, GPU type and tolerations; spec.replicas nodes when "
        "the operator cannot list nodes) with short-lived pre-pull pods, then create the canary: its "
        "loadTimeoutSeconds measures loading, not downloading. Unset: on when the model or an adapter is "
        "an oci:// image volume (the node's image store keeps what the pre-pull pod pulled); other "
        "schemes stage files inside each pod (pvc://, an init container's emptyDir), so there it would "
        "only warm the engine image.",
    )
    timeout_seconds: int = Field(
        default=900,
        ge=10,
        le=86400,
        description="Every pre-pull pod Ready within this, else the rollout rolls back (PrefetchTimeout, "
        "naming what the pods still wait on); a pull that fails on the artifact itself (not found, a blob "
        "whose bytes do not match its digest, credentials refused) rolls back at once (PrefetchFailed), one "
        "that fails on the registry or network (refused, timed out, 5xx, 429) is retried until then.",
    )
    keep_rollback_target: bool = Field(
        default=False,
        description="Keep the rollback target's images (status.history's newest bundle: its engine image and "
        "oci:// image volumes) in use on every node the bundle may run on, with one idle pod per node (10m "
        "CPU, no GPU) mounting them, so the kubelet's image garbage collection, which removes only images no "
        "container uses, leaves them: a rollback or a spec reverted to that bundle finds them pulled. Costs "
        "the disk of one more bundle per node. Without it the target stays pulled while the warm prior "
        "(keepPrior) runs, then until the node needs the disk.",
    )


def _default_steps() -> list[RolloutStep]:
    return [RolloutStep(weight=10), RolloutStep(weight=50)]


class Rollout(_Model):
    steps: list[RolloutStep] = Field(
        default_factory=_default_steps,
        max_length=20,
        description="Canary steps; weights strictly increasing in 1..100.",
        json_schema_extra=_cel(
            "self.all(a, self.exists_one(b, b.weight == a.weight)) && self.map(s, s.weight).isSorted()",
            MSG_STEPS,
        ),
    )
    analysis: Analysis = Field(default_factory=Analysis, description="Canary vs stable metric analysis.")
    conformance_gate: bool = Field(
        default=True, description="Run the serving-contract suite on a canary pod first."
    )
    traffic_routing: TrafficRouting = Field(
        default_factory=TrafficRouting, description="How traffic is split."
    )
    keep_previous: KeepPrevious = Field(
        default_factory=KeepPrevious,
        description="Deprecated, use keepPrior (which wins when set): warm prior bundle for fast rollback.",
    )
    keep_prior: KeepPrior | None = Field(
        default=None,
        description="Warm prior bundle for fast rollback, within a GPU budget: kept warm only within "
        "maxGPUs and only when the GPUs are spare (Replace on a full cluster: scaled to zero, a cold "
        "rollback target); status.rollout.prior says Warm or Cold and why.",
    )
    prefetch: Prefetch = Field(
        default_factory=Prefetch, description="Pre-pull of a new bundle's images before its canary starts."
    )
    progress_deadline_seconds: int = Field(
        default=1800, ge=30, description="A rollout not done by then rolls back."
    )
    capacity: Literal["Surge", "Replace", "Auto"] = Field(
        default="Auto",
        description="Where the canary's GPUs come from. Surge: the canary runs beside a full stable (spare "
        "GPUs needed, up to spec.replicas more at promotion). Replace: stable is scaled down by k, then k "
        "canary replicas come up on the freed GPUs, never below minAvailable Ready; a rollback brings "
        "stable back before removing the canary where spare GPUs allow. Auto: Surge when the fit check "
        "finds spec.replicas more replicas fit on the nodes' spare GPUs (allocatable minus requested), "
        "else Replace; the choice is in the NewBundle Event and status.rollout.capacity.",
    )
    min_available: CountOrPercent = Field(
        default="75%",
        description="Ready replicas (stable and canary together) a Replace rollout never goes below: a count "
        "or a percentage of spec.replicas (rounded up). When moving one more replica would cross it, the "
        "rollout waits (Progressing reason InsufficientCapacity).",
    )

    @model_validator(mode="after")
    def _increasing(self) -> Rollout:
        w = [s.weight for s in self.steps]
        if any(b <= a for a, b in zip(w, w[1:], strict=False)):
            raise ValueError(MSG_STEPS)
        return self
