"""Per-request evidence: `x-request-id` and bundle headers, one JSON log line, the trace.

The front end answers every response with `x-request-id` (the client's own, echoed, or a new
one) and `x-modeldeploy-bundle`, so a caller can quote exactly which request hit which bundle.
Each /v1/* request then leaves one structured JSON log line (logger `modeldeploy.request`)
with outcome and timings, and, when OTLP export is configured, a trace (tracing.py) with the
same ids. Everything is assembled when the request ends, from timestamps the request already
keeps (admission ticket, the engine's RequestMetrics): nothing runs on the engine step loop.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
import uuid
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

from modeldeploy.runtime.server.errors import APIError
from modeldeploy.runtime.server.metrics import refusal_outcome

REQUEST_ID = "x-request-id"
BUNDLE_HEADER = "x-modeldeploy-bundle"
SCOPE_KEY = "modeldeploy.evidence"
_VALID_ID = re.compile(r"[\x21-\x7e]{1,128}")  # visible ASCII: safe in a header, a log and a span
log = logging.getLogger("modeldeploy.request")


@dataclass
class Evidence:
    """What one request did, filled in as it goes (monotonic times; `wall_ns` converts)."""

    request_id: str
    method: str
    path: str
    headers: dict[str, str]
    arrival: float = field(default_factory=time.monotonic)
    wall0_ns: int = field(default_factory=time.time_ns)
    status: int = 0
    outcome: str | None = None
    response_id: str | None = None
    adapter: str | None = None  # the LoRA adapter the request named (None: the base model)
    admitted: float | None = None  # admission slot acquired
    metrics: Any = None  # the engine's RequestMetrics of the last output seen
    prompt_tokens: int = 0
    completion_tokens: int = 0
    events: list[tuple[str, float, dict[str, Any]]] = field(default_factory=list)
    end: float | None = None
    trace_id: str | None = None

    def wall_ns(self, t: float) -> int:
        return self.wall0_ns + int((t - self.arrival) * 1e9)

    def job_done(self, job: Any, outcome: str) -> None:
        """Called by Job.close: the generation's figures and how it ended."""
        now = time.monotonic()
        self.outcome, self.response_id = outcome, job.rid
        self.adapter = getattr(job, "adapter", None)
        self.admitted = getattr(job.ticket, "acquired_at", None)
        self.prompt_tokens = len(job.prompt)
        if job.last is not None:
            self.metrics = job.last.metrics
            self.completion_tokens = len(job.last.token_ids)
        if outcome == "cancelled":
            self.events.append(("cancelled", now, {"completion_tokens": self.completion_tokens}))
        elif job.server_aborted:
            self.events.append(("drain_abort", now, {"completion_tokens": self.completion_tokens}))
        elif job.refused == "rejected":
            self.events.append(("admission.rejected", now, {"http.response.status_code": self.status or 429}))

    def record(self) -> dict[str, Any]:
        """The JSON log line (milliseconds, rounded)."""
        ms = lambda a, b: None if a is None or b is None else round((b - a) * 1000, 3)  # noqa: E731
        m = self.metrics
        first_sched = getattr(m, "first_scheduled_time", None)
        first_tok = getattr(m, "first_token_time", None)
        return {
            "ts": round(self.wall0_ns / 1e9, 6),
            "request_id": self.request_id,
            "trace_id": self.trace_id,
            "method": self.method,
            "path": self.path,
            "status": self.status,
            "outcome": self.outcome,
            "response_id": self.response_id,
            "adapter": self.adapter,
            "duration_ms": ms(self.arrival, self.end),
            "admission_wait_ms": ms(self.arrival, self.admitted),
            "queue_ms": ms(self.arrival, first_sched),
            "ttft_ms": ms(self.arrival, first_tok),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
        }


def of(request: Any) -> Evidence | None:
    return request.scope.get(SCOPE_KEY)


def _logger() -> logging.Logger:
    """One JSON object per line on stderr, not mixed into uvicorn's format (once per process)."""
    if not any(getattr(h, "_modeldeploy", False) for h in log.handlers):
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("%(message)s"))
        h._modeldeploy = True  # type: ignore[attr-defined]
        log.addHandler(h)
        log.setLevel(logging.INFO)
        log.propagate = False
    return log


class EvidenceMiddleware:
    """Pure ASGI (so it sees the end of a streamed body): headers on every response; log and trace
    per /v1/ request."""

    def __init__(self, app: Any, bundle: str, labels: dict[str, str], tracing: Any = None) -> None:
        self.app, self.bundle, self.labels, self.tracing = app, bundle, labels, tracing
        self.log = _logger()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        given = headers.get(REQUEST_ID)
        rid = given if given is not None else uuid.uuid4().hex
        extra = [(REQUEST_ID.encode(), rid.encode("latin-1")), (BUNDLE_HEADER.encode(), self.bundle.encode())]
        if given is not None and not _VALID_ID.fullmatch(given):
            err = APIError(400, "x-request-id: must be 1-128 visible ASCII characters", param="x-request-id")
            extra[0] = (REQUEST_ID.encode(), uuid.uuid4().hex.encode())
            await self._send_with(err.response(), scope, receive, send, extra)
            return
        ev = Evidence(rid, scope.get("method", ""), scope.get("path", ""), headers)
        scope[SCOPE_KEY] = ev

        async def send_with_headers(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                ev.status = message["status"]
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except Exception as e:  # what the app's crash handler would answer, with our headers on it
            if ev.status:  # the response had started: nothing more can be sent
                raise
            logging.getLogger("modeldeploy.server").exception("internal error on %s", ev.path)
            err = APIError(500, f"internal error: {type(e).__name__}: {e}", code="internal_error")
            await err.response()(scope, receive, send_with_headers)
        finally:
            if ev.path.startswith("/v1/"):
                self.finish(ev)

    async def _send_with(self, response: Any, scope: Any, receive: Any, send: Any, extra: list) -> None:
        async def wrapped(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await response(scope, receive, wrapped)

    def finish(self, ev: Evidence) -> None:
        ev.end = time.monotonic()
        if ev.outcome is None:  # refused before any generation (400, 401, 404, 503...) or a plain GET
            ev.outcome = refusal_outcome(ev.status) if ev.status >= 400 else "completed"
        if self.tracing is not None:
            try:
                ev.trace_id = self.tracing.record(ev, self.labels)
            except Exception:  # noqa: BLE001 - tracing must never fail a request
                logging.getLogger("modeldeploy.server").exception("recording the trace of %s", ev.request_id)
        self.log.info(json.dumps({**ev.record(), "bundle": self.bundle}, separators=(",", ":")))
