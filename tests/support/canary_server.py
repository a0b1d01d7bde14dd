"""A real runtime server on loopback, in a thread, for the canary analysis and dashboard tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from modeldeploy_dev.wait import wait_until

BUNDLE = "bundle-canary-io-1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    """One `modeldeploy serve` process; restart() keeps the address, like a restarted pod."""

    def __init__(self, tmp: Path, model: Path, *flags: str, bundle: str = BUNDLE) -> None:
        self.tmp, self.model, self.port, self.bundle = tmp, model, _free_port(), bundle
        self.target, self.url = f"127.0.0.1:{self.port}", f"http://127.0.0.1:{self.port}"
        self.flags: tuple[str, ...] = ()
        self.spawn(*flags)

    def spawn(self, *flags: str) -> None:
        self.flags = flags
        log = open(self.tmp / f"serve-{self.port}-{time.monotonic_ns()}.log", "w")
        cmd = [
            sys.executable,
            "-m",
            "modeldeploy",
            "serve",
            "--model",
            str(self.model),
            "--port",
            str(self.port),
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--served-model-name",
            "tiny",
            "--bundle-id",
            self.bundle,
            "--log-level",
            "warning",
            *(flags or ("--max-num-seqs", "4")),
        ]
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        def ready() -> bool:
            assert self.proc.poll() is None, f"serve exited with {self.proc.returncode}; logs in {self.tmp}"
            return httpx.get(self.url + "/health/ready", timeout=2).status_code == 200

        wait_until(ready, timeout_s, 0.2, f"{self.url} ready", ignore=(httpx.TransportError,))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def restart(self, *flags: str) -> None:
        self.stop()
        self.spawn(*flags)
        self.wait_ready()

    def complete(
        self, n: int, headers: dict | None = None, workers: int = 1, max_tokens: int = 4
    ) -> list[int]:
        """n completions from `workers` concurrent clients (bounded: n requests, 120 s each)."""

        def one(i: int) -> int:
            with httpx.Client(base_url=self.url, timeout=120, headers=headers or {}) as c:
                return c.post(
                    "/v1/completions",
                    json={
                        "model": "tiny",
                        "prompt": f"hello {i}",
                        "max_tokens": max_tokens,
                        "temperature": 0,
                    },
                ).status_code

        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(one, range(n)))
