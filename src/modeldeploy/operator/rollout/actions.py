"""plan()'s vocabulary: what it reads of the world (`Observed`) and what it returns (actions).

Plain frozen dataclasses, no I/O: `observe.py` fills an `Observed`, `plan.py` turns it into
actions, `apply.py` executes them against the API server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from modeldeploy.operator.api.v1alpha1.status import AnalysisResult, QualityResult
from modeldeploy.operator.rollout.topology import NodeInfo


@dataclass(frozen=True)
class Create:
    obj: dict[str, Any]


@dataclass(frozen=True)
class Patch:
    """JSON merge patch: lists are replaced whole, so an edited container list reverts."""

    kind: str
    name: str
    body: dict[str, Any]


@dataclass(frozen=True)
class Delete:
    kind: str
    name: str


@dataclass(frozen=True)
class PatchStatus:
    status: dict[str, Any]


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Annotate:
    """Merge patch of the ModelDeployment's own annotations (None removes): consumes a manual command."""

    annotations: dict[str, str | None]


Action = Create | Patch | Delete | PatchStatus | Event | Annotate


class LostPod(NamedTuple):
    """A pod not Ready on a node the node controller marked lost."""

    name: str
    node: str
    started: bool  # past Pending: it ran there (and may have served); False: it never did


@dataclass
class Observed:
    deployments: list[dict[str, Any]] = field(default_factory=list)
    services: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[NodeInfo] | None = None  # None: not known yet, skip the fit check
    # bundle id -> load progress (0..1) reported by /health/ready of its pods that are not Ready yet
    loading: dict[str, list[float]] = field(default_factory=dict)
    # bundle id -> load error a pod of it reported (runtime /health/ready status "failed")
    load_errors: dict[str, str] = field(default_factory=dict)
    # bundle id -> (node, waiting reason, message) of its pre-pull pods not Ready (prefetch.waiting)
    prefetch_waiting: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)
    # rollout inputs gathered by observe.py: gate result, latest analysis, manual command
    conformance: tuple[bool, str] | None = None
    quality: QualityResult | None = None  # the quality gate's verdict on this canary, once it ran
    analysis: AnalysisResult | None = None
    analysis_at: float | None = None
    command: str | None = None
    command_annotations: tuple[str, ...] = ()
    routes: list[dict[str, Any]] | None = None  # HTTPRoutes owned; None: Gateway API not served
    analysis_fresh: bool = False  # `analysis` was computed for this reconcile (not read back from status)
    policies: list[dict[str, Any]] | None = None  # NetworkPolicies owned; None: not read, left alone
    operator_namespace: str | None = None  # where the operator runs; None: outside the cluster
    # sha256 of the operator's gate token for this ModelDeployment (controller/gatekey.py), given to
    # keyed pods; None: the operator holds no gate key
    gate_key_sha256: str | None = None
    # bundle id -> its pods not Ready, not being deleted, on a node marked lost (topology.lost_nodes);
    # filled where observe() lists pods
    lost_pods: dict[str, list[LostPod]] = field(default_factory=dict)
