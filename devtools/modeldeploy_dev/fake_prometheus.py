"""A Prometheus HTTP API stand-in for rollouts on kwok pods, which serve no metrics.

kwok's simulated GPU pods become Ready but run nothing, so neither the operator's pod scrape
nor a real Prometheus has figures for them. This answers `/api/v1/query` the way Prometheus
would answer the operator's default queries (operator/analysis/promql.py) over such pods: per bundle
(the `bundle="..."` matcher of each query), window increases of the TTFT and inter-token
histograms and of the finished requests by outcome. A bundle in `slow` has its TTFT spread up
to 5 s, the others answer under 0.1 s, so the operator's real Prometheus source and analysis
pass a good canary and fail a slow one. The figures are synthetic; what is under test is the
operator's decisions (capacity, steps, promotion, rollback) on a real API server and scheduler.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from modeldeploy.conformance.measures import ITL, REQUESTS, TTFT

_BUNDLE = re.compile(r'bundle="([^"]+)"')


class FakePrometheus:
    """Answers /api/v1/query on 127.0.0.1 (the operator runs on this machine); `samples` requests per
    window and cohort; `slow`: bundle ids whose TTFT is slow. Counts every query it answered."""

    def __init__(self, samples: int = 100) -> None:
        self.samples, self.slow, self.queries = samples, set[str](), 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                q = parse_qs(urlparse(self.path).query).get("query", [""])[0]
                body = json.dumps(owner.answer(q)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, query: str) -> dict:
        self.queries += 1
        m = _BUNDLE.search(query)
        bundle, n = (m.group(1) if m else ""), self.samples
        if query.startswith("max(timestamp("):  # promql.FRESHNESS: every series was scraped just now
            now = time.time()
            return {
                "status": "success",
                "data": {"resultType": "vector", "result": [{"metric": {}, "value": [now, str(now)]}]},
            }
        if TTFT in query or ITL in query:
            fast = 0 if (TTFT in query and bundle in self.slow) else n
            series = [({"le": "0.1"}, fast), ({"le": "5.0"}, n), ({"le": "+Inf"}, n)]
        elif REQUESTS in query:
            series = [
                ({"outcome": o}, n if o == "completed" else 0) for o in ("completed", "error", "rejected")
            ]
        else:
            return {"status": "error", "errorType": "bad_data", "error": f"unknown query {query!r}"}
        result = [{"metric": labels, "value": [0, str(v)]} for labels, v in series]
        return {"status": "success", "data": {"resultType": "vector", "result": result}}

    def __enter__(self) -> FakePrometheus:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
