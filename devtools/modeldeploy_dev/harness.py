"""Run the real server (real uvicorn, real sockets) on a thread, for tests and benchmarks.

Binds 127.0.0.1 on an ephemeral port chosen by the kernel, so parallel runs never collide.
SIGTERM draining needs the main thread and is exercised through `modeldeploy serve` in a
subprocess instead.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import httpx
import uvicorn

from modeldeploy.runtime.server.app import create_app
from modeldeploy.runtime.server.config import ServerConfig


class ThreadedServer:
    def __init__(
        self, cfg: ServerConfig, engine: Any = None, wait_ready: bool = True, timeout_s: float = 120.0
    ):
        self.app = create_app(cfg, engine)
        self.ctx = self.app.state.ctx
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        self._wait(lambda: self.server.started, timeout_s, "server did not start")
        if wait_ready:
            self._wait(lambda: self.ctx.state.status in ("ready", "failed"), timeout_s, "model did not load")
            if self.ctx.state.status == "failed":
                self.stop()
                raise RuntimeError(f"model failed to load: {self.ctx.state.error}")

    def _wait(self, pred, timeout_s: float, what: str) -> None:
        t0 = time.monotonic()
        while not pred():
            if time.monotonic() - t0 > timeout_s or not self.thread.is_alive():
                raise TimeoutError(f"{what} within {timeout_s}s")
            time.sleep(0.02)

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kw.pop("timeout", 60.0), **kw)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()

    def __enter__(self) -> ThreadedServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
