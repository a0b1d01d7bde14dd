"""Runs one LLM's decode through both CPU paths (fused and torch) and compares them."""

from __future__ import annotations

import torch

from modeldeploy.runtime import LLM


def check_both_ways(llm: LLM) -> dict[str, int]:
    """Wrap the runner so each step runs generically first, then as it would anyway; assert equal."""
    runner = llm.engine.runner
    plain = runner.execute
    seen = {"replayed": 0, "generic": 0}

    def execute(plan, lora=None):
        c = runner.cpu_decode
        runner.cpu_decode = None
        want = plain(plan, lora).clone()
        runner.cpu_decode = c
        before = c.steps if c is not None else 0
        got = plain(plan, lora)
        replayed = c is not None and c.steps > before
        seen["replayed" if replayed else "generic"] += 1
        assert torch.equal(got, want), f"step of {len(plan.ids)} tokens differs (replayed: {replayed})"
        return got

    runner.execute = execute
    return seen
