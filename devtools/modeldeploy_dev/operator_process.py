"""`modeldeploy operator` as a child process: what the demo runs and what the e2e tests restart and kill.

Run outside the cluster, as a user would (`--standalone`, against a kubeconfig), logging to a
file; its own process group, so a kill takes every thread and child with it.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OperatorProcess:
    """One operator process; restartable, `env` for failpoints (MODELDEPLOY_FAILPOINT).

    It holds a gate key, as the chart's operator does (its Secret), kept across restarts so keyed
    pods keep their digest; `env` may override or blank it (MODELDEPLOY_GATE_KEY="")."""

    def __init__(self, kubeconfig: str, namespace: str, log: Path) -> None:
        self.kubeconfig, self.namespace, self.log = kubeconfig, namespace, log
        self.gate_key = secrets.token_urlsafe(36)
        self.metrics_port, self.health_port = _free_port(), _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str] | None = None) -> None:
        env = {
            **os.environ,
            "KUBECONFIG": self.kubeconfig,
            "MODELDEPLOY_RESYNC_SECONDS": "5",
            "MODELDEPLOY_GATE_KEY": self.gate_key,
            **(env or {}),
        }
        argv = [
            sys.executable,
            "-m",
            "modeldeploy",
            "operator",
            "--namespace",
            self.namespace,
            "--standalone",
            "--bind",
            "127.0.0.1",
            "--metrics-port",
            str(self.metrics_port),
            "--health-port",
            str(self.health_port),
        ]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited within 20 s."""
        try:
            self.kill(signal.SIGTERM)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:]) if self.log.exists() else ""
