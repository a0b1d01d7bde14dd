"""The restricted Pod Security Standard, as a checker of rendered pod specs."""

from __future__ import annotations


def _restricted_violations(pod: dict) -> list[str]:
    """Pod Security `restricted` (v1.36) checks, as the admission plugin evaluates them."""
    bad = []
    allowed_vols = {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
        "image",  # allowed by `restricted` since v1.33 (kubernetes/kubernetes#130394)
    }
    for v in pod.get("volumes", []):
        if not (set(v) - {"name"}) <= allowed_vols:
            bad.append(f"volume {v['name']}")
    psc = pod.get("securityContext", {})
    for c in pod.get("containers", []) + pod.get("initContainers", []):
        sc = c.get("securityContext", {})
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append("allowPrivilegeEscalation")
        if sc.get("capabilities", {}).get("drop") != ["ALL"] or set(
            sc.get("capabilities", {}).get("add", [])
        ) - {"NET_BIND_SERVICE"}:
            bad.append("capabilities")
        if sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is not True:
            bad.append("runAsNonRoot")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            bad.append("runAsUser")
        if (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type") not in (
            "RuntimeDefault",
            "Localhost",
        ):
            bad.append("seccomp")
        if sc.get("privileged") or any(p.get("hostPort") for p in c.get("ports", [])):
            bad.append("privileged/hostPort")
    return bad
