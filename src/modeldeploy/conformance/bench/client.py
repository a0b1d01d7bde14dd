"""One streamed request and what the client saw of it.

Times are the client's monotonic clock from the moment the request was sent. A token is a
streamed chunk carrying text (OpenAI streams carry no per-chunk token count; a server may
pack several tokens into one chunk, so ITL gaps are per chunk, as in vLLM's `bench serve`).
TPOT is (e2e - TTFT) / (output tokens - 1) with the output count from `usage` when the server
sends it (chunks otherwise, and the record says so).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from modeldeploy.conformance.bench.checks import run_check
from modeldeploy.conformance.bench.workload import Item
from modeldeploy.conformance.measures import outcome_of_status


@dataclass
class Settings:
    """What every request of a run shares."""

    model: str
    endpoint: str = "completions"  # completions | chat | responses
    ignore_eos: bool = False
    temperature: float = 0.0
    timeout_s: float = 120.0


@dataclass
class Record:
    """One request's figures (seconds; None where the request never got that far)."""

    index: int
    shape: str
    scheduled_s: float  # intended send offset within the rate
    sent_s: float = 0.0  # actual send offset (lag = sent_s - scheduled_s is client overhead)
    status: int = 0  # HTTP status; 0 = transport failure or timeout
    outcome: str = "error"  # completed | cancelled | invalid | rejected | error (measures.outcome_of_status)
    error: str | None = None
    cancelled: bool = False
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    tpot: float | None = None
    e2e: float | None = None  # to the stream's end; for a non-200, to its error body
    cancel_s: float | None = None  # offset (from send) at which the client cancelled
    chunks: int = 0
    prompt_tokens: int | None = None  # from usage
    output_tokens: int | None = None  # from usage, else chunks
    tokens_from: str = "usage"
    finish_reason: str | None = None
    max_tokens: int | None = None
    good: bool = False  # completed, within every per-request SLO and passing its check (set by stats)
    check_passed: bool | None = None  # the item's output check on the completed output (None: no check)
    check_error: str | None = None  # why it failed

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["itl"] = [round(x, 6) for x in self.itl]
        return d


PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions", "responses": "/v1/responses"}


def body(item: Item, s: Settings) -> dict[str, Any]:
    b: dict[str, Any] = {"model": s.model, "stream": True, "temperature": s.temperature}
    if s.endpoint != "responses":  # the Responses API always reports usage, in response.completed
        b["stream_options"] = {"include_usage": True}
    if item.output_tokens is not None:
        b["max_output_tokens" if s.endpoint == "responses" else "max_tokens"] = item.output_tokens
    if s.ignore_eos:
        b["ignore_eos"] = True
    if item.response_format is not None and s.endpoint != "responses":
        b["response_format"] = item.response_format
    if s.endpoint == "responses":
        b["input"] = item.messages or [{"role": "user", "content": item.prompt}]
    elif s.endpoint == "chat":
        b["messages"] = item.messages or [{"role": "user", "content": item.prompt}]
    else:
        b["prompt"] = item.prompt
    return b


def _text_of(chunk: dict[str, Any]) -> str:
    if chunk.get("type") == "response.output_text.delta":
        return chunk.get("delta") or ""
    for c in chunk.get("choices") or []:
        if c.get("text"):
            return c["text"]
        delta = c.get("delta") or {}
        if delta.get("content"):
            return delta["content"]
    return ""


def _finish_of(chunk: dict[str, Any]) -> str | None:
    if chunk.get("type") == "response.completed":
        return (chunk.get("response") or {}).get("status")
    for c in chunk.get("choices") or []:
        if c.get("finish_reason"):
            return c["finish_reason"]
    return None


async def send(
    client: httpx.AsyncClient,
    item: Item,
    s: Settings,
    index: int,
    scheduled_s: float,
    t0: float,
    cancel: bool,
) -> Record:
    """Send one streamed request; with `cancel`, close the stream right after the first token."""
    path = PATHS[s.endpoint]
    rec = Record(index, item.shape, scheduled_s, max_tokens=item.output_tokens)
    start = time.monotonic()
    rec.sent_s = start - t0
    last: float | None = None
    text: list[str] = []
    try:
        async with client.stream("POST", path, json=body(item, s), timeout=s.timeout_s) as r:
            rec.status = r.status_code
            if r.status_code != 200:
                raw = (await r.aread()).decode(errors="replace")
                rec.error = _error_message(raw)
                rec.outcome = outcome_of_status(r.status_code)
                rec.e2e = time.monotonic() - start  # a refusal's latency (the 429-within-50-ms check)
                return rec
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.monotonic()
                chunk = json.loads(data)
                usage = chunk.get("usage") or (chunk.get("response") or {}).get("usage")
                if usage:  # chat/completions name them prompt/completion, responses input/output
                    rec.prompt_tokens = usage.get("prompt_tokens", usage.get("input_tokens"))
                    rec.output_tokens = usage.get("completion_tokens", usage.get("output_tokens"))
                rec.finish_reason = _finish_of(chunk) or rec.finish_reason
                piece = _text_of(chunk)
                if not piece:
                    continue
                text.append(piece)
                rec.chunks += 1
                if last is None:
                    rec.ttft = now - start
                else:
                    rec.itl.append(now - last)
                last = now
                if cancel:
                    rec.cancelled = True
                    rec.cancel_s = time.monotonic() - start
                    break  # leaving the `async with` closes the connection: the server sees a disconnect
        rec.e2e = time.monotonic() - start  # to the end of the stream ([DONE]), or to the cancel
        if rec.cancelled:
            rec.outcome = "cancelled"
        elif rec.chunks == 0 and rec.finish_reason is None:
            rec.outcome, rec.error = "error", "stream ended without any chunk"
        else:
            rec.outcome = "completed"
    except httpx.TimeoutException:
        rec.status, rec.outcome, rec.error = 0, "error", f"timed out after {s.timeout_s}s"
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        rec.status, rec.outcome, rec.error = rec.status or 0, "error", f"{type(e).__name__}: {e}"[:300]
    return _finish(rec, item, "".join(text))


def _finish(rec: Record, item: Item, text: str) -> Record:
    """Token count, TPOT and the item's output check, once the stream is over."""
    if rec.output_tokens is None:
        rec.output_tokens, rec.tokens_from = rec.chunks, "chunks"
    if rec.outcome == "completed" and rec.ttft is not None and rec.e2e is not None and rec.output_tokens > 1:
        rec.tpot = (rec.e2e - rec.ttft) / (rec.output_tokens - 1)
    if item.check is not None and rec.outcome == "completed":
        rec.check_passed, rec.check_error = run_check(item.check, text)
    return rec


def _error_message(raw: str) -> str:
    try:
        err = json.loads(raw).get("error")
        if isinstance(err, dict):
            return str(err.get("message", raw))[:300]
    except (ValueError, AttributeError):
        pass
    return raw[:300]
