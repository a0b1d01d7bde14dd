"""Token bitmasks for checking and timing constrained decoding at a real model's vocabulary size
without its tokenizer: xgrammar matchers of a JSON schema over a synthetic vocabulary, at
different states, and random bits covering every bit position (bit 31 included).
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

VOCAB, BATCH = 128256, 32  # Llama-3's vocabulary; a full decode batch

SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "string", "pattern": "^[a-z]{1,12}$"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}


def grammar_bitmasks(vocab: int, batch: int) -> tuple[Any, Any, float]:
    """(an int32 [batch, ceil(vocab / 32)] bitmask filled by xgrammar matchers inside a string,
    after a number, at the start and before anything, a random bitmask of the same shape, the
    schema's compile seconds). Needs xgrammar."""
    import torch
    import xgrammar as xgr

    rng = random.Random(0)
    alphabet = 'abcdefghijklmnopqrstuvwxyz0123456789 {}[]":,.-_'
    words = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))) for _ in range(vocab * 2)}
    vocab_list = (list(alphabet) + sorted(words))[: vocab - 1] + ["</s>"]
    info = xgr.TokenizerInfo(vocab_list, stop_token_ids=[vocab - 1])
    t = time.perf_counter()
    compiled = xgr.GrammarCompiler(info, max_threads=1).compile_json_schema(
        json.dumps(SCHEMA), any_whitespace=False
    )
    compile_s = time.perf_counter() - t
    matchers = [xgr.GrammarMatcher(compiled) for _ in range(batch)]
    for i, m in enumerate(matchers):  # wide and narrow masks
        m.accept_string(['{"a": "ab', '{"a": "x", "b": 1', "{", ""][i % 4])
    real = xgr.allocate_token_bitmask(batch, vocab)
    xgr.BatchGrammarMatcher(max_threads=1).batch_fill_next_token_bitmask(matchers, real, list(range(batch)))
    gen = torch.Generator().manual_seed(0)
    rand = torch.randint(-(2**31), 2**31, real.shape, generator=gen, dtype=torch.int64).to(torch.int32)
    return real, rand, compile_s
