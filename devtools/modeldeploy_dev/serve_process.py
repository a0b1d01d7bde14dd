"""`modeldeploy serve` as a child process on a free loopback port, ready before it is returned.

For benches that compare servers (cross_check, quality_gate): a real process each, so two models or
two configurations never share an engine, a GIL or a torch thread pool.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from modeldeploy_dev.wait import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(
    model: str,
    log: Path,
    *flags: str,
    pin: bool = False,
    ready_s: float = 300,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen, str]:
    """`modeldeploy serve` on CPU, logging to `log`; with `pin`, its processes on CPU 1 with one torch
    thread; `env` added to this process's environment. Returns (process, base URL) once
    /health/ready says 200; raises with the log's tail if the server exits or is not ready within
    `ready_s`."""
    port = free_port()
    cmd = [
        *(["taskset", "-c", "1"] if pin else []),
        sys.executable,
        "-m",
        "modeldeploy",
        "serve",
        "--model",
        model,
        "--port",
        str(port),
        "--device",
        "cpu",
    ]
    full = {**os.environ, **({"OMP_NUM_THREADS": "1"} if pin else {}), **(env or {})}
    proc = subprocess.Popen([*cmd, *flags], stdout=open(log, "w"), stderr=subprocess.STDOUT, env=full)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()[-2000:]}")
        return httpx.get(url + "/health/ready", timeout=2).status_code == 200

    try:
        wait_until(ready, ready_s, 0.3, f"{url} ready", ignore=(httpx.TransportError,))
    except TimeoutError as e:
        proc.kill()
        raise RuntimeError(f"server not ready in {ready_s:.0f} s: {log.read_text()[-2000:]}") from e
    return proc, url
