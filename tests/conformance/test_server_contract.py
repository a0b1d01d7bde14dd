"""The serving contract on a real server (uvicorn on 127.0.0.1, tiny llama made at test time).

The headline scenario: 2 running slots; 1 normal + 1 complete stream + 1
stream cancelled after its first delta + 8 requests from 4 client workers = 11 requests,
of which the metrics must count 10 completed and 1 cancelled.
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from support.server_contract import BUNDLE, _cfg, metrics, outcome

from modeldeploy.conformance import ConformanceConfig, run_conformance
from modeldeploy.conformance.checks import read_stream
from modeldeploy.conformance.http import Server, iter_sse
from modeldeploy.conformance.load import run_load
from modeldeploy.conformance.suite import discover
from modeldeploy_dev.harness import ThreadedServer


@pytest.fixture(scope="module")
def server(llama_dir):
    with ThreadedServer(_cfg(llama_dir, max_queue=8)) as s:
        yield s


def test_contract_eleven_requests(server):
    target, _ = discover(Server(server.url), None)
    assert target.limit == 2 and target.has_metrics and target.model == "tiny"
    before = metrics(server)
    # 1 normal
    r = httpx.post(
        server.url + "/v1/completions",
        json={"model": "tiny", "prompt": "The quick", "max_tokens": 6, "temperature": 0},
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 6
    # 1 complete stream
    rec = read_stream(
        target,
        "/v1/chat/completions",
        {"model": "tiny", "stream": True, "max_tokens": 6, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert rec["status"] == 200 and rec["events"][-1] == "[DONE]" and not rec["hung_up"]
    # 1 stream cancelled after its first delta
    rec = read_stream(
        target,
        "/v1/chat/completions",
        {
            "model": "tiny",
            "stream": True,
            "max_tokens": 400,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": "hi"}],
        },
        stop_after_first_delta=True,
    )
    assert rec["status"] == 200 and rec["hung_up"]
    # 8 requests from 4 workers on 2 slots
    obs = run_load(target, n=8, c=4, max_tokens=24)
    assert obs["statuses"] == {200: 8}
    assert obs["running_max"] <= 2, obs
    assert obs["waiting_max"] >= 1, obs
    after, _ = target.wait_metrics(
        lambda m: (
            outcome(m, "completed") - outcome(before, "completed") >= 10
            and m.get("modeldeploy_requests_running") == 0
        )
    )
    assert outcome(after, "completed") - outcome(before, "completed") == 10
    assert outcome(after, "cancelled") - outcome(before, "cancelled") == 1
    assert outcome(after, "error") == outcome(before, "error")
    assert after.get("modeldeploy_requests_running") == 0 and after.get("modeldeploy_requests_waiting") == 0
    assert server.ctx.admission.max_running_seen <= 2
    stats = server.ctx.engine.stats()
    assert (
        stats.num_running == 0 and stats.num_waiting == 0 and stats.num_free_blocks == stats.num_total_blocks
    )


def test_every_series_carries_the_bundle_label(server):
    m = metrics(server)
    names = {s.name for s in m.samples}
    for n in (
        "modeldeploy_requests_total",
        "modeldeploy_requests_running",
        "modeldeploy_requests_waiting",
        "modeldeploy_time_to_first_token_seconds_bucket",
        "modeldeploy_inter_token_latency_seconds_bucket",
        "modeldeploy_request_latency_seconds_bucket",
        "modeldeploy_queue_time_seconds_bucket",
        "modeldeploy_prompt_tokens_total",
        "modeldeploy_generation_tokens_total",
        "modeldeploy_preemptions_total",
        "modeldeploy_kv_cache_usage_ratio",
        "modeldeploy_model_load_progress",
        "modeldeploy_model_load_seconds",
        "modeldeploy_build_info",
    ):
        assert n in names, n
    for s in m.samples:
        if s.name.startswith("modeldeploy_"):
            assert s.labels.get("bundle") == BUNDLE, s
    info = next(s for s in m.samples if s.name == "modeldeploy_build_info")
    assert info.labels["engine_build"] == "test-build" and info.labels["device"] == "cpu"
    assert info.labels["model_digest"].startswith("sha256:") and info.labels["dtype"] == "float32"
    assert m.get("modeldeploy_model_load_progress") == 1.0 and m.get("modeldeploy_model_load_seconds") > 0


def test_bundle_endpoint_shows_effective_config(server, llama_dir):
    from modeldeploy.digest import dir_digest

    b = httpx.get(server.url + "/v1/bundle").json()
    assert b["bundle_id"] == BUNDLE and b["engine_build"] == "test-build" and b["model"]["revision"] == "r1"
    assert b["model"]["digest"] == dir_digest(llama_dir)
    ec = b["engine_config"]
    assert (
        ec["max_model_len"] == 1024 and ec["num_kv_blocks"] > 0 and ec["block_size"] == 16
    )  # defaults resolved
    assert ec["device"] == "cpu" and ec["dtype"] == "float32" and ec["max_num_seqs"] == 2
    assert b["server"] == {
        "max_num_seqs": 2,
        "max_queue": 8,
        "max_queued_tokens": 0,
        "queue_budget_s": None,
        "drain_timeout_s": 30.0,
        "auth": False,
    }


def test_health_models_and_error_format(server):
    c = server.client()
    assert c.get("/health/live").status_code == 200
    ready = c.get("/health/ready")
    assert ready.status_code == 200 and ready.json()["status"] == "ready" and ready.json()["progress"] == 1.0
    assert c.get("/v1/models").json()["data"][0]["id"] == "tiny"
    r = c.post("/v1/completions", json={"model": "nope", "prompt": "x"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    r = c.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "functions": []},
    )
    assert r.status_code == 400 and r.json()["error"]["message"] == "unsupported parameter: functions"
    r = c.post("/v1/completions", json={"model": "tiny", "prompt": [1, 2, 10**6]})
    assert r.status_code == 400 and "vocabulary" in r.json()["error"]["message"]
    r = c.post("/v1/completions", json={"model": "tiny", "prompt": ""})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    r = c.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 1024})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = c.get("/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    r = c.get("/v1/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_token_id_prompt_equals_text_prompt(server):
    c = server.client()
    text = c.post(
        "/v1/completions",
        json={"model": "tiny", "prompt": "Kubernetes schedules", "max_tokens": 5, "temperature": 0},
    ).json()
    ids = server.ctx.engine.tokenizer("Kubernetes schedules")["input_ids"]
    by_ids = c.post(
        "/v1/completions", json={"model": "tiny", "prompt": ids, "max_tokens": 5, "temperature": 0}
    ).json()
    assert by_ids["choices"][0]["text"] == text["choices"][0]["text"]
    assert by_ids["usage"] == text["usage"]


def test_responses_api_stream_event_order(server):
    c = server.client()
    body = {
        "model": "tiny",
        "input": [{"role": "user", "content": "hello"}],
        "max_output_tokens": 5,
        "temperature": 0,
    }
    full = c.post("/v1/responses", json=body).json()
    assert full["object"] == "response" and full["output"][0]["role"] == "assistant"
    assert full["usage"]["output_tokens"] == 5 or full["status"] == "completed"
    with c.stream("POST", "/v1/responses", json=body | {"stream": True}) as r:
        events = list(iter_sse(r.iter_lines()))
    kinds = [e.event for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert all(e.json()["type"] == e.event for e in events)
    assert [e.json()["sequence_number"] for e in events] == list(range(len(events)))
    deltas = "".join(e.json()["delta"] for e in events if e.event == "response.output_text.delta")
    final = events[-1].json()["response"]
    assert deltas == final["output"][0]["content"][0]["text"] == full["output"][0]["content"][0]["text"]
    assert final["usage"] == full["usage"] and final["usage"]["input_tokens"] > 0


def test_full_conformance_suite_passes(server, tmp_path):
    report = run_conformance(
        ConformanceConfig(url=server.url, requests=8, concurrency=4, expect_bundle=BUNDLE)
    )
    out = tmp_path / "evidence.json"
    report.write(out)
    assert report.passed, report.table()
    rec = json.loads(out.read_text())
    assert rec["bundle"]["bundle_id"] == BUNDLE and {c["name"] for c in rec["checks"]} >= {
        "bundle_identity",
        "streaming",
        "cancellation",
        "bounded_load",
        "error_handling",
    }
    load = next(c for c in rec["checks"] if c["name"] == "bounded_load")["observations"]
    assert load["running_max"] <= 2 and load["waiting_max"] >= 1


def test_wrong_bundle_fails_the_identity_check(server):
    from modeldeploy.conformance.suite import CHECKS

    others = [c for c in CHECKS if c != "bundle_identity"]
    report = run_conformance(
        ConformanceConfig(url=server.url, expect_bundle="some-other-bundle", skip=others)
    )
    assert not report.passed and [c.name for c in report.checks] == ["bundle_identity"]
    assert report.checks[0].observations["metric_bundle_labels"] == [BUNDLE]


def test_queue_full_is_429_with_retry_after(llama_dir):
    with ThreadedServer(_cfg(llama_dir, max_num_seqs=1, max_queue=0)) as s:
        body = {"model": "tiny", "prompt": "x", "max_tokens": 300, "ignore_eos": True, "stream": True}
        started = threading.Event()

        def long_stream():
            with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=60) as r:
                for _ in r.iter_lines():
                    started.set()

        t = threading.Thread(target=long_stream)
        t.start()
        assert started.wait(30)
        r = httpx.post(
            s.url + "/v1/completions", json={"model": "tiny", "prompt": "y", "max_tokens": 2}, timeout=30
        )
        t.join(60)
        assert r.status_code == 429 and r.headers["Retry-After"] == "1"
        assert r.json()["error"]["type"] == "rate_limit_error"
        assert outcome(metrics(s), "rejected") == 1 and outcome(metrics(s), "completed") == 1


def test_api_key_guards_v1_only(llama_dir):
    with ThreadedServer(_cfg(llama_dir, api_key="s3cret")) as s:
        c = s.client()
        assert c.get("/health/ready").status_code == 200 and c.get("/metrics").status_code == 200
        r = c.get("/v1/models")
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert c.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        report = run_conformance(ConformanceConfig(url=s.url, api_key="s3cret", skip=["bounded_load"]))
        assert report.passed, report.table()


def test_the_operators_gate_token_opens_a_keyed_pod_that_holds_only_its_digest(llama_dir):
    """The pod is given sha256(token), never the token: the token opens /v1/*, the digest does not,
    and the API key still does. The conformance suite passes with the token, as the operator's gate."""
    import hashlib

    token = "9f" * 32
    digest = hashlib.sha256(token.encode()).hexdigest()
    with ThreadedServer(_cfg(llama_dir, api_key="s3cret", gate_key_sha256=digest)) as s:
        c = s.client()
        for bearer, status in (("s3cret", 200), (token, 200), (digest, 401), ("x", 401), (token + "x", 401)):
            assert c.get("/v1/models", headers={"Authorization": f"Bearer {bearer}"}).status_code == status
        assert c.get("/v1/models", headers={"Authorization": token}).status_code == 401  # no "Bearer "
        report = run_conformance(ConformanceConfig(url=s.url, api_key=token, skip=["bounded_load"]))
        assert report.passed, report.table()


def test_a_gate_key_digest_that_is_not_sha256_hex_is_refused():
    import argparse

    from modeldeploy.runtime.server.cli import build_config, configure

    p = argparse.ArgumentParser()
    configure(p)
    args = p.parse_args(["--model", "/nonexistent", "--api-key", "k", "--gate-key-sha256", "XYZ"])
    with pytest.raises(ValueError, match="--gate-key-sha256 must be 64 lowercase hex digits"):
        build_config(args)


def _late_hang_up(monkeypatch, server, tries: int) -> None:
    """The client of the first `tries` cancellation tries hangs up only once the server has completed
    the stream (a busy client: the operator's gate shares its process with reconciles)."""
    from modeldeploy.conformance import checks
    from modeldeploy_dev.wait import wait_until

    real, late = checks._delta_text, {"left": tries, "done": outcome(metrics(server), "completed")}

    def slow_client(chunk):
        text = real(chunk)
        if text and late["left"] > 0:
            late["left"] -= 1
            late["done"] += 1
            wait_until(lambda: outcome(metrics(server), "completed") >= late["done"], 30, 0.02, "stream done")
        return text

    monkeypatch.setattr(checks, "_delta_text", slow_client)


def test_cancellation_tries_again_when_the_server_finished_before_the_hang_up(server, monkeypatch):
    from modeldeploy.conformance.checks import cancellation

    target, _ = discover(Server(server.url), None)
    assert target.max_model_len == 1024  # the tiny model's context, from /v1/models
    target.max_model_len = 512  # every try 256 tokens: within what the socket buffers while unread
    _late_hang_up(monkeypatch, server, tries=1)
    res = cancellation(target)
    assert res.verdict == "pass", res
    first, second = res.observations["tries"]
    assert first["server"]["completed_before_hang_up"] and not second["server"]["completed_before_hang_up"]
    assert second["server"]["cancelled_after"] == second["server"]["cancelled_before"] + 1


def test_cancellation_fails_when_every_stream_completed_before_the_hang_up(server, monkeypatch):
    from modeldeploy.conformance.checks import cancellation

    target, _ = discover(Server(server.url), None)
    target.max_model_len = 512
    _late_hang_up(monkeypatch, server, tries=3)
    res = cancellation(target)
    assert res.verdict == "fail" and len(res.observations["tries"]) == 3, res
    assert "before the client's hang-up reached it" in res.failures[0], res.failures
