"""xgrammar's token bitmask applied to CUDA float32 logits by the runtime's apply_bitmask (xgrammar's
Triton kernel, the bitmask on the host as in the engine) equals the CPU path and the sampler's
pure-torch twin bit for bit, at batch 32 and a 128256-token vocabulary."""

from __future__ import annotations

import pytest
import torch

from modeldeploy_dev.grammar_masks import BATCH, VOCAB, grammar_bitmasks

pytest.importorskip("xgrammar")

CONSTRAINED = [i for i in range(BATCH) if i % 4]  # a mixed batch: every 4th row unconstrained


@pytest.fixture(scope="module")
def masks():
    real, rand, _ = grammar_bitmasks(VOCAB, BATCH)
    return {"xgrammar-filled": real, "random-bits": rand}


@pytest.mark.parametrize("rows", ["24-of-32", "all"])
@pytest.mark.parametrize("mask", ["xgrammar-filled", "random-bits"])
def test_cuda_bitmask_equals_cpu_and_twin(masks, mask, rows):
    from modeldeploy.runtime.engine.sample.sampler import _apply_bitmask as torch_twin
    from modeldeploy.runtime.engine.structured_output.grammar import apply_bitmask

    bm = masks[mask]
    idx = CONSTRAINED if rows == "24-of-32" else list(range(BATCH))
    logits = torch.randn(BATCH, VOCAB, generator=torch.Generator().manual_seed(1))
    cpu = apply_bitmask(logits.clone(), bm, idx)
    dev = apply_bitmask(logits.to("cuda"), bm, idx).cpu()
    twin = torch_twin(logits.to("cuda"), bm, idx).cpu()
    assert torch.isinf(cpu).sum() > 0  # the mask really masks something
    assert torch.equal(dev, cpu)
    assert torch.equal(twin, cpu)
    free = [i for i in range(BATCH) if i not in idx]
    assert torch.equal(dev[free], logits[free])
