"""A small OTLP/HTTP trace receiver (protobuf, opentelemetry-proto) for tests and benchmarks.

It stands in for an OpenTelemetry collector: POST /v1/traces with an ExportTraceServiceRequest,
decoded into plain span dicts. `python -m modeldeploy_dev.otlp PORT` runs it in its own process
(the tracing benchmark keeps the receiver's work off the measured server's CPU time).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb

from modeldeploy_dev.wait import wait_until


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class Receiver:
    def __init__(self, port: int = 0) -> None:
        self.spans: list[dict[str, Any]] = []
        self.requests = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                ok = self.path == "/v1/traces" and self.headers["Content-Type"] == "application/x-protobuf"
                if ok:
                    receiver.add(pb.ExportTraceServiceRequest.FromString(body))
                out = pb.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if ok else 400)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_port}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def add(self, req: Any) -> None:
        self.requests += 1
        for rs in req.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    self.spans.append(
                        {
                            "name": s.name,
                            "trace_id": s.trace_id.hex(),
                            "span_id": s.span_id.hex(),
                            "parent": s.parent_span_id.hex(),
                            "kind": s.kind,
                            "start": s.start_time_unix_nano,
                            "end": s.end_time_unix_nano,
                            "attrs": {a.key: _value(a.value) for a in s.attributes},
                            "events": [
                                (e.name, {a.key: _value(a.value) for a in e.attributes}) for e in s.events
                            ],
                            "status": s.status.code,
                            "resource": resource,
                        }
                    )

    def wait_for(self, pred: Callable[[], bool], timeout_s: float = 30) -> None:
        try:
            wait_until(pred, timeout_s, 0.05, "the spans")
        except TimeoutError as e:
            raise TimeoutError(f"spans received: {[(s['name'], s['attrs']) for s in self.spans]}") from e

    def stop(self) -> None:
        self.http.shutdown()


if __name__ == "__main__":
    r = Receiver(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    print(r.url, flush=True)
    while True:
        time.sleep(3600)
