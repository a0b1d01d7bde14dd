"""Admission by queued prompt tokens and estimated wait: refusals come at once,
as 429 + Retry-After with the reason counted, instead of a queue that only grows."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
from support.server_contract import BUNDLE, _cfg, metrics, outcome

from modeldeploy.runtime.server.admission import Admission
from modeldeploy.runtime.server.errors import APIError
from modeldeploy_dev.harness import ThreadedServer


def _refusal(adm: Admission, *args) -> APIError:
    with pytest.raises(APIError) as e:
        adm.enter(*args)
    return e.value


async def test_queued_prompt_tokens_are_bounded_but_a_lone_request_always_enters():
    adm = Admission(max_running=1, max_queue=8, max_queued_tokens=1000)
    running = adm.enter(50)
    await running.acquire()
    lone = adm.enter(4000)  # longer than the bound, but nothing else waits: it must be able to run
    e = _refusal(adm, 10)
    assert e.status == 429 and e.code == "queued_tokens" and "4000 prompt tokens already waiting" in str(e)
    lone.release()
    small = adm.enter(600)
    assert adm.queued_tokens == 600
    assert _refusal(adm, 401).code == "queued_tokens"
    adm.enter(400)
    assert adm.queued_tokens == 1000 and adm.rejections["queued_tokens"] == 2
    small.release()
    assert adm.queued_tokens == 400


async def test_estimated_wait_over_the_budget_is_refused_at_once():
    adm = Admission(max_running=2, max_queue=8, queue_budget_s=1.0)
    a, b = adm.enter(), adm.enter()
    await a.acquire()
    await b.acquire()
    assert adm.estimated_wait() == 0.0  # nothing measured yet: never refuse on a guess
    adm.observe_slot(3.0)  # a request holds a slot about 3 s
    assert adm.estimated_wait() == pytest.approx(1.5)  # 1 ahead of it over 2 slots
    e = _refusal(adm)
    assert e.status == 429 and e.code == "deadline" and e.headers["Retry-After"] == "1"
    assert "estimated wait for a running slot 1.50s exceeds the budget 1.00s" in str(e)
    ok = adm.enter(0, 2.0)  # the client's own budget (x-request-deadline-ms) takes precedence
    assert adm.estimated_wait() == pytest.approx(3.0)
    assert _refusal(adm, 0, 2.5).headers["Retry-After"] == "1"
    assert _refusal(adm, 0, 0.5).headers["Retry-After"] == "3"  # ceil(3.0 - 0.5)
    assert adm.rejections["deadline"] == 3
    ok.release()


async def test_a_request_that_waited_past_its_budget_is_refused_when_its_slot_comes():
    adm = Admission(max_running=1, max_queue=4)
    a = adm.enter()
    await a.acquire()
    late = adm.enter(7, 0.05)
    waiter = asyncio.ensure_future(late.acquire())
    await asyncio.sleep(0.15)
    a.release()
    with pytest.raises(APIError) as e:
        await waiter
    assert e.value.status == 429 and e.value.code == "expired" and "past its budget" in str(e.value)
    assert (adm.running, adm.waiting, adm.queued_tokens) == (0, 0, 0)
    assert adm.rejections["expired"] == 1
    nxt = adm.enter()
    await asyncio.wait_for(nxt.acquire(), 1)  # the slot went back


async def test_under_the_server_budget_a_late_waiter_is_served_not_refused():
    """Only a client's own deadline expires a waiter; under --queue-budget every refusal is at the
    door, and a waiter the estimate let in wrongly starts late and is counted."""
    adm = Admission(max_running=1, max_queue=4, queue_budget_s=0.05)
    a = adm.enter()
    await a.acquire()
    late = adm.enter(7)  # nothing measured yet: let in
    waiter = asyncio.ensure_future(late.acquire())
    await asyncio.sleep(0.15)
    a.release()
    await asyncio.wait_for(waiter, 1)
    assert late.state == "running" and adm.late_starts == 1 and adm.rejections["expired"] == 0
    late.release()


async def test_a_request_that_finds_every_slot_taken_is_counted_as_a_wait():
    """modeldeploy_admission_waits_total: the conformance bounded_load check reads it, because a
    wait shorter than a scrape never shows in the sampled gauge (a tiny model's requests)."""
    adm = Admission(max_running=2, max_queue=8)
    first, second = adm.enter(), adm.enter()
    await first.acquire()
    await second.acquire()
    assert adm.waits == 0  # free slots: no wait
    third = adm.enter()
    waiting = asyncio.ensure_future(third.acquire())
    await asyncio.sleep(0)
    assert adm.waits == 1 and adm.waiting == 1 and not waiting.done()
    first.release()
    await asyncio.wait_for(waiting, 5)
    assert third.state == "running" and adm.waits == 1
    second.release()
    fourth = adm.enter()
    await fourth.acquire()  # a slot was free again
    assert adm.waits == 1


def test_server_refuses_a_hopeless_request_within_50ms_and_counts_the_reason(llama_dir):
    cfg = _cfg(llama_dir, max_num_seqs=1, max_queue=8, queue_budget_s=0.3, step_delay_s=0.02)
    with ThreadedServer(cfg) as s:
        short = {"model": "tiny", "prompt": "x", "max_tokens": 20, "ignore_eos": True}
        assert httpx.post(s.url + "/v1/completions", json=short, timeout=60).status_code == 200  # a slot time
        started = threading.Event()

        def long_stream():
            body = {**short, "max_tokens": 200, "stream": True}
            with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=60) as r:
                for _ in r.iter_lines():
                    started.set()

        t = threading.Thread(target=long_stream)
        t.start()
        assert started.wait(30)
        r = httpx.post(s.url + "/v1/completions", json=short, timeout=30)
        refused_while_the_slot_was_held = t.is_alive()
        bad = httpx.post(
            s.url + "/v1/completions", json=short, headers={"x-request-deadline-ms": "soon"}, timeout=30
        )
        t.join(60)
        assert r.status_code == 429 and r.json()["error"]["code"] == "deadline", r.text
        assert int(r.headers["Retry-After"]) >= 1
        assert refused_while_the_slot_was_held  # at once, not after waiting for the slot
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "x-request-deadline-ms"
        m = metrics(s)
        assert m.get("modeldeploy_admission_rejections_total", reason="deadline", bundle=BUNDLE) == 1
        assert m.get("modeldeploy_admission_late_starts_total", bundle=BUNDLE) == 0
        assert m.get("modeldeploy_admission_waits_total", bundle=BUNDLE) == 0  # refused, never queued
        assert outcome(m, "rejected") == 1
        # with room again, the client's own deadline header is honoured
        ok = httpx.post(s.url + "/v1/completions", json=short, headers={"x-request-deadline-ms": "5000"})
        assert ok.status_code == 200
