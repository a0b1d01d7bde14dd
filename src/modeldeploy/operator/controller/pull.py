"""Why a serving pod cannot run, as kubelet reports it in the container statuses: image pull
failures, and a serving container that exited with an error (a crash, a dead tensor-parallel rank).

A pod whose image cannot be pulled (a digest the registry lacks, a name that does not parse)
stays Pending and never answers /health/ready, so without this the rollout would only see it
at its progress deadline, with a reason that does not name the image. Only kubelet's persistent
states count: ErrImagePull alone is the first failed attempt (a registry hiccup retries);
ImagePullBackOff is kubelet saying the attempts keep failing.

A crash counts while the pod is not Ready after it: the runtime exits non-zero when its engine or
a rank dies (it fails fast instead of hanging), kubelet restarts it, and a canary doing that is a bad
bundle whether or not the restart later loads again.
"""

from __future__ import annotations

from typing import Any

PULL_FAILED = frozenset({"ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})


def pull_failure(pod: dict[str, Any]) -> str | None:
    """'image <ref> cannot be pulled (<reason>): <kubelet's message>' or None."""
    st = pod.get("status") or {}
    for cs in [*(st.get("initContainerStatuses") or []), *(st.get("containerStatuses") or [])]:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in PULL_FAILED:
            msg = f"image {cs.get('image', '?')} cannot be pulled ({waiting['reason']})"
            if waiting.get("message"):
                msg += f": {waiting['message']}"
            return msg[:800]
    return None


def crash_failure(pod: dict[str, Any]) -> str | None:
    """'container serve exited with code 1 (Error, 2 restarts): <message>' or None."""
    st = pod.get("status") or {}
    for cs in st.get("containerStatuses") or []:
        last = (cs.get("lastState") or {}).get("terminated") or {}
        code = last.get("exitCode")
        if cs.get("restartCount", 0) >= 1 and code not in (None, 0) and not cs.get("ready"):
            n = cs["restartCount"]
            msg = (
                f"container {cs.get('name', '?')} exited with code {code} ({last.get('reason') or 'Error'}, "
            )
            msg += f"{n} restart{'s' if n != 1 else ''})"
            if last.get("message"):
                msg += f": {last['message']}"
            return msg[:800]
    return None
