"""The engine core process (runtime/engine/client/engine_core.py) through its client: the same outputs as
the in-process engine, the delta protocol's text rebuild, errors that keep their type, abort that
frees blocks across the boundary, and a core that dies failing every waiting request at once."""

from __future__ import annotations

import asyncio
import gc
import os
import pickle
import signal

import pytest

from modeldeploy.runtime import EngineConfig, SamplingParams
from modeldeploy.runtime.engine.client import messages as m
from modeldeploy.runtime.engine.client.async_engine import AsyncEngine
from modeldeploy.runtime.engine.client.base import EngineClient
from modeldeploy.runtime.engine.client.core_client import EngineCoreClient
from modeldeploy.runtime.engine.client.engine_core import DeltaEncoder, usable_cpus
from modeldeploy.runtime.engine.client.factory import make_client
from modeldeploy.runtime.engine.client.stream import OutputStream
from modeldeploy.runtime.engine.llm_engine import LLMEngine
from modeldeploy.runtime.engine.output import EngineDead, RequestMetrics, RequestOutput
from modeldeploy.runtime.engine.sampling_params import Structured


def _cfg(model, **kw) -> EngineConfig:
    return EngineConfig(model=str(model), max_num_seqs=8, num_kv_blocks=64, **kw)


def _out(rid: str, text: str, new: list[int], finished: bool = False) -> RequestOutput:
    return RequestOutput(
        rid, [1, 2], [], new, text, "", finished, "stop" if finished else None, RequestMetrics(0.0)
    )


def test_deltas_rebuild_the_cumulative_text_even_when_a_stop_string_shortens_it():
    enc, client = DeltaEncoder(), EngineCoreClient(EngineConfig(model="unused"))
    client._streams["r"] = OutputStream(1, [1, 2])
    seen = []
    for text, new, fin in [("Hel", [5], False), ("Hello wo", [6, 7], False), ("Hello", [8], True)]:
        seen.append(client._rebuild(enc.encode(_out("r", text, new, fin))))
    assert [o.text for o in seen] == ["Hel", "Hello wo", "Hello"]
    assert seen[-1].token_ids == [5, 6, 7, 8] and seen[-1].prompt_token_ids == [1, 2]
    assert not client._choices and not enc._sent  # nothing kept for a finished choice


def test_usable_cpus_is_capped_by_the_cgroup_quota(tmp_path):
    """A pod's CPU limit is a CFS quota: 250000/100000 is 3 CPUs (rounded up), "max" is no cap."""
    affinity = len(os.sched_getaffinity(0))
    (tmp_path / "q").write_text("250000 100000\n")
    (tmp_path / "max").write_text("max 100000\n")
    assert usable_cpus(str(tmp_path / "q")) == min(affinity, 3)
    assert usable_cpus(str(tmp_path / "max")) == affinity
    assert usable_cpus(str(tmp_path / "absent")) == affinity


async def _collect(client: EngineCoreClient, rid: str, prompt, params: SamplingParams) -> list[RequestOutput]:
    return [o async for o in client.generate(rid, prompt, params)]


def test_outputs_equal_the_in_process_engine_and_abort_frees_blocks(llama_dir):
    """Greedy, seeded sampling, n > 1 with logprobs and a stop string: the core process gives what the
    in-process LLMEngine gives, field for field."""
    cases = {
        "greedy": ("The quick brown fox", SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)),
        "seeded": ("Kubernetes", SamplingParams(max_tokens=10, temperature=0.9, top_p=0.9, seed=7)),
        "n2": ("A paged", SamplingParams(max_tokens=6, temperature=0.8, seed=3, n=2, logprobs=2)),
    }
    ref = LLMEngine(_cfg(llama_dir))
    want = {}
    for rid, (prompt, params) in cases.items():
        ref.add_request(rid, prompt, params)
    while ref.has_work():
        for o in ref.step():
            if o.finished:
                want[(o.request_id, o.index)] = o

    async def run() -> None:
        client = EngineCoreClient(_cfg(llama_dir))
        await client.start()
        try:
            core = client.info()["engine_core"]
            assert core["layout"] == "process" and client.pid != os.getpid()
            # the core froze what loading left on its heap (runtime/engine/heap.py), not the test runner's
            assert core["gc_frozen_objects"] > 10_000 and gc.get_freeze_count() == 0, core
            for rid, (prompt, params) in cases.items():
                outs = await _collect(client, rid, prompt, params)
                for o in outs:
                    if o.finished:
                        w = want[(rid, o.index)]
                        assert (o.token_ids, o.text, o.finish_reason) == (
                            w.token_ids,
                            w.text,
                            w.finish_reason,
                        )
                        assert o.prompt_token_ids == w.prompt_token_ids
                        assert [lp.logprob for lp in o.logprobs] == pytest.approx(
                            [lp.logprob for lp in w.logprobs]
                        )
                streamed = "".join(o.delta_text for o in outs if o.index == 0)
                assert streamed == want[(rid, 0)].text
            # abort across the boundary: a long request left early frees its blocks, and says how fast
            released: list[float] = []
            client.on_abort_release = released.append
            agen = client.generate("long", "hello", SamplingParams(max_tokens=400, ignore_eos=True))
            await agen.__anext__()
            await agen.aclose()
            for _ in range(200):
                st = client.stats()
                if released and st.num_running == 0 and st.num_free_blocks == st.num_total_blocks:
                    break
                await asyncio.sleep(0.02)
            assert released and 0 <= released[0] < 5
            assert client.stats().num_free_blocks == client.stats().num_total_blocks
        finally:
            await client.shutdown()
        assert client._proc.exitcode == 0

    asyncio.run(run())


def test_errors_keep_their_type_and_name_the_problem(llama_dir, tmp_path):
    async def run() -> None:
        client = EngineCoreClient(_cfg(llama_dir))
        await client.start()
        try:
            with pytest.raises(ValueError, match="unknown adapter"):
                await client.generate("a", "hi", SamplingParams(max_tokens=2), adapter="nope").__anext__()
            with pytest.raises(ValueError, match="max_model_len|exceeds"):
                await _collect(client, "b", list(range(10)), SamplingParams(max_tokens=10**6))
            with pytest.raises(ValueError):
                await client.compile(
                    SamplingParams(structured=Structured("json_schema", '{"type": "nonsense"}'))
                )
            res = await client.compile(
                SamplingParams(structured=Structured("json_schema", '{"type": "integer"}'))
            )
            again = await client.compile(
                SamplingParams(structured=Structured("json_schema", '{"type": "integer"}'))
            )
            assert not res.cached and again.cached
            params = SamplingParams(
                max_tokens=8, temperature=0, structured=Structured("json_schema", '{"type": "integer"}')
            )
            outs = await _collect(client, "c", "Number:", params)
            assert outs[-1].text.strip().lstrip("-").isdigit() or outs[-1].finish_reason == "length"
        finally:
            await client.shutdown()

    asyncio.run(run())
    with pytest.raises(ValueError, match="config.json"):  # a load failure: the core's own exception
        asyncio.run(EngineCoreClient(_cfg(tmp_path)).start())


def test_a_killed_core_fails_waiting_requests_at_once(llama_dir):
    async def run() -> None:
        client = EngineCoreClient(_cfg(llama_dir))
        client.step_delay_s = 0.02
        fatal: list[str] = []
        client.on_fatal = fatal.append
        await client.start()
        try:
            agen = client.generate("x", "hello", SamplingParams(max_tokens=400, ignore_eos=True))
            await agen.__anext__()
            os.kill(client.pid, signal.SIGKILL)
            with pytest.raises(EngineDead, match="exit code -9"):
                async with asyncio.timeout(10):
                    async for _ in agen:
                        pass
            assert fatal and "exit code -9" in fatal[0]
            with pytest.raises(EngineDead):
                await client.generate("y", "hello", SamplingParams(max_tokens=2)).__anext__()
        finally:
            await client.shutdown()

    asyncio.run(run())


def test_make_client_picks_the_layout_behind_one_interface():
    cfg = EngineConfig(model="unused")
    process, thread = make_client(cfg, "process"), make_client(cfg, "thread")
    assert isinstance(process, EngineCoreClient) and isinstance(thread, AsyncEngine)
    assert isinstance(process, EngineClient) and isinstance(thread, EngineClient)
    with pytest.raises(ValueError, match="engine_core"):
        make_client(cfg, "fork")  # type: ignore[arg-type]


def test_core_messages_pickle_and_name_their_kind():
    msgs = [
        m.Add("r", [1], SamplingParams(), None),
        m.Abort("r", 1.0),
        m.Stop(),
        m.Step([DeltaEncoder().encode(_out("r", "a", [5]))], [0.1], None),  # type: ignore[arg-type]
        m.Fatal("boom"),
    ]
    for msg in msgs:
        back = pickle.loads(pickle.dumps(msg))
        assert back == msg and back.kind is msg.kind
    assert len({k.value for k in m.MessageKind}) == len(m.MessageKind)
