"""GPUs promised but not yet visible: what one ModelDeployment's plan will take, held against the others.

A node list shows the GPUs that pods request. Between a plan scaling a Deployment up and the
ReplicaSet creating the pods lies a window in which those GPUs look spare, and a rollout deciding
then (capacity Auto's fit check) takes them: of 100 concurrent rollouts on a full pool 22 promoted,
the rest starved by Surge canaries landing on GPUs that Replace rollouts had freed for their own
canaries, decided in waves that shared one node list. So every object's plan leaves a `Claim`: the
replicas its cohorts want per bundle (and, for a Surge canary, the full size the fit check promised;
after a promotion, the prior bundle's warm replicas, which a Replace rollout scales back up).
A decision reads the nodes with the other objects' claims placed on them, less the pods the list
already shows of that object and bundle (bundle ids hash the bundle alone, so many objects can share
one), so a claim shrinks to nothing as its pods appear and nothing is counted twice.
Decisions are taken one at a time (Controller), so each sees the claims of those before it.
"""

from __future__ import annotations

import heapq
import json
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from modeldeploy.operator.api.v1alpha1.modeldeployment import ModelDeploymentSpec
from modeldeploy.operator.api.v1alpha1.topology import Toleration, Topology
from modeldeploy.operator.rollout.bundle import BUNDLE_LABEL, INSTANCE_LABEL
from modeldeploy.operator.rollout.machine import UNDER_TEST
from modeldeploy.operator.rollout.progression import warm_budget
from modeldeploy.operator.rollout.topology import NodeInfo, Nodes, accepted, pod_gpus, tolerates

ObjectKey = tuple[str, str]  # (namespace, name)
PodCounts = Counter[tuple[str, str, str]]  # (namespace, instance, bundle) -> pods the node list shows


@dataclass(frozen=True)
class Claim:
    """Replicas one object's cohorts want, per bundle, with the topology that places them."""

    namespace: str
    name: str
    wants: Mapping[str, int] = field(default_factory=dict)  # bundle -> replicas
    topology: Mapping[str, Any] = field(default_factory=dict)  # spec.topology as stored
    device: str = "auto"

    @classmethod
    def of(cls, md: dict[str, Any], status: dict[str, Any]) -> Claim:
        """From the object and the status its plan wrote: stable and canary desired replicas; a Surge
        canary still before promotion claims spec.replicas, the size Auto checked beside stable; a prior
        bundle kept warm claims its warm replicas (keepPrior within maxGPUs), until status drops it."""
        spec, wants = md.get("spec") or {}, {}
        for cohort in (status.get("stable"), status.get("canary")):
            if cohort and cohort.get("bundle"):
                wants[cohort["bundle"]] = max(
                    wants.get(cohort["bundle"], 0), int(cohort.get("replicas") or 0)
                )
        canary = (status.get("canary") or {}).get("bundle")
        surge = (status.get("rollout") or {}).get("capacity") == "Surge"
        if canary and surge and status.get("phase") in ("Deploying", *UNDER_TEST):
            wants[canary] = max(wants[canary], int(spec.get("replicas") or 0))
        rollout = status.get("rollout") or {}
        if rollout.get("previous") and rollout.get("prior") == "Warm":
            warm = _warm_replicas(spec)
            wants[rollout["previous"]] = max(wants.get(rollout["previous"], 0), warm)
        device = ((spec.get("bundle") or {}).get("config") or {}).get("device") or "auto"
        meta = md["metadata"]
        return cls(meta["namespace"], meta["name"], wants, spec.get("topology") or {}, device)

    def missing(self, seen: PodCounts) -> int:
        """Replicas wanted that the node list shows no pod of yet."""
        return sum(max(0, n - seen.get((self.namespace, self.name, b), 0)) for b, n in self.wants.items())


def _warm_replicas(spec: dict[str, Any]) -> int:
    """The warm prior's replicas as the plan sizes them; 0 for a spec the plan rejects too. Parsed only
    for an object with a warm prior, so the rare case pays for the validation."""
    try:
        return warm_budget(ModelDeploymentSpec.model_validate(spec))
    except ValidationError:
        return 0


def counted(pods: Iterable[dict[str, Any]], seen: PodCounts) -> Iterator[dict[str, Any]]:
    """The pods, one at a time (a paged list stays paged), each counted into `seen` by
    (namespace, ModelDeployment, bundle) as it passes: one bundle id is often served by many objects."""
    for p in pods:
        meta = p.get("metadata") or {}
        labels = meta.get("labels") or {}
        bundle = labels.get(BUNDLE_LABEL)
        if bundle:
            seen[(meta.get("namespace", ""), labels.get(INSTANCE_LABEL, ""), bundle)] += 1
        yield p


def pod_counts(pods: Iterable[dict[str, Any]]) -> PodCounts:
    """Pods per (namespace, ModelDeployment, bundle), for the pods a node list was computed from."""
    seen: PodCounts = Counter()
    for _ in counted(pods, seen):
        pass
    return seen


def place(nodes: list[NodeInfo], needs: Iterable[int], usable: set[str] | None = None) -> list[NodeInfo]:
    """The nodes with each need (GPUs of one replica-to-be) counted as taken, largest first, on the node
    with the most free GPUs that holds it whole, as the scheduler spreads them; `usable` limits the
    nodes (names) a need may go to. A need no node holds whole takes nothing."""
    out = {n.name: n for n in nodes}
    heap = [(-n.free_gpus, n.name) for n in nodes if usable is None or n.name in usable]
    heapq.heapify(heap)
    for need in sorted((g for g in needs if g > 0), reverse=True):
        if not heap or -heap[0][0] < need:
            continue
        free, name = heapq.heappop(heap)
        out[name] = replace(out[name], requested=out[name].requested + need)
        heapq.heappush(heap, (free + need, name))
    return Nodes.like(nodes, (out[n.name] for n in nodes))


def claim_pending(nodes: list[NodeInfo], pending: Iterable[dict[str, Any]]) -> list[NodeInfo]:
    """The nodes with the GPUs of unscheduled Pending pods counted as taken: a GPU freed for another
    rollout's Pending canary is not spare. A pod claims only nodes it could be scheduled on (its node
    selector, required node affinity and tolerations): a pod that fits no node takes nothing, and one
    pinned elsewhere must not make this pool look full (CI: another test's unschedulable pods made a
    1-replica rollout pick Replace, which its minAvailable never lets move)."""
    groups: dict[str, tuple[dict[str, Any], list[int]]] = {}  # placement constraints -> (spec, needs)
    for p in pending:
        spec, need = p.get("spec") or {}, pod_gpus(p)
        if need > 0:
            where = {k: spec.get(k) for k in ("nodeSelector", "affinity", "tolerations")}
            groups.setdefault(json.dumps(where, sort_keys=True), (spec, []))[1].append(need)
    out = nodes
    for spec, needs in groups.values():
        out = place(out, needs, {n.name for n in nodes if schedulable(spec, n)})
    return out


def schedulable(spec: dict[str, Any], node: NodeInfo) -> bool:
    """Whether a pod with this spec may be scheduled on the node, for its labels and taints."""
    if any(node.labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    tolerations = []
    for t in spec.get("tolerations") or []:
        try:
            tolerations.append(Toleration.model_validate(t))
        except ValidationError:
            continue  # an operator this subset does not model: tolerates nothing here (errs toward Replace)
    if not all(tolerates(tolerations, t) for t in node.taints if t[2] in ("NoSchedule", "NoExecute")):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    return not terms or any(_term(t, node) for t in terms)


def _term(term: dict[str, Any], node: NodeInfo) -> bool:
    """A nodeSelectorTerm: all its expressions hold (labels; matchFields on metadata.name)."""
    pairs = [(e, node.labels.get(e.get("key", ""))) for e in term.get("matchExpressions") or []]
    pairs += [
        (e, node.name if e.get("key") == "metadata.name" else None) for e in term.get("matchFields") or []
    ]
    return all(_holds(e.get("operator"), have, e.get("values") or []) for e, have in pairs)


def _holds(op: str | None, have: str | None, values: list[str]) -> bool:
    if op == "In":
        return have in values
    if op == "NotIn":
        return have not in values
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt") and have is not None and values:
        try:
            a, b = int(have), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def claimed(nodes: list[NodeInfo], claims: Iterable[Claim], seen: PodCounts) -> list[NodeInfo]:
    """`nodes` with the missing replicas of every claim placed on the nodes its topology accepts."""
    out, usable = nodes, {}  # (topology, device) -> names of the nodes fit accepts
    for c in claims:
        missing = c.missing(seen)
        if not missing:
            continue
        topo = Topology.model_validate(c.topology)
        if not topo.gpus_per_replica:
            continue
        shape = (topo.model_dump_json(), c.device)
        if shape not in usable:
            usable[shape] = {n.name for n in accepted(topo, nodes, c.device)}
        out = place(out, [topo.gpus_per_replica] * missing, usable[shape])
    return out
