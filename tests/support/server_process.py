"""`modeldeploy serve` as a real subprocess: spawn it, poll it, stop it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(tmp_path: Path, model: Path, *flags: str, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    port = _port()
    log = open(tmp_path / f"serve-{port}.log", "w")
    cmd = [
        sys.executable,
        "-m",
        "modeldeploy",
        "serve",
        "--model",
        str(model),
        "--port",
        str(port),
        "--device",
        "cpu",
        "--served-model-name",
        "tiny",
        *flags,
    ]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    return proc, f"http://127.0.0.1:{port}"


def _get(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=5)
    except httpx.TransportError:
        return None


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
