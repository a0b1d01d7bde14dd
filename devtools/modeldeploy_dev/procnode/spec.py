"""Turn a pod's container into a local command line: argv, environment and paths.

Only the `modeldeploy` CLI runs here: container `command` = ["modeldeploy", ...], or no command
and the image's ENTRYPOINT/CMD taken from Dockerfile.runtime (`modeldeploy serve` + default
args); it is run as the `modeldeploy` script next to this interpreter. There is no mount
namespace, so volumes are mapped by path rewriting: an argument, env value or workingDir equal to a
volumeMount's mountPath, or below it (also as the value of `--flag=` or `NAME=`), is rewritten to
the volume's local directory:
  hostPath              -> its path on this machine
  persistentVolumeClaim -> the bound PV's hostPath/local path, else <state>/pvc/<ns>/<claim>/
  emptyDir              -> <state>/pods/<uid>/volumes/<name>/
  configMap / secret    -> files written to <state>/pods/<uid>/volumes/<name>/
Other volumes (projected service-account tokens) are not mapped.
"""

from __future__ import annotations

import base64
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from modeldeploy_dev import kubeobj as K

MODELDEPLOY = Path(sys.executable).with_name("modeldeploy")
# ENTRYPOINT and CMD of Dockerfile.runtime, used when a pod leaves `command` (and `args`) unset
IMAGE_ENTRYPOINT = ["serve"]
IMAGE_CMD = ["--host", "0.0.0.0", "--port", "8000", "--model", "/models/model"]
# The process node runs this checkout whatever the image; an engine image whose repository is one of
# these stands for a build with a known defect, switched on through the runtime's test hook, so a
# rollout e2e can canary a broken engine (the failure scenario the conformance gate exists for).
FAULT_IMAGES = {
    "modeldeploy-runtime-ignores-response-format": {"MODELDEPLOY_IGNORE_RESPONSE_FORMAT": "1"},
}
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


class UnsupportedPod(Exception):
    """The pod asks for something the process node cannot run; the reason goes to its status."""


@dataclass
class Launch:
    argv: list[str]
    env: dict[str, str]
    cwd: str | None


def expand(s: str, env: dict[str, str]) -> str:
    """Kubernetes $(VAR) expansion: unknown references stay as written, $$ escapes."""
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), s).replace("$$(", "$(")


def _volume_dir(pod: Any, vol: Any, core: client.CoreV1Api, state: Path) -> Path | None:
    uid = pod.metadata.uid
    ns = pod.metadata.namespace
    base = state / "pods" / uid / "volumes" / vol.name
    if vol.host_path is not None:
        return Path(vol.host_path.path)
    if vol.empty_dir is not None:
        base.mkdir(parents=True, exist_ok=True)
        return base
    if vol.persistent_volume_claim is not None:
        claim = core.read_namespaced_persistent_volume_claim(vol.persistent_volume_claim.claim_name, ns)
        if volume_name := K.pvc_spec(claim).volume_name:
            pv = K.pv_spec(core.read_persistent_volume(volume_name))
            if pv.host_path is not None:
                return Path(pv.host_path.path)
            if pv.local is not None:
                return Path(pv.local.path)
        d = state / "pvc" / ns / K.name(claim)
        d.mkdir(parents=True, exist_ok=True)
        return d
    if vol.config_map is not None or vol.secret is not None:
        base.mkdir(parents=True, exist_ok=True)
        if vol.config_map is not None:
            data = core.read_namespaced_config_map(vol.config_map.name, ns).data or {}
        else:
            raw = core.read_namespaced_secret(vol.secret.secret_name, ns).data or {}
            data = {k: base64.b64decode(v).decode() for k, v in raw.items()}
        for k, v in data.items():
            (base / k).write_text(v)
        return base
    return None


def _env(pod: Any, c: Any, core: client.CoreV1Api, pod_ip: str) -> dict[str, str]:
    env: dict[str, str] = {
        "PATH": f"{MODELDEPLOY.parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "HOSTNAME": pod.metadata.name,
    }
    ns = pod.metadata.namespace
    fields = {
        "metadata.name": pod.metadata.name,
        "metadata.namespace": ns,
        "metadata.uid": pod.metadata.uid,
        "spec.nodeName": pod.spec.node_name or "",
        "status.podIP": pod_ip,
        "spec.serviceAccountName": pod.spec.service_account_name or "",
    }
    for e in c.env or []:
        if e.value_from is None:
            env[e.name] = expand(e.value or "", env)
        elif e.value_from.field_ref is not None:
            env[e.name] = fields.get(e.value_from.field_ref.field_path, "")
        elif e.value_from.config_map_key_ref is not None:
            ref = e.value_from.config_map_key_ref
            env[e.name] = (core.read_namespaced_config_map(ref.name, ns).data or {}).get(ref.key, "")
        elif e.value_from.secret_key_ref is not None:
            ref = e.value_from.secret_key_ref
            raw = (core.read_namespaced_secret(ref.name, ns).data or {}).get(ref.key, "")
            env[e.name] = base64.b64decode(raw).decode() if raw else ""
        else:
            raise UnsupportedPod(f"env {e.name}: only value, fieldRef, configMapKeyRef, secretKeyRef")
    return env


def _rewrite(s: str, mounts: list[tuple[str, Path]]) -> str:
    for mount_path, local in mounts:
        mp = mount_path.rstrip("/")
        if s == mp:
            return str(local)
        if s.startswith(mp + "/"):
            return str(local) + s[len(mp) :]
        if "=" in s:  # --flag=/mount/path, or NAME=/mount/path (serve --adapter NAME=DIR)
            flag, _, val = s.partition("=")
            if val == mp or val.startswith(mp + "/"):
                return f"{flag}={_rewrite(val, mounts)}"
    return s


def build_launch(pod: Any, c: Any, core: client.CoreV1Api, pod_ip: str, state: Path) -> Launch:
    cmd = list(c.command or [])
    if cmd:
        if Path(cmd[0]).name != "modeldeploy":
            raise UnsupportedPod(f"container {c.name}: command {cmd[0]!r} is not the modeldeploy CLI")
        cmd, args = cmd[1:], list(c.args or [])
    else:
        cmd, args = IMAGE_ENTRYPOINT, list(c.args) if c.args else IMAGE_CMD
    vols = {v.name: v for v in pod.spec.volumes or []}
    mounts: list[tuple[str, Path]] = []
    for m in c.volume_mounts or []:
        v = vols.get(m.name)
        if v is None:
            continue
        local = _volume_dir(pod, v, core, state)
        if local is not None:
            if m.sub_path:
                local = local / m.sub_path
            mounts.append((m.mount_path, local))
    mounts.sort(key=lambda t: len(t[0]), reverse=True)  # the most specific mount wins
    env = _env(pod, c, core, pod_ip)
    repo = (c.image or "").split("@", 1)[0].rsplit(":", 1)[0].rsplit("/", 1)[-1]
    env.update(FAULT_IMAGES.get(repo, {}))
    env = {k: _rewrite(v, mounts) for k, v in env.items()}
    args = [_rewrite(expand(a, env), mounts) for a in [*cmd, *args]]
    cwd = _rewrite(c.working_dir, mounts) if c.working_dir else None
    if cwd is not None and not Path(cwd).is_dir():
        cwd = None
    return Launch([str(MODELDEPLOY), *args], env, cwd)
