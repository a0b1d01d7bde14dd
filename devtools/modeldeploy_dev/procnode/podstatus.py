"""The pod status a kubelet would write, computed from a PodWorker's containers."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from modeldeploy.operator.rollout.progression import RFC3339

if TYPE_CHECKING:
    from modeldeploy_dev.procnode.worker import Container, PodWorker


def ts() -> str:
    return dt.datetime.now(dt.UTC).strftime(RFC3339)


def _cond(w: PodWorker, typ: str, ok: bool, reason: str = "") -> dict[str, Any]:
    status = "True" if ok else "False"
    prev = w.transitions.get(typ)
    if prev is None or prev[0] != status:
        w.transitions[typ] = (status, ts())
    out = {"type": typ, "status": status, "lastTransitionTime": w.transitions[typ][1], "lastProbeTime": None}
    if reason and not ok:
        out["reason"] = reason
    return out


def _container(c: Container, initializing: bool) -> dict[str, Any]:
    state = c.state()
    if initializing and "waiting" in state and state["waiting"]["reason"] == "ContainerCreating":
        state = {"waiting": {"reason": "PodInitializing", "message": ""}}
    s: dict[str, Any] = {
        "name": c.spec.name,
        "image": c.spec.image or "",
        "imageID": "",
        "ready": c.ready,
        "started": c.proc is not None and c.startup_ok,
        "restartCount": c.restarts,
        "state": state,
        "lastState": c.last_state or {},
    }
    if c.proc is not None:
        s["containerID"] = f"process://{c.proc.pid}"
    return s


def pod_status(w: PodWorker) -> dict[str, Any]:
    inited = w.inits_done()
    mains = w.containers
    all_ready = inited and all(c.ready for c in mains)
    if w.init_failed:
        phase = "Failed"
    elif all(c.done for c in mains):
        phase = "Succeeded" if all((c.terminated or {}).get("exitCode") == 0 for c in mains) else "Failed"
    elif inited and any(c.proc is not None or c.restarts > 0 for c in mains):
        phase = "Running"
    else:
        phase = "Pending"
    sched = [
        {
            "type": "PodScheduled",
            "status": x.status,
            "lastProbeTime": None,
            "lastTransitionTime": x.last_transition_time.strftime(RFC3339)
            if x.last_transition_time
            else None,
        }
        for x in (w.pod.status.conditions or [])
        if x.type == "PodScheduled"
    ]
    conds = [
        _cond(w, "PodReadyToStartContainers", bool(w.pod_ip)),
        _cond(w, "Initialized", inited, "ContainersNotInitialized"),
        _cond(w, "ContainersReady", all_ready, "ContainersNotReady"),
        _cond(w, "Ready", all_ready, "ContainersNotReady"),
        *sched,
    ]
    msg = w.unsupported or None
    failing = next((c for c in [*w.inits, *mains] if c.waiting[0].startswith("ProcessNode")), mains[0])
    out = {
        "phase": phase,
        "conditions": conds,
        "containerStatuses": [_container(c, not inited) for c in mains],
        "hostIP": w.node_ip,
        "hostIPs": [{"ip": w.node_ip}],
        "podIP": w.pod_ip or None,
        "podIPs": [{"ip": w.pod_ip}] if w.pod_ip else [],
        "startTime": w.start_time,
        "message": msg,
        "reason": failing.waiting[0] if msg else None,
    }
    if w.inits:
        out["initContainerStatuses"] = [_container(c, False) for c in w.inits]
    return out
