"""`modeldeploy serve` as a real process: readiness during a slow load, SIGTERM drain, load failure.

The slow load uses the documented test hook MODELDEPLOY_LOAD_DELAY_S (the server waits that
long before loading, reporting phase "delay"), so the 503-while-loading window is wide
enough to observe on a tiny model.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from support.server_process import _get, _spawn, _stop

from modeldeploy.conformance.http import iter_sse
from modeldeploy_dev.wait import wait_until


def test_ready_during_slow_load_then_sigterm_drains_streams(tmp_path, llama_dir):
    proc, url = _spawn(
        tmp_path,
        llama_dir,
        "--max-num-seqs",
        "4",
        "--drain-timeout",
        "120",
        env={"MODELDEPLOY_LOAD_DELAY_S": "4"},
    )
    try:
        loading, live_while_loading, refused_while_loading = [], [], None

        def ready() -> httpx.Response | None:
            nonlocal refused_while_loading
            r = _get(url + "/health/ready")
            if r is not None and r.status_code == 200:
                return r
            if r is not None:
                loading.append((r.status_code, r.json()))
                live_while_loading.append(_get(url + "/health/live").status_code)
                if refused_while_loading is None:
                    refused_while_loading = httpx.post(
                        url + "/v1/completions", json={"model": "tiny", "prompt": "x"}
                    )
            assert proc.poll() is None, tmp_path / "serve.log"
            return None

        r = wait_until(ready, 180, 0.1, "the server to load")
        assert r is not None and r.status_code == 200 and r.json()["status"] == "ready"
        assert loading, "never saw the server while it was loading"
        assert all(
            code == 503 and body["status"] == "loading" and 0.0 <= body["progress"] <= 1.0 and body["phase"]
            for code, body in loading
        )
        assert set(live_while_loading) == {200}
        assert refused_while_loading.status_code == 503
        assert refused_while_loading.json()["error"]["code"] == "loading"

        # four streams in flight, then SIGTERM
        results: list[dict] = [{} for _ in range(4)]
        first = [threading.Event() for _ in range(4)]

        def stream(i: int) -> None:
            body = {
                "model": "tiny",
                "prompt": f"stream {i}",
                "max_tokens": 600,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=180) as resp:
                events = []
                for ev in iter_sse(resp.iter_lines()):
                    events.append(ev.data)
                    first[i].set()
            results[i] = {"status": resp.status_code, "events": events}

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        assert all(e.wait(60) for e in first)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        draining = _get(url + "/health/ready")
        refused = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "x"}, timeout=10)
        for t in threads:
            t.join(180)
        assert proc.wait(60) == 0
        assert (
            draining is not None and draining.status_code == 503 and draining.json()["status"] == "draining"
        )
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
        for res in results:
            assert res["status"] == 200 and res["events"][-1] == "[DONE]"
            chunks = [json.loads(e) for e in res["events"][:-1]]
            assert chunks[-1]["usage"]["completion_tokens"] == 600
            assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    finally:
        _stop(proc)


def test_load_failure_is_reported_and_fails_liveness(tmp_path, llama_dir):
    bad = "sha256:" + "0" * 64
    proc, url = _spawn(tmp_path, llama_dir, "--model-digest", bad)
    try:
        r = wait_until(
            lambda: (r := _get(url + "/health/ready")) is not None and r.json()["status"] == "failed" and r,
            180,
            0.2,
            "/health/ready to report the load failure",
        )
        assert r.status_code == 503
        body = r.json()
        assert body["status"] == "failed" and "digest" in body["error"].lower() and bad in body["error"]
        assert _get(url + "/health/live").status_code == 503
        g = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "x"})
        assert g.status_code == 503 and g.json()["error"]["code"] == "load_failed"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        _stop(proc)


@pytest.mark.parametrize(
    "flag,value", [("--max-queue", "-1"), ("--max-num-seqs", "0"), ("--drain-timeout", "-5")]
)
def test_bad_flags_exit_2_naming_the_flag(flag, value, llama_dir):
    p = subprocess.run(
        [sys.executable, "-m", "modeldeploy", "serve", "--model", str(llama_dir), flag, value],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and flag in p.stderr, p.stderr


def test_drain_timeout_aborts_what_is_left_and_exits_0(tmp_path, llama_dir):
    proc, url = _spawn(tmp_path, llama_dir, "--drain-timeout", "0.2")
    try:

        def ready() -> bool:
            assert proc.poll() is None, tmp_path / "serve.log"
            return (r := _get(url + "/health/ready")) is not None and r.status_code == 200

        wait_until(ready, 180, 0.2, "the server to load")
        body = {"model": "tiny", "prompt": "long", "max_tokens": 1000, "ignore_eos": True, "stream": True}
        got_first, events = threading.Event(), []

        def stream() -> None:
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as resp:
                for ev in iter_sse(resp.iter_lines()):
                    events.append(ev.data)
                    got_first.set()

        t = threading.Thread(target=stream)
        t.start()
        assert got_first.wait(60)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        t.join(30)
        assert time.monotonic() - t0 < 30
        finishes = [json.loads(e)["choices"][0]["finish_reason"] for e in events if e != "[DONE]"]
        assert finishes[-1] == "abort" and events[-1] == "[DONE]"
    finally:
        _stop(proc)
