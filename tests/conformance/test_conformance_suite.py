"""The conformance suite itself: it must fail a server that breaks the contract, pass ours
(see test_server_contract.py), stay torch-free, and behave as a CLI."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from modeldeploy.conformance import ConformanceConfig, run_conformance
from modeldeploy_dev.wait import wait_until


def _sloppy_app() -> Starlette:
    """An 'OpenAI-compatible' server with typical defects: ignores unknown fields and models,
    miscounts usage, streams without [DONE] and repeats finish_reason, has no metrics."""

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [{"id": "sloppy", "object": "model"}]})

    async def completions(request: Request):
        body = await request.json()
        if body.get("stream"):

            async def gen():
                for piece in ("a", "b"):
                    yield (
                        "data: "
                        + json.dumps(
                            {
                                "id": "x",
                                "object": "text_completion",
                                "created": 1,
                                "model": "sloppy",
                                "choices": [{"index": 0, "text": piece, "finish_reason": "length"}],
                            }
                        )
                        + "\n\n"
                    )

            return StreamingResponse(gen(), media_type="text/event-stream")
        return JSONResponse(
            {
                "id": "x",
                "object": "text_completion",
                "created": 1,
                "model": "sloppy",
                "choices": [{"index": 0, "text": "ab", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 9},
            }
        )

    async def chat(request: Request):
        body = await request.json()
        if body.get("stream"):

            async def gen():
                for piece in ("a", "b"):
                    yield (
                        "data: "
                        + json.dumps(
                            {
                                "id": piece,
                                "object": "chat.completion.chunk",
                                "created": 1,
                                "model": "sloppy",
                                "choices": [
                                    {"index": 0, "delta": {"content": piece}, "finish_reason": "stop"}
                                ],
                            }
                        )
                        + "\n\n"
                    )

            return StreamingResponse(gen(), media_type="text/event-stream")
        return JSONResponse(
            {
                "id": "y",
                "object": "chat.completion",
                "created": 1,
                "model": "sloppy",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "ab"}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
            }
        )

    async def ready(request: Request):
        return JSONResponse({"status": "ready"})

    return Starlette(
        routes=[
            Route("/v1/models", models),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/health/ready", ready),
        ]
    )


@pytest.fixture(scope="module")
def sloppy_url():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(_sloppy_app(), log_level="warning"))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    wait_until(lambda: server.started, 30, 0.02, "uvicorn to start")
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    t.join(10)


def test_suite_fails_a_sloppy_server(sloppy_url, tmp_path):
    report = run_conformance(ConformanceConfig(url=sloppy_url, requests=4, concurrency=2))
    verdicts = {c.name: c for c in report.checks}
    assert not report.passed
    assert verdicts["normal_response"].verdict == "fail"  # total_tokens != prompt + completion
    assert any("total_tokens" in f for f in verdicts["normal_response"].failures)
    assert verdicts["streaming"].verdict == "fail"
    assert any("[DONE]" in f for f in verdicts["streaming"].failures)
    assert verdicts["error_handling"].verdict == "fail"  # unknown field and model accepted
    assert any("unsupported_parameter" in f for f in verdicts["error_handling"].failures)
    assert any("unknown_model" in f for f in verdicts["error_handling"].failures)
    assert verdicts["readiness"].verdict == "skip"  # no /health/live
    assert any("no modeldeploy_* metrics" in c for c in report.caveats)
    assert report.bundle is None
    out = tmp_path / "ev.json"
    report.write(out)
    rec = json.loads(out.read_text())
    assert rec["passed"] is False and rec["config"]["model"] == "sloppy"


def test_cli_exit_codes(sloppy_url, tmp_path):
    out = tmp_path / "ev.json"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "modeldeploy",
            "conformance",
            sloppy_url,
            "--json",
            str(out),
            "--requests",
            "2",
            "--concurrency",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 1, p.stdout + p.stderr
    assert "FAIL" in p.stdout and json.loads(out.read_text())["passed"] is False
    p = subprocess.run(
        [sys.executable, "-m", "modeldeploy", "conformance", "localhost:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "http://" in p.stderr
    p = subprocess.run(
        [sys.executable, "-m", "modeldeploy", "conformance", "http://127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "cannot reach" in p.stderr


def test_conformance_never_imports_torch_or_the_engine():
    code = (
        "import sys, modeldeploy.conformance, modeldeploy.conformance.cli; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'fastapi') "
        "or m.startswith('modeldeploy.runtime')]; print(bad); sys.exit(1 if bad else 0)"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


def test_bounded_load_names_its_transport_errors() -> None:
    """A status 0 under load is named (the gate's message said only `{0: 1}` when a cold CI run's
    demo failed, which left a timeout and a dropped connection indistinguishable)."""
    from modeldeploy.conformance.http import Server
    from modeldeploy.conformance.load import bounded_load
    from modeldeploy.conformance.result import Target

    mute = socket.create_server(("127.0.0.1", 0))  # accepts (the backlog), never answers
    try:
        server = Server(f"http://127.0.0.1:{mute.getsockname()[1]}", timeout_s=0.5)
        res = bounded_load(Target(server, "m"), n=2, c=2)
        assert res.observations["statuses"] == {0: 2}
        assert res.observations["transport_errors"] == {"ReadTimeout": 2}
        assert not res.ok
        assert any("transport errors: {'ReadTimeout': 2}, request timeout 0.5 s" in f for f in res.failures)
        server.close()
    finally:
        mute.close()


def test_bounded_load_waits_for_a_queued_request_as_long_as_the_queue_ahead_of_it() -> None:
    """With a limit of 1 and 3 workers, a request can wait behind two others: its timeout is 3x
    the client's. Three cold CI runs' demos failed the slow bundle (one sequence at a time) in
    the gate with ReadTimeouts at 30 s, which a correct, merely slow server gives on a busy node.
    The mute server still fails, only later."""
    from modeldeploy.conformance.http import Server
    from modeldeploy.conformance.load import bounded_load
    from modeldeploy.conformance.result import Target

    mute = socket.create_server(("127.0.0.1", 0))
    try:
        server = Server(f"http://127.0.0.1:{mute.getsockname()[1]}", timeout_s=0.2)
        t0 = time.monotonic()
        res = bounded_load(Target(server, "m", limit=1), n=3, c=3)
        assert res.observations["request_timeout_s"] == pytest.approx(0.6)
        assert time.monotonic() - t0 >= 0.6
        assert res.observations["transport_errors"] == {"ReadTimeout": 3} and not res.ok
        assert any("request timeout 0.6 s" in f for f in res.failures)
        res = bounded_load(Target(server, "m", limit=4), n=2, c=2)  # no queue: the client's own
        assert res.observations["request_timeout_s"] == pytest.approx(0.2)
        server.close()
    finally:
        mute.close()
