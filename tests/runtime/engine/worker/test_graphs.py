"""CUDA graph decode (engine/worker/graphs.py) on CPU: the static, padded buffers the graphs replay from.

No graph is captured on CPU (`capture_graphs(capture=False)` runs the same buffers eagerly), so what
is checked here is everything but the capture itself: padding a batch up to its bucket changes no
real row's hidden state, padded rows write no KV, only pure-decode steps without LoRA take the path,
and greedy output is token-identical with and without it. The GPU check's `graphs` stage compares
captured replay with eager on a GPU.
"""

from __future__ import annotations

import pytest
import torch

from modeldeploy.runtime import LLM, EngineConfig, SamplingParams
from modeldeploy.runtime.engine.worker.graphs import buckets_for

PROMPTS = ["The quick brown fox", "A paged KV cache", "Kubernetes schedules pods", "x", "Tensor cores"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(llama_dir):
    return LLM(llama_dir, dtype="float32", max_model_len=256, num_kv_blocks=64, max_num_seqs=6)


def test_buckets_cover_every_batch_up_to_max() -> None:
    assert buckets_for(6) == [1, 2, 4, 6] and buckets_for(1) == [1] and buckets_for(32)[-2:] == [24, 32]


def test_greedy_output_is_identical_through_the_padded_static_buffers(llm) -> None:
    runner = llm.engine.runner
    eager = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    runner.capture_graphs(6, capture=False)
    try:
        padded = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        assert runner.graphs.replays > 0  # decode steps did take the path (5 rows: bucket 6, one padded)
    finally:
        runner.graphs = None
    assert padded == eager


def test_padding_changes_no_real_row_and_writes_no_kv(llm) -> None:
    runner = llm.engine.runner
    runner.capture_graphs(6, capture=False)
    g = runner.graphs
    orig = [(k.clone(), v.clone()) for k, v in runner.kv_caches]  # the prefix cache's blocks: put back
    try:
        ids, pos = [5, 9, 11], [3, 7, 2]
        tables = [[1], [2], [3]]
        slots = [t[0] * runner.block_size + p for t, p in zip(tables, pos, strict=True)]
        lens = [p + 1 for p in pos]
        for k, v in runner.kv_caches:  # poison: a padded row writing anywhere shows up as a change
            k.normal_()
            v.normal_()
        before = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
        out = g.run(ids, pos, slots, tables, lens).clone()  # 3 rows: bucket 4, one padded row
        after = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
        for (k0, v0), (k1, v1) in zip(before, after, strict=True):
            changed = ((k0 != k1).flatten(1).any(1) | (v0 != v1).flatten(1).any(1)).nonzero().flatten()
            assert changed.tolist() == [1, 2, 3]  # only the real rows' blocks: the padded row wrote nothing
        for (k, v), (k1, v1) in zip(runner.kv_caches, before, strict=True):
            k.copy_(k1)
            v.copy_(v1)
        one_by_one = torch.cat(
            [
                g.run([i], [p], [s], [t], [n])
                for i, p, s, t, n in zip(ids, pos, slots, tables, lens, strict=True)
            ]
        )
        torch.testing.assert_close(out, one_by_one, rtol=1e-5, atol=1e-5)
    finally:
        runner.graphs = None
        for (k, v), (k0, v0) in zip(runner.kv_caches, orig, strict=True):
            k.copy_(k0)
            v.copy_(v0)


def test_only_pure_decode_steps_without_lora_take_the_path(llm) -> None:
    runner = llm.engine.runner
    runner.capture_graphs(6, capture=False)
    try:
        g = runner.graphs
        assert g.eligible(6, 6, False) and g.eligible(1, 1, False)
        assert not g.eligible(7, 6, False)  # a prefill chunk in the step
        assert not g.eligible(3, 3, True)  # an adapter in the batch
        assert not g.eligible(0, 0, False)
    finally:
        runner.graphs = None


def test_the_flag_names_its_limits() -> None:
    with pytest.raises(ValueError, match="cuda_graphs: needs a CUDA device"):
        EngineConfig(model="m", device="cpu", cuda_graphs=True).validate()
    with pytest.raises(ValueError, match="cuda_graphs: not supported with tensor parallelism"):
        EngineConfig(model="m", device="cuda", cuda_graphs=True, tensor_parallel_size=2).validate()


def test_the_serve_flag_is_refused_on_cpu(capsys) -> None:
    from modeldeploy.cli import main

    assert main(["serve", "--model", "/nonexistent", "--device", "cpu", "--cuda-graphs"]) == 2
    assert "--cuda-graphs: needs a CUDA device" in capsys.readouterr().err
