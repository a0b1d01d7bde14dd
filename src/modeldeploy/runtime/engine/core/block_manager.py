"""Paged KV cache bookkeeping: fixed-size blocks, ref counts, a free list, and a
prefix cache keyed by chained block hashes.

A block's hash covers its tokens and the hash of the block before it, seeded with the
bundle id and the sequence's LoRA adapter, so a hit means the same bundle and the same
adapter saw the same prefix (an adapter changes every layer's K/V, so a base-model or other
adapter's block is never valid for it). Under a length-dependent RoPE (dynamic, longrope) the seed
also holds the prompt's `rope_key` (models/rope.py `Rope.prefix_key`): a block's keys are rotated
with frequencies chosen by the prompt's length, and only a prompt with the same key may reuse them.
Blocks are registered
only once their KV is computed, and freed blocks keep their hash (LRU order) until
they are reused, so a later request with the same prefix skips that prefill.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from modeldeploy.runtime.engine.core.sequence import Sequence


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: tuple[int, ...] = field(default_factory=tuple)


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        bundle_id: str = "",
        enable_prefix_caching: bool = True,
        rope_key: Callable[[int], int] | None = None,
    ):
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))  # LRU first
        self.cached: dict[int, int] = {}  # hash -> block id
        self.root_hash = hash(("modeldeploy-prefix", bundle_id))
        self.prefix_caching = enable_prefix_caching
        self.rope_key = rope_key  # prompt length -> what its blocks' rotation depends on (None: nothing)
        self.hits = 0  # cached tokens reused (counter)
        self.forked_tokens = 0  # tokens whose KV a forked sequence (n > 1) took by reference (counter)

    @property
    def num_total(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self.free)

    def usage(self) -> float:
        return 1.0 - self.num_free / self.num_total

    def blocks_needed(self, num_tokens: int) -> int:
        return (num_tokens + self.block_size - 1) // self.block_size

    def _block_hash(self, parent: int | None, tokens: tuple[int, ...]) -> int:
        return hash((parent, tokens))

    def _root(self, seq: Sequence) -> int:
        """Seed of seq's hash chain: the bundle's, and for an adapter the bundle's + the adapter's;
        under a length-dependent RoPE also its prompt's rope key."""
        root = self.root_hash
        if seq.adapter_id >= 0:
            root = hash((root, "adapter", seq.adapter_id))
        if self.rope_key is not None:
            root = hash((root, "rope", self.rope_key(seq.num_prompt_tokens)))
        return root

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Cached block ids covering a prefix of seq (never its last token, which must be computed).
        Nothing for a sequence still scoring its prompt: a cached block would skip positions it must score."""
        if not self.prefix_caching or seq.scores_prompt:
            return []
        hits, parent, bs = [], self._root(seq), self.block_size
        for i in range((seq.num_tokens - 1) // bs):
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = self._block_hash(parent, tokens)
            bid = self.cached.get(h)
            if bid is None or self.blocks[bid].token_ids != tokens:
                break
            hits.append(bid)
            parent = h
        return hits

    def can_admit(self, seq: Sequence, hits: list[int], num_new_tokens: int) -> bool:
        """Enough free blocks to hold the cached prefix plus `num_new_tokens` more?"""
        need = self.blocks_needed(len(hits) * self.block_size + num_new_tokens) - len(hits)
        free_hits = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        return need <= self.num_free - free_hits

    def admit(self, seq: Sequence, hits: list[int]) -> None:
        """Take the cached prefix blocks; the sequence starts computing after them."""
        assert not seq.block_table
        for bid in hits:
            block = self.blocks[bid]
            if block.ref_count == 0:
                del self.free[bid]
            block.ref_count += 1
        seq.block_table = list(hits)
        seq.num_hashed_blocks = len(hits)
        seq.num_computed_tokens = len(hits) * self.block_size
        self.hits += seq.num_computed_tokens

    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(num_tokens) - len(seq.block_table) <= self.num_free

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Make seq's block table cover `num_tokens` tokens."""
        while len(seq.block_table) < self.blocks_needed(num_tokens):
            bid, _ = self.free.popitem(last=False)
            block = self.blocks[bid]
            if block.hash is not None and self.cached.get(block.hash) == bid:
                del self.cached[block.hash]
            block.hash, block.token_ids, block.ref_count = None, (), 1
            seq.block_table.append(bid)

    def commit(self, seq: Sequence) -> None:
        """Register seq's newly completed, computed blocks in the prefix cache."""
        if not self.prefix_caching:
            return
        bs = self.block_size
        full = min(seq.num_computed_tokens, seq.num_tokens) // bs
        parent = self._root(seq)
        if seq.num_hashed_blocks:
            parent = self.blocks[seq.block_table[seq.num_hashed_blocks - 1]].hash
        for i in range(seq.num_hashed_blocks, full):
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = self._block_hash(parent, tokens)
            block = self.blocks[seq.block_table[i]]
            block.hash, block.token_ids = h, tokens
            self.cached.setdefault(h, block.block_id)
            parent = h
        seq.num_hashed_blocks = max(seq.num_hashed_blocks, full)

    def release(self, seq: Sequence) -> None:
        """Drop seq's references; unreferenced blocks go to the free list (keeping their hash)."""
        for bid in reversed(seq.block_table):
            block = self.blocks[bid]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {bid} ref count below zero"
            if block.ref_count == 0:
                self.free[bid] = None
        seq.block_table = []
        seq.num_hashed_blocks = 0

    def fork(self, parent: Sequence, child: Sequence) -> list[tuple[int, int]]:
        """Give child parent's computed KV: full blocks shared by reference, the partial last block
        copied into a fresh one. Returns the (src, dst) block copies the caller must make."""
        assert not child.block_table
        bs = self.block_size
        full = parent.num_computed_tokens // bs
        for bid in parent.block_table[:full]:
            self.blocks[bid].ref_count += 1
        child.block_table = list(parent.block_table[:full])
        child.num_hashed_blocks = min(parent.num_hashed_blocks, full)
        child.num_computed_tokens = parent.num_computed_tokens
        self.forked_tokens += full * bs
        if parent.num_computed_tokens % bs == 0:
            return []
        self.grow(child, parent.num_computed_tokens)
        return [(parent.block_table[full], child.block_table[full])]
