"""Per-request evidence: OTLP traces, x-request-id / bundle headers, JSON logs.

A small OTLP/HTTP receiver (protobuf, opentelemetry-proto) stands in for a collector: the real
runtime server (real uvicorn, tiny model) exports to it because OTEL_EXPORTER_OTLP_ENDPOINT
points there. One slot and no queue: a long stream holds the slot, a second request gets 429,
the stream is then cancelled by closing its connection, and a last streamed request carries a
W3C traceparent that its server span must continue.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("opentelemetry.proto", reason="opentelemetry-proto not installed")
pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk not installed (modeldeploy[runtime])")

from modeldeploy.runtime import AsyncEngine, EngineConfig  # noqa: E402
from modeldeploy.runtime.server.config import ServerConfig  # noqa: E402
from modeldeploy.runtime.server.evidence import EvidenceMiddleware  # noqa: E402
from modeldeploy_dev.harness import ThreadedServer  # noqa: E402
from modeldeploy_dev.otlp import Receiver  # noqa: E402

BUNDLE = "bundle-traced"
PARENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"


class PacedEngine(AsyncEngine):
    """The real engine with every step 20 ms longer: a stream holds its slot long enough for the
    next request to find no room, and a drain times out on it, however fast the tiny model is."""

    async def start(self, progress: Any = lambda p, f: None) -> None:
        await super().start(progress)
        step = self.engine.step

        def slow_step() -> Any:
            time.sleep(0.02)
            return step()

        self.engine.step = slow_step  # the step thread looks the method up on every step


class BrokenEngine(AsyncEngine):
    """The real engine whose generation fails: the server answers 500."""

    async def generate(self, request_id: str, prompt: Any, params: Any) -> AsyncIterator[Any]:
        raise RuntimeError("engine exploded")
        yield  # an async generator


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(json.loads(record.getMessage()))


@pytest.fixture
def traced(
    llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[ThreadedServer, Receiver, Lines]]:
    rx = Receiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rx.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    lines = Lines()
    logger = logging.getLogger("modeldeploy.request")
    logger.addHandler(lines)
    ecfg = EngineConfig(
        model=str(llama_dir),
        device="cpu",
        dtype="float32",
        max_num_seqs=1,
        max_num_batched_tokens=8,  # prompts longer than 8 tokens prefill in chunks
        bundle_id=BUNDLE,
    )
    try:
        with ThreadedServer(
            ServerConfig(engine=ecfg, served_model_name="tiny", max_queue=0), PacedEngine(ecfg)
        ) as s:
            yield s, rx, lines
    finally:
        logger.removeHandler(lines)
        rx.stop()


def by_request(rx: Receiver, rid: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    [root] = [s for s in rx.spans if s["attrs"].get("modeldeploy.request_id") == rid]
    children = [s for s in rx.spans if s["parent"] == root["span_id"]]
    return root, children


def test_streamed_cancelled_and_rejected_requests_are_traced(
    traced: tuple[ThreadedServer, Receiver, Lines],
) -> None:
    server, rx, lines = traced
    long = {
        "model": "tiny",
        "prompt": "hold the slot",
        "max_tokens": 200,  # 4 s at the paced rate
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.Client(base_url=server.url, timeout=60) as c:
        with c.stream("POST", "/v1/completions", json=long, headers={"x-request-id": "req-cancel"}) as r:
            assert r.status_code == 200 and r.headers["x-request-id"] == "req-cancel"
            assert r.headers["x-modeldeploy-bundle"] == BUNDLE
            lines_in = r.iter_lines()  # kept: a dropped iterator would close the stream
            next(lines_in)  # generating: the only slot is taken
            refused = httpx.post(
                server.url + "/v1/completions",
                json={"model": "tiny", "prompt": "no room", "max_tokens": 4},
                headers={"x-request-id": "req-429"},
            )
            assert refused.status_code == 429 and refused.headers["x-request-id"] == "req-429"
            assert refused.headers["x-modeldeploy-bundle"] == BUNDLE
        # leaving the block closed the connection mid-stream: the server cancels the sequence
        traceparent = f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"
        prompt = "a paged KV cache stores the keys and values of every token in fixed-size blocks"
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 12, "ignore_eos": True, "stream": True}
        server._wait(lambda: server.ctx.admission.running == 0, 30, "cancelled request released its slot")
        with c.stream(
            "POST",
            "/v1/completions",
            json=body,
            headers={"x-request-id": "req-ok", "traceparent": traceparent},
        ) as r:
            assert r.status_code == 200
            chunks = [line for line in r.iter_lines() if line.startswith("data: {")]
        generated = httpx.post(
            server.url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2}
        )
        assert len(generated.headers["x-request-id"]) == 32  # none given: a fresh one
    want = {"req-cancel", "req-429", "req-ok"}
    rx.wait_for(lambda: want <= {s["attrs"].get("modeldeploy.request_id") for s in rx.spans})

    root, kids = by_request(rx, "req-ok")
    assert root["name"] == "POST /v1/completions" and root["kind"] == 2  # SPAN_KIND_SERVER
    assert root["trace_id"] == PARENT_TRACE and root["parent"] == PARENT_SPAN  # the caller's trace continues
    assert (
        root["attrs"]["modeldeploy.bundle"] == BUNDLE and root["attrs"]["modeldeploy.outcome"] == "completed"
    )
    assert root["attrs"]["http.response.status_code"] == 200
    assert root["attrs"]["modeldeploy.response_id"].startswith("cmpl-")
    assert root["resource"]["service.name"] == "modeldeploy-runtime" and root["resource"]["bundle"] == BUNDLE
    spans = {s["name"]: s for s in kids}
    assert sorted(spans) == ["decode", "prefill", "queue"]
    assert all(s["trace_id"] == PARENT_TRACE for s in kids)
    assert (
        spans["decode"]["attrs"]["modeldeploy.tokens"] == 12 == root["attrs"]["modeldeploy.completion_tokens"]
    )
    assert chunks  # streamed (text chunks: the detokenizer may join tokens)
    n_prompt = root["attrs"]["modeldeploy.prompt_tokens"]
    assert spans["prefill"]["attrs"]["modeldeploy.prompt_tokens"] == n_prompt > 8
    assert spans["prefill"]["attrs"]["modeldeploy.prefill_chunks"] == -(-n_prompt // 8)  # 8-token chunks
    assert root["start"] <= spans["queue"]["start"] <= spans["queue"]["end"] <= spans["prefill"]["start"]
    assert spans["prefill"]["end"] <= spans["decode"]["start"] <= spans["decode"]["end"] <= root["end"]

    root, kids = by_request(rx, "req-cancel")
    assert root["attrs"]["modeldeploy.outcome"] == "cancelled" and root["trace_id"] != PARENT_TRACE
    assert root["parent"] == ""  # no traceparent given: a new trace
    [(name, attrs)] = root["events"]
    assert name == "cancelled" and 0 < attrs["completion_tokens"] < long["max_tokens"]
    assert {"queue", "prefill", "decode"} == {s["name"] for s in kids}

    root, kids = by_request(rx, "req-429")
    assert (
        root["attrs"]["http.response.status_code"] == 429
        and root["attrs"]["modeldeploy.outcome"] == "rejected"
    )
    assert [e[0] for e in root["events"]] == ["admission.rejected"] and kids == []

    # one JSON log line per request, with the same ids (written as each request's handling ends,
    # which can be just after its client has the response)
    server._wait(lambda: len(lines.records) >= 4, 30, "four request log lines")
    logged = {r["request_id"]: r for r in lines.records}
    assert want <= set(logged)
    ok = logged["req-ok"]
    assert ok["trace_id"] == PARENT_TRACE and ok["outcome"] == "completed" and ok["status"] == 200
    assert ok["bundle"] == BUNDLE and ok["completion_tokens"] == 12 and ok["ttft_ms"] >= ok["queue_ms"] >= 0
    assert logged["req-429"]["outcome"] == "rejected" and logged["req-cancel"]["outcome"] == "cancelled"
    assert len(lines.records) == 4  # the unnamed request too, and nothing twice


def test_headers_and_log_without_tracing(llama_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    lines = Lines()
    logging.getLogger("modeldeploy.request").addHandler(lines)
    ecfg = EngineConfig(model=str(llama_dir), device="cpu", dtype="float32", max_num_seqs=2, bundle_id=BUNDLE)
    try:
        with ThreadedServer(ServerConfig(engine=ecfg, served_model_name="tiny", api_key="k")) as s:
            with s.client() as c:
                health = c.get("/health/ready")
                assert health.headers["x-modeldeploy-bundle"] == BUNDLE and health.headers["x-request-id"]
                denied = c.get("/v1/models", headers={"x-request-id": "mine"})
                assert denied.status_code == 401 and denied.headers["x-request-id"] == "mine"
                bad = c.get("/v1/models", headers={"x-request-id": "bad id with spaces"})
                assert bad.status_code == 400 and "x-request-id" in bad.json()["error"]["message"]
                ok = c.post(
                    "/v1/completions",
                    json={"model": "tiny", "prompt": "hi", "max_tokens": 3},
                    headers={"authorization": "Bearer k", "x-request-id": "plain"},
                )
                assert ok.status_code == 200 and ok.headers["x-request-id"] == "plain"
            [mw] = [m for m in s.app.user_middleware if m.cls is EvidenceMiddleware]
            assert mw.kwargs["tracing"] is None  # nothing exported, no span built
    finally:
        logging.getLogger("modeldeploy.request").removeHandler(lines)
    logged = {r["request_id"]: r for r in lines.records}
    assert logged["mine"]["status"] == 401 and logged["mine"]["outcome"] == "invalid"
    assert logged["plain"]["outcome"] == "completed" and logged["plain"]["trace_id"] is None


def test_a_500_carries_the_headers_too(llama_dir: Path) -> None:
    ecfg = EngineConfig(model=str(llama_dir), device="cpu", dtype="float32", max_num_seqs=2, bundle_id=BUNDLE)
    with ThreadedServer(ServerConfig(engine=ecfg, served_model_name="tiny"), BrokenEngine(ecfg)) as s:
        r = httpx.post(
            s.url + "/v1/completions",
            json={"model": "tiny", "prompt": "hi", "max_tokens": 3},
            headers={"x-request-id": "boom"},
            timeout=30,
        )
    assert r.status_code == 500 and r.headers["x-request-id"] == "boom"
    assert r.headers["x-modeldeploy-bundle"] == BUNDLE
    assert "RuntimeError: engine exploded" in r.json()["error"]["message"]


def test_a_drain_abort_is_an_event_and_an_error(llama_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rx = Receiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rx.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    ecfg = EngineConfig(model=str(llama_dir), device="cpu", dtype="float32", max_num_seqs=2, bundle_id=BUNDLE)
    engine = PacedEngine(ecfg)
    cfg = ServerConfig(engine=ecfg, served_model_name="tiny", drain_timeout_s=0.3)
    try:
        with ThreadedServer(cfg, engine) as s, httpx.Client(base_url=s.url, timeout=60) as c:
            body = {"model": "tiny", "prompt": "long", "max_tokens": 200, "ignore_eos": True, "stream": True}
            with c.stream("POST", "/v1/completions", json=body, headers={"x-request-id": "req-drain"}) as r:
                lines_in = r.iter_lines()
                next(lines_in)
                drained = asyncio.run_coroutine_threadsafe(s.ctx.drain(), engine._loop)
                assert drained.result(30) is False  # the stream outlived the drain timeout: aborted
                list(lines_in)  # the stream ends early
        rx.wait_for(lambda: any(sp["attrs"].get("modeldeploy.request_id") == "req-drain" for sp in rx.spans))
    finally:
        rx.stop()
    root, _ = by_request(rx, "req-drain")
    assert root["attrs"]["modeldeploy.outcome"] == "error" and root["status"] == 2  # STATUS_CODE_ERROR
    assert [e[0] for e in root["events"]] == ["drain_abort"]
    assert 0 < root["events"][0][1]["completion_tokens"] < 200


def test_the_adapter_a_request_names_is_on_its_span_and_log_line(
    llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from modeldeploy.digest import dir_digest
    from modeldeploy_dev.lora_fixtures import make_adapters

    adapters = make_adapters(llama_dir, tmp_path)
    name = sorted(adapters)[0]
    pins = [
        {"name": n, "path": str(p), "digest": dir_digest(p), "revision": "r1"} for n, p in adapters.items()
    ]
    rx = Receiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rx.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    lines = Lines()
    logging.getLogger("modeldeploy.request").addHandler(lines)
    ecfg = EngineConfig(model=str(llama_dir), device="cpu", dtype="float32", bundle_id=BUNDLE, adapters=pins)
    try:
        with ThreadedServer(ServerConfig(engine=ecfg, served_model_name="tiny")) as s:
            for model, rid in ((name, "req-adapter"), ("tiny", "req-base")):
                body = {"model": model, "prompt": "hi", "max_tokens": 3}
                r = httpx.post(
                    s.url + "/v1/completions", json=body, headers={"x-request-id": rid}, timeout=60
                )
                assert r.status_code == 200, r.text
        rx.wait_for(
            lambda: (
                {"req-adapter", "req-base"} <= {sp["attrs"].get("modeldeploy.request_id") for sp in rx.spans}
            )
        )
    finally:
        logging.getLogger("modeldeploy.request").removeHandler(lines)
        rx.stop()
    assert by_request(rx, "req-adapter")[0]["attrs"]["modeldeploy.adapter"] == name
    assert "modeldeploy.adapter" not in by_request(rx, "req-base")[0]["attrs"]
    logged = {r["request_id"]: r for r in lines.records}
    assert logged["req-adapter"]["adapter"] == name and logged["req-base"]["adapter"] is None
