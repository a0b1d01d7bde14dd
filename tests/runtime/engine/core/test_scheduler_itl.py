"""A step's prefill is bounded by time (a target step time and a learned per-token cost), decodes
first. The cost model and the scheduler are pure: driven here with made-up times."""

from __future__ import annotations

import pytest

from modeldeploy.runtime import EngineConfig, SamplingParams
from modeldeploy.runtime.engine.core.block_manager import BlockManager
from modeldeploy.runtime.engine.core.scheduler import (
    COLD_PREFILL_CHUNK,
    MIN_PREFILL_CHUNK,
    PrefillCost,
    ScheduledBatch,
    Scheduler,
)
from modeldeploy.runtime.engine.core.sequence import Sequence


def seq(rid: str, n: int, start: int = 0) -> Sequence:
    return Sequence(rid, list(range(start, start + n)), SamplingParams(max_tokens=64))


def ran(batch: ScheduledBatch) -> None:
    """What the engine does after a step: tokens computed, a token sampled where the prompt is done."""
    for s, n in zip(batch.seqs, batch.num_tokens, strict=True):
        s.num_computed_tokens += n
        if s.num_uncomputed_tokens == 0:
            s.token_ids.append(7)


def rows(batch: ScheduledBatch) -> list[tuple[str, int]]:
    return [(s.request_id, n) for s, n in zip(batch.seqs, batch.num_tokens, strict=True)]


def test_cost_learns_decode_time_and_per_token_prefill_cost():
    c = PrefillCost(alpha=0.5)
    assert c.prefill_tokens(0.1, 4) == COLD_PREFILL_CHUNK  # nothing measured yet
    c.observe(4, 0, 0.040)  # a decode-only step of 4 rows
    assert c.decode_s(4) == pytest.approx(0.040)
    assert c.decode_s(5) == pytest.approx(0.040)  # the nearest bucket stands in
    c.observe(4, 200, 0.140)  # 200 prefill tokens cost 0.1 s over the decodes
    assert c.per_token_s == pytest.approx(0.0005)
    assert c.prefill_tokens(0.100, 4) == 120  # (0.100 - 0.040) / 0.0005
    # decodes alone exceed the target: prefill still gets as much time as they take (step <= 2x decode)
    assert c.prefill_tokens(0.030, 4) == 80  # 0.040 / 0.0005
    c.observe(1, 0, 0.001)
    assert c.prefill_tokens(0.0001, 1) == MIN_PREFILL_CHUNK  # and never less than this
    c.observe(4, 8, 5.0)  # a chunk too small to measure per-token cost is ignored
    assert c.per_token_s == pytest.approx(0.0005)
    for _ in range(12):  # the machine got twice as slow: the estimate follows
        c.observe(4, 200, 0.240)
    assert c.per_token_s == pytest.approx(0.001, rel=0.01)
    assert c.prefill_tokens(0.100, 4) == pytest.approx(60, abs=1)


def decoding(sch: Scheduler, n: int) -> list[Sequence]:
    """n short sequences admitted, prefilled and now decoding."""
    seqs = [seq(f"d{i}", 8, 100 * i) for i in range(n)]
    for s in seqs:
        sch.add(s)
    ran(sch.schedule())
    assert all(s.num_uncomputed_tokens == 1 for s in seqs)
    return seqs


class FixedCost(PrefillCost):
    """A cost model whose figures the test sets (and that records what the scheduler asked)."""

    def __init__(self, decode_s: float, per_token_s: float):
        super().__init__()
        self.fixed_decode_s, self.per_token_s = decode_s, per_token_s
        self.asked: list[tuple[float, int]] = []

    def decode_s(self, decodes: int) -> float:
        return self.fixed_decode_s

    def observe(self, decodes: int, prefill_tokens: int, seconds: float) -> None:
        """Fixed: the engine's measured step times must not move the figures (the test would then
        depend on the machine's speed and load)."""

    def prefill_tokens(self, target_s: float, decodes: int) -> int:
        self.asked.append((target_s, decodes))
        return super().prefill_tokens(target_s, decodes)


def test_a_long_prompt_is_chunked_to_the_time_target_while_others_decode():
    cost = FixedCost(decode_s=0.050, per_token_s=0.0005)
    sch = Scheduler(BlockManager(256, 16), 8, 2048, target_step_s=0.100, cost=cost)
    decoding(sch, 4)
    long = seq("long", 1000, 5000)
    sch.add(long)
    chunks = []
    for _ in range(20):
        batch = sch.schedule()
        assert rows(batch)[:4] == [(f"d{i}", 1) for i in range(4)]  # decodes first, every step
        chunks.append(dict(rows(batch)).get("long", 0))
        ran(batch)
        if long.num_uncomputed_tokens <= 1:
            break
    assert chunks == [100] * 10  # (0.100 - 0.050) / 0.0005 per step, never the 2048-token budget
    assert cost.asked[0] == (0.100, 4)


def test_slower_steps_shrink_the_chunk_online():
    cost = PrefillCost(alpha=1.0)  # follow the last sample at once, to keep the arithmetic visible
    sch = Scheduler(BlockManager(256, 16), 8, 2048, target_step_s=0.100, cost=cost)
    decoding(sch, 2)
    sch.add(seq("long", 1500, 5000))
    cost.observe(2, 0, 0.020)
    batch = sch.schedule()
    assert dict(rows(batch))["long"] == COLD_PREFILL_CHUNK
    ran(batch)
    sch.observe(batch, 0.020 + COLD_PREFILL_CHUNK * 0.001)  # 1 ms per prefill token measured
    batch = sch.schedule()
    assert dict(rows(batch))["long"] == 80  # (0.100 - 0.020) / 0.001
    ran(batch)
    sch.observe(batch, 0.020 + 80 * 0.002)  # the machine got busy: 2 ms per token
    assert dict(rows(sch.schedule()))["long"] == 40


def test_without_decodes_or_without_target_the_token_budget_decides():
    cost = FixedCost(decode_s=0.050, per_token_s=0.0005)
    sch = Scheduler(BlockManager(256, 16), 8, 512, target_step_s=0.100, cost=cost)
    sch.add(seq("long", 1000))
    assert rows(sch.schedule()) == [("long", 512)]  # nobody is decoding: no stream waits on this step
    off = Scheduler(BlockManager(256, 16), 8, 512, cost=cost)
    decoding(off, 2)
    off.add(seq("long", 1000, 5000))
    assert rows(off.schedule()) == [("d0", 1), ("d1", 1), ("long", 510)]
    assert not cost.asked  # never consulted without a target


def test_decodes_go_before_an_earlier_running_prefill_when_the_budget_is_tight():
    sch = Scheduler(BlockManager(256, 4), 8, 10)
    p = seq("p", 50)
    sch.add(p)
    ran(sch.schedule())  # p took 10 tokens and is still prefilling
    d1, d2 = seq("d1", 3, 100), seq("d2", 3, 200)
    for s in (d1, d2):
        s.num_computed_tokens = 0
    sch.add(d1)
    sch.add(d2)
    for s in (d1, d2):  # admit and prefill d1/d2 by hand: running after p, decoding
        sch.waiting.remove(s)
        sch.bm.admit(s, [])
        sch.bm.grow(s, 3)
        s.num_computed_tokens = 3
        s.token_ids.append(7)
        s.status = p.status
        sch.running.append(s)
    assert rows(sch.schedule()) == [("d1", 1), ("d2", 1), ("p", 8)]


def test_target_needs_chunked_prefill_and_is_a_serve_flag():
    with pytest.raises(ValueError, match="target_itl_ms: must be > 0 and needs chunked prefill"):
        EngineConfig(model="/m", target_itl_ms=100, enable_chunked_prefill=False).validate()
    with pytest.raises(ValueError, match="target_itl_ms"):
        EngineConfig(model="/m", target_itl_ms=0).validate()
    with pytest.raises(ValueError, match="target_ttft_ms: must be > 0, got -1"):
        EngineConfig(model="/m", target_ttft_ms=-1).validate()
    with pytest.raises(
        ValueError, match="target_ttft_ms: orders prompts by deadline, which needs prefill_order"
    ):
        EngineConfig(model="/m", target_ttft_ms=900, prefill_order="fcfs").validate()  # never a silent ignore
    import argparse

    from modeldeploy.runtime.server.cli import configure

    p = argparse.ArgumentParser()
    configure(p)
    assert p.parse_args(["--model", "/m", "--target-itl-ms", "150"]).target_itl_ms == 150.0
    assert p.parse_args(["--model", "/m", "--target-ttft-ms", "900"]).target_ttft_ms == 900.0


def test_greedy_outputs_are_unchanged_with_the_time_bound(llama_dir):
    """Small chunks (a fixed cost model makes them 40 tokens) while others decode: the same tokens."""
    from modeldeploy.runtime.engine.llm_engine import LLMEngine

    prompts = [[3 + (i * 37 + j * 11) % 500 for j in range(n)] for i, n in enumerate([12, 300, 9, 180, 25])]
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)

    def run(target_itl_ms: float | None) -> tuple[dict[str, list[int]], dict[str, int]]:
        eng = LLMEngine(
            EngineConfig(
                model=str(llama_dir),
                dtype="float32",
                max_model_len=512,
                num_kv_blocks=200,
                target_itl_ms=target_itl_ms,
                prefill_order="fcfs",  # the CPU default ("auto") would bound the baseline too
                enable_prefix_caching=False,
            )
        )
        if target_itl_ms is not None:
            eng.scheduler.cost = FixedCost(decode_s=0.010, per_token_s=0.001)  # 40 tokens per step
        out: dict[str, list[int]] = {}
        chunks: dict[str, int] = {}
        for i, p in enumerate(prompts):
            eng.add_request(f"r{i}", p, greedy)
            eng.step()  # staggered arrivals: later prompts prefill while earlier ones decode
        for _ in range(500):
            for o in eng.step():
                if o.finished:
                    out[o.request_id] = o.token_ids
                    chunks[o.request_id] = o.metrics.prefill_chunks
            if not eng.has_work():
                break
        return out, chunks

    base, base_chunks = run(None)
    bounded, chunks = run(50.0)
    assert len(base) == len(prompts) and bounded == base
    assert chunks.get("r1", 0) >= 300 // 40 and base_chunks.get("r1", 0) == 1, (chunks, base_chunks)


# ---- prefill_order="shortest": shortest-remaining-first with an age limit ----


def test_shortest_first_lets_a_short_prompt_overtake_a_long_prompts_chunks():
    """A long prompt is cut to the time target even with nothing decoding, and a short prompt that
    arrives while it prefills goes first in the next step: it waits one chunk, not the whole prompt."""
    cost = FixedCost(decode_s=0.0, per_token_s=0.001)
    sch = Scheduler(BlockManager(256, 16), 8, 2048, target_step_s=0.200, cost=cost, prefill_order="shortest")
    long = seq("long", 1500)
    sch.add(long)
    first = sch.schedule()
    assert rows(first) == [("long", 200)]  # 0.200 s / 0.001 s a token, not the 2048-token budget
    ran(first)
    short = seq("short", 60, 9000)
    sch.add(short)
    second = sch.schedule()
    assert sorted(rows(second)) == [("long", 140), ("short", 60)]  # the short one whole, the long the rest
    ran(second)
    assert short.num_uncomputed_tokens == 1  # prefilled: its first token is out after this step
    fcfs = Scheduler(BlockManager(256, 16), 8, 2048, target_step_s=0.200, cost=cost)
    fcfs.add(seq("long", 1500))
    assert rows(fcfs.schedule()) == [("long", 1500)]  # arrival order: nothing decodes, no bound


def test_shortest_first_orders_waiting_prompts_by_length_but_aged_ones_go_first(monkeypatch):
    from modeldeploy.runtime.engine.core import scheduler as sched

    sch = Scheduler(BlockManager(256, 16), 8, 300, prefill_order="shortest")
    a, b, c = seq("a", 250), seq("b", 40, 1000), seq("c", 120, 2000)
    for s in (a, b, c):
        sch.add(s)
    assert rows(sch.schedule()) == [("b", 40), ("c", 120), ("a", 140)]  # shortest first, a chunked last
    sch2 = Scheduler(BlockManager(256, 16), 8, 300, prefill_order="shortest")
    old, new = seq("old", 250), seq("new", 40, 1000)
    sch2.add(old)
    sch2.add(new)
    clock = old.arrival_time + sched.AGE_S + 1  # "old" has waited past the age limit, "new" not
    new.arrival_time = clock - 0.5
    monkeypatch.setattr(sched.time, "monotonic", lambda: clock)
    assert rows(sch2.schedule()) == [("old", 250), ("new", 40)]


def test_ttft_target_keeps_a_prompt_that_can_meet_it_ahead_and_demotes_one_that_cannot(monkeypatch):
    """With a TTFT target, a long prompt whose prefill still fits before its deadline is not overtaken
    by a short one that arrived later, nor cut by the step's time bound; once it cannot make it (the
    cost doubled, or it waited), the short goes first and the long one gets what is left of the
    bound. Without a measured cost the order is plain shortest-first."""
    from modeldeploy.runtime.engine.core import scheduler as sched

    def line(per_token_s: float | None, after_long: float, streamed: bool = False) -> list[tuple[str, int]]:
        cost = FixedCost(decode_s=0.0, per_token_s=0.001)
        cost.per_token_s = per_token_s
        sch = Scheduler(
            BlockManager(256, 16),
            8,
            2048,
            target_step_s=0.5,
            cost=cost,
            prefill_order="shortest",
            target_ttft_s=1.5,
        )
        long, short = seq("long", 1200), seq("short", 60, 9000)
        short.arrival_time = long.arrival_time + 0.1
        if streamed:  # preempted after its first token: recomputing, its TTFT is history
            long.first_token_time = long.arrival_time + 0.05
        sch.add(long)
        sch.add(short)
        clock = long.arrival_time + after_long
        monkeypatch.setattr(sched.time, "monotonic", lambda: clock)
        return rows(sch.schedule())

    # 1200 tokens x 1 ms = 1.2 s <= 1.5 - 0.2 s: the long prompt keeps arrival order, whole (no time
    # bound cuts a prompt that can meet its deadline: only the token budget), and the short, which can
    # too, after it in the same step
    assert line(0.001, 0.2) == [("long", 1200), ("short", 60)]
    # at 2 ms a token (2.4 s) it cannot make it: shortest-first, the short whole, the long the rest
    assert sorted(line(0.002, 0.2)) == [("long", 190), ("short", 60)]
    # 1.2 s of work but 0.5 s left (waited 1.0 s): demoted as well
    assert sorted(line(0.001, 1.0)) == [("long", 440), ("short", 60)]
    # a preempted stream recomputing keeps arrival order, however long its recompute
    assert line(0.002, 0.2, streamed=True) == [("long", 1200), ("short", 60)]
    # nothing measured yet and nothing decoding: plain shortest-first, the token budget only (this
    # step measures the cost)
    assert line(None, 0.2) == [("short", 60), ("long", 1200)]


def test_shortest_first_stops_at_a_prompt_the_blocks_cannot_take():
    """Nothing longer overtakes a prompt that waits for blocks (it would starve it further)."""
    sch = Scheduler(BlockManager(6, 16), 8, 2048, prefill_order="shortest")
    big, bigger = seq("big", 120), seq("bigger", 200, 1000)  # 8 and 13 blocks: neither fits in 6
    small = seq("small", 20, 2000)
    for s in (bigger, big, small):
        sch.add(s)
    assert rows(sch.schedule()) == [("small", 20)]
    assert [s.request_id for s in sch.waiting] == ["bigger", "big"]


def test_prefill_order_is_validated_and_a_serve_flag():
    from modeldeploy.runtime.server.cli import ENGINE_FLAGS

    with pytest.raises(ValueError, match="prefill_order: 'sjf' is not one of auto, fcfs, shortest"):
        EngineConfig(model="m", prefill_order="sjf").validate()
    assert "prefill_order" in ENGINE_FLAGS


def test_auto_order_resolves_per_device():
    """The default: shortest-first with a CPU_STEP_TARGET_MS bound on cpu (a step carrying a whole long
    prompt there lasts seconds), arrival order on cuda; what the user set is kept."""
    from modeldeploy.runtime.config import CPU_STEP_TARGET_MS, CPU_TTFT_TARGET_MS

    assert EngineConfig().prefill_order == "auto" and EngineConfig().target_itl_ms is None
    cpu = EngineConfig(model="m")
    cpu.resolve_schedule("cpu")
    assert (cpu.prefill_order, cpu.target_itl_ms) == ("shortest", CPU_STEP_TARGET_MS) == ("shortest", 500.0)
    assert cpu.target_ttft_ms == CPU_TTFT_TARGET_MS == 1500.0
    mine = EngineConfig(model="m", target_itl_ms=300)
    mine.resolve_schedule("cpu")
    assert (mine.prefill_order, mine.target_itl_ms) == ("shortest", 300)
    whole = EngineConfig(model="m", enable_chunked_prefill=False)  # a bound needs chunks
    whole.resolve_schedule("cpu")
    assert (whole.prefill_order, whole.target_itl_ms) == ("shortest", None)
    whole.validate()
    gpu = EngineConfig(model="m")
    gpu.resolve_schedule("cuda")
    assert (gpu.prefill_order, gpu.target_itl_ms, gpu.target_ttft_ms) == ("fcfs", None, None)
    deadline = EngineConfig(model="m", target_ttft_ms=800)  # asked for: its order on a GPU too
    deadline.resolve_schedule("cuda")
    assert (deadline.prefill_order, deadline.target_itl_ms, deadline.target_ttft_ms) == (
        "shortest",
        None,
        800,
    )
    deadline.validate()
    fcfs = EngineConfig(model="m", prefill_order="fcfs")
    fcfs.resolve_schedule("cpu")
    assert (fcfs.prefill_order, fcfs.target_itl_ms) == ("fcfs", None)


def test_engine_publishes_the_resolved_schedule(llama_dir):
    """/v1/bundle shows engine.config: after load it holds the policy that runs, not "auto"."""
    from modeldeploy.runtime.engine.llm_engine import LLMEngine

    eng = LLMEngine(EngineConfig(model=str(llama_dir), dtype="float32", max_model_len=256, num_kv_blocks=64))
    assert (eng.config.prefill_order, eng.config.target_itl_ms) == ("shortest", 500.0)
    assert eng.scheduler.shortest_first and eng.scheduler.target_step_s == pytest.approx(0.5)
    assert eng.config.target_ttft_ms == 1500.0 and eng.scheduler.target_ttft_s == pytest.approx(1.5)
