"""`modeldeploy serve --tensor-parallel-size 2` as a real process (CPU, gloo): it passes the
conformance suite, a killed rank (a worker, or rank 0: the engine core process) fails it fast and
a killed server leaves no rank behind, and SIGTERM under load drains with every rank alive, then
stops them all with exit 0."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from support.processes import _alive
from support.server_process import _get, _spawn, _stop

from modeldeploy.conformance import ConformanceConfig, run_conformance
from modeldeploy.conformance.http import iter_sse
from modeldeploy_dev.wait import wait_until

# serial: TP servers start three processes each and a killed rank must fail within seconds
pytestmark = [pytest.mark.slow, pytest.mark.serial]
STREAMS = 4


def _serve_tp2(tmp_path: Path, model: Path, *flags: str):
    # a step delay keeps streams in flight long enough to kill something under them
    proc, url = _spawn(tmp_path, model, "--tensor-parallel-size", "2", "--max-num-seqs", "8", *flags)
    try:
        wait_until(lambda: (r := _get(url + "/health/ready")) is not None and r.status_code == 200, 120, 0.2)
    except TimeoutError:
        proc.kill()  # no server outlives a test; its ranks exit when its pipe closes
        proc.wait(30)
        raise
    info = httpx.get(url + "/v1/bundle").json()["engine_info"]
    parallel, core = info["parallel"], info["engine_core"]
    assert parallel["tensor_parallel_size"] == 2 and parallel["backend"] == "gloo"
    assert len(parallel["worker_pids"]) == 1
    assert core["layout"] == "process" and core["pid"] != proc.pid  # rank 0 is the engine core
    return proc, url, parallel["worker_pids"] + [core["pid"]]


class Streams:
    """STREAMS long streamed completions; each records when and how it ended."""

    def __init__(self, url: str):
        self.url, self.ends, self.started = url, {}, threading.Event()  # set once every stream has a chunk
        self._first, self._lock = 0, threading.Lock()
        self.threads = [threading.Thread(target=self._one, args=(i,)) for i in range(STREAMS)]
        for t in self.threads:
            t.start()

    def _one(self, i: int) -> None:
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 300, "ignore_eos": True, "stream": True}
        chunks, done, error = 0, False, None
        try:
            with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=60) as r:
                if r.status_code != 200:
                    error = f"HTTP {r.status_code}: {r.read()[:200]!r}"
                for ev in iter_sse(r.iter_lines()):
                    data = ev.data
                    if data == "[DONE]":
                        done = True
                    elif '"error"' in data:
                        error = data
                    else:
                        chunks += 1
                        if chunks == 1:
                            self._started_one()
        except httpx.TransportError as e:
            error = repr(e)
        self.ends[i] = {"at": time.monotonic(), "chunks": chunks, "done": done, "error": error}

    def _started_one(self) -> None:
        with self._lock:
            self._first += 1
            if self._first == STREAMS:
                self.started.set()

    def join(self, timeout_s: float) -> None:
        for t in self.threads:
            t.join(timeout_s)


def _readiness_until_gone(url: str, limit_s: float) -> list:
    seen = []
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        r = _get(url + "/health/ready")
        seen.append(r.status_code if r is not None else "gone")
        if r is None:
            break
        time.sleep(0.05)
    return seen


def test_conformance_suite_passes_on_a_tp2_server(tmp_path, llama_dir):
    proc, url, _ = _serve_tp2(tmp_path, llama_dir)
    try:
        report = run_conformance(ConformanceConfig(url=url, requests=8, concurrency=4))
        assert report.passed, [c for c in report.checks if not c.passed]
        assert {c.name for c in report.checks} >= {"normal_response", "streaming", "usage_accounting"}
    finally:
        _stop(proc)


@pytest.mark.parametrize("victim", ["worker", "core", "hung-worker", "server"])
def test_a_killed_rank_fails_the_server_fast_and_leaves_no_rank(tmp_path, llama_dir, victim):
    """SIGKILL a worker, or rank 0 (the engine core process), or SIGSTOP a worker (a hung rank: the
    next collective times out after --tp-timeout): the server fails fast (503, exit 1). SIGKILL the
    API server itself: the core and the worker go with it."""
    proc, url, pids = _serve_tp2(tmp_path, llama_dir, "--step-delay", "0.02", "--tp-timeout", "3")
    worker, core = pids
    try:
        streams = Streams(url)
        assert streams.started.wait(30)
        time.sleep(0.3)
        killed = time.monotonic()
        if victim == "hung-worker":
            os.kill(worker, signal.SIGSTOP)
        else:
            os.kill({"worker": worker, "core": core, "server": proc.pid}[victim], signal.SIGKILL)
        seen = _readiness_until_gone(url, 12)
        streams.join(15)
        code = proc.wait(15)
        exited = time.monotonic()
        assert len(streams.ends) == STREAMS
        for i, end in streams.ends.items():
            assert not end["done"] and end["error"], f"stream {i} did not end with an error: {end}"
            assert end["at"] - killed < 10, f"stream {i} ended {end['at'] - killed:.1f}s after the kill"
        if victim != "server":
            assert all("engine failed" in e["error"] for e in streams.ends.values())
            assert 503 in seen, seen  # health said so before the process went
            assert code == 1
        else:
            assert code == -signal.SIGKILL
        assert exited - killed < 10
        for p in pids:  # no rank outlives the server
            wait_until(lambda p=p: not _alive(p), 10, 0.1)
    finally:
        _stop(proc)
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def test_sigterm_under_load_drains_with_every_rank_then_stops_them(tmp_path, llama_dir):
    proc, url, pids = _serve_tp2(tmp_path, llama_dir, "--step-delay", "0.01", "--drain-timeout", "60")
    try:
        streams = Streams(url)
        assert streams.started.wait(30)
        proc.send_signal(signal.SIGTERM)
        streams.join(90)
        assert proc.wait(30) == 0
        for i, end in streams.ends.items():
            assert end["done"] and end["error"] is None and end["chunks"] > 0, f"stream {i}: {end}"
        assert not any(_alive(p) for p in pids)  # the worker and the engine core
        log = next(tmp_path.glob("serve-*.log")).read_text()
        assert "tensor-parallel ranks stopped: exit codes [0]" in log
    finally:
        _stop(proc)
