"""Image pull failures of serving pods, as kubelet reports them in the container statuses.

A pod whose image cannot be pulled (a digest the registry lacks, a name that does not parse)
stays Pending and never answers /health/ready, so without this the rollout would only see it
at its progress deadline, with a reason that does not name the image. Only kubelet's persistent
states count: ErrImagePull alone is the first failed attempt (a registry hiccup retries);
ImagePullBackOff is kubelet saying the attempts keep failing.
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
