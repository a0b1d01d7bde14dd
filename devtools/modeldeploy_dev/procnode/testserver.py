"""A tiny workload for testing the process node (`modeldeploy cluster testserver`).

It behaves like a serving pod without loading a model: /health/live is 200, /health/ready is
503 until --ready-after seconds have passed, / echoes the pod's identity, /file returns the
contents of --file (to check volume mapping). SIGTERM is logged and ends the process, unless
--ignore-sigterm (to check the SIGKILL after the grace period). --exit-after makes it exit with
--exit-code (to check restartPolicy).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--ready-after", type=float, default=0.0, help="seconds of 503 on /health/ready")
    p.add_argument("--exit-after", type=float, default=None, help="exit after this many seconds")
    p.add_argument("--exit-code", type=int, default=0)
    p.add_argument("--file", default=None, help="file served at /file")
    p.add_argument("--ignore-sigterm", action="store_true")


def main(a: argparse.Namespace) -> int:
    t0 = time.monotonic()

    class H(BaseHTTPRequestHandler):
        def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server API
            if self.path == "/health/live":
                self._send(200, b'{"live":true}')
            elif self.path == "/health/ready":
                ready = time.monotonic() - t0 >= a.ready_after
                self._send(200 if ready else 503, json.dumps({"ready": ready}).encode())
            elif self.path == "/file" and a.file:
                self._send(200, Path(a.file).read_bytes(), "text/plain")
            elif self.path == "/":
                env = {k: os.environ.get(k, "") for k in ("HOSTNAME", "POD_IP", "POD_NAMESPACE", "GREETING")}
                self._send(200, json.dumps({"pid": os.getpid(), "argv": sys.argv, "env": env}).encode())
            else:
                self._send(404, b'{"error":"not found"}')

        def log_message(self, fmt: str, *args: object) -> None:
            print(f"request {fmt % args}", flush=True)

    srv = ThreadingHTTPServer((a.host, a.port), H)

    def on_term(*_: object) -> None:
        print("SIGTERM received" + (" (ignored)" if a.ignore_sigterm else ", shutting down"), flush=True)
        if not a.ignore_sigterm:
            threading.Thread(target=srv.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    if a.exit_after is not None:
        threading.Timer(a.exit_after, lambda: os._exit(a.exit_code)).start()
    print(f"testserver listening on {a.host}:{a.port}", flush=True)
    srv.serve_forever(poll_interval=0.1)
    print("testserver stopped cleanly", flush=True)
    return 0
