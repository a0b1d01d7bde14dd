"""Client disconnects free KV blocks: 200 requests, random hang-ups, blocks free == total after."""

from __future__ import annotations

import json
import random
import socket
from concurrent.futures import ThreadPoolExecutor

import httpx

from modeldeploy.conformance.prom import Metrics
from modeldeploy.runtime import EngineConfig
from modeldeploy.runtime.server.config import ServerConfig
from modeldeploy_dev.harness import ThreadedServer
from modeldeploy_dev.wait import wait_until


def _raw_request(port: int, body: bytes, read_bytes: int) -> None:
    """Send a request on a raw socket, read a little (maybe nothing), then hang up."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        got = 0
        while got < read_bytes:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += len(chunk)


def test_random_disconnects_free_every_block(llama_dir):
    ecfg = EngineConfig(model=str(llama_dir), device="cpu", dtype="float32", max_num_seqs=4, bundle_id="disc")
    rng = random.Random(1234)
    with ThreadedServer(ServerConfig(engine=ecfg, served_model_name="tiny", max_queue=256)) as s:
        total = s.ctx.engine.stats().num_total_blocks
        plans = []
        for i in range(200):
            stream = rng.random() < 0.5
            body = {
                "model": "tiny",
                "prompt": f"request {i} " * rng.randint(1, 30),
                "stream": stream,
                "max_tokens": rng.randint(8, 120),
                "ignore_eos": True,
                "temperature": rng.choice([0, 0.8]),
            }
            mode = rng.choice(["complete", "hangup_now", "hangup_soon"])
            read = {"complete": 1 << 30, "hangup_now": 0, "hangup_soon": rng.randint(1, 600)}[mode]
            plans.append((json.dumps(body).encode(), read))

        def run(plan):
            body, read = plan
            _raw_request(s.port, body, read) if read < (1 << 30) else httpx.post(
                s.url + "/v1/completions",
                content=body,
                headers={"Content-Type": "application/json"},
                timeout=120,
            )

        with ThreadPoolExecutor(8) as ex:
            list(ex.map(run, plans))

        def drained() -> bool:
            st = s.ctx.engine.stats()
            idle = s.ctx.admission.running == s.ctx.admission.waiting == st.num_running == st.num_waiting == 0
            return idle and st.num_free_blocks == total

        wait_until(drained, 60, 0.05, "admission and engine to drain and free every block")
        st = s.ctx.engine.stats()
        assert (st.num_running, st.num_waiting) == (0, 0)
        assert st.num_free_blocks == st.num_total_blocks == total
        m = Metrics(httpx.get(s.url + "/metrics").text)
        counted = sum(m.get("modeldeploy_requests_total", outcome=o) for o in ("completed", "cancelled"))
        assert counted == 200 and m.get("modeldeploy_requests_total", outcome="error") == 0
        assert m.get("modeldeploy_requests_total", outcome="cancelled") >= 50  # hang-ups were really seen
        assert m.get("modeldeploy_kv_cache_usage_ratio") == 0.0
        assert m.get("modeldeploy_requests_running") == 0 and m.get("modeldeploy_requests_waiting") == 0
