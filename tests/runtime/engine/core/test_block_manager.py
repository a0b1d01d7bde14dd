"""BlockManager and Scheduler as pure logic: no model, no torch tensors."""

from __future__ import annotations

from modeldeploy.runtime.engine.core.block_manager import BlockManager
from modeldeploy.runtime.engine.core.scheduler import Scheduler
from modeldeploy.runtime.engine.core.sequence import Sequence, Status
from modeldeploy.runtime.engine.sampling_params import SamplingParams


def seq(rid: str, n: int, start: int = 0) -> Sequence:
    return Sequence(rid, list(range(start, start + n)), SamplingParams(max_tokens=8))


def test_prefix_hits_need_computed_blocks_and_same_bundle():
    bm = BlockManager(16, 4, bundle_id="a")
    s = seq("s", 10)
    bm.admit(s, bm.match_prefix(s))
    bm.grow(s, 10)
    assert len(s.block_table) == 3 and bm.num_free == 13
    t = seq("t", 10)
    assert bm.match_prefix(t) == []  # nothing computed yet, nothing registered
    s.num_computed_tokens = 10
    bm.commit(s)
    assert bm.match_prefix(t) == s.block_table[:2]
    other = BlockManager(16, 4, bundle_id="b")
    assert other.root_hash != bm.root_hash  # another bundle never shares a hash chain
    bm.release(s)
    assert bm.num_free == 16
    # a freed block keeps its hash until reused: still a hit, and taking it removes it from the free list
    hits = bm.match_prefix(t)
    assert len(hits) == 2
    bm.admit(t, hits)
    assert t.num_computed_tokens == 8 and bm.num_free == 14
    bm.release(t)
    assert bm.num_free == 16


def test_last_token_is_never_a_hit():
    bm = BlockManager(8, 4)
    s = seq("s", 8)
    bm.admit(s, [])
    bm.grow(s, 8)
    s.num_computed_tokens = 8
    bm.commit(s)
    assert len(bm.match_prefix(seq("t", 8))) == 1  # 8 tokens: only the first block may hit
    assert len(bm.match_prefix(seq("u", 9))) == 2


def test_reused_block_drops_its_stale_hash():
    bm = BlockManager(2, 4)
    s = seq("s", 8)
    bm.admit(s, [])
    bm.grow(s, 8)
    s.num_computed_tokens = 8
    bm.commit(s)
    bm.release(s)
    u = seq("u", 8, start=100)
    bm.admit(u, [])
    bm.grow(u, 8)  # evicts both cached blocks
    assert bm.match_prefix(seq("t", 9)) == []


def test_scheduler_budget_chunks_and_order():
    bm = BlockManager(64, 4)
    sch = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=10)
    a, b = seq("a", 7), seq("b", 7, 50)
    sch.add(a)
    sch.add(b)
    batch = sch.schedule()
    assert [s.request_id for s in batch.seqs] == ["a", "b"] and batch.num_tokens == [7, 3]  # b chunked
    a.num_computed_tokens, b.num_computed_tokens = 7, 3
    a.token_ids.append(1)
    batch = sch.schedule()
    assert [(s.request_id, n) for s, n in zip(batch.seqs, batch.num_tokens, strict=True)] == [
        ("a", 1),
        ("b", 4),
    ]


def test_scheduler_respects_max_num_seqs_and_preempts_newest():
    bm = BlockManager(4, 4)
    sch = Scheduler(bm, max_num_seqs=2, max_num_batched_tokens=64)
    a, b, c = seq("a", 4), seq("b", 4, 10), seq("c", 4, 20)
    for s in (a, b, c):
        sch.add(s)
    batch = sch.schedule()
    assert [s.request_id for s in batch.seqs] == ["a", "b"] and len(sch.waiting) == 1
    for s in (a, b):
        s.num_computed_tokens = 4
        s.token_ids.append(1)
    # each now needs a second block: 4 blocks total, a and b hold 2, c waits; then grow a/b to 3 blocks each
    for s in (a, b):
        s.token_ids.extend([1] * 4)
        s.num_computed_tokens = s.num_tokens - 1
    batch = sch.schedule()
    assert sch.preemptions_total >= 1
    assert b.status is Status.WAITING and b.num_computed_tokens == 0 and b.block_table == []
    assert [s.request_id for s in batch.seqs] == ["a"]
    sch.finish(a, "stop")
    sch.finish(b, "abort")
    sch.finish(c, "abort")
    assert bm.num_free == 4 and not sch.has_work()
