"""Decode steps on CPU as static kernel calls (runtime/engine/worker/cpu_decode.py).

Every decode step of a greedy run goes both ways, the generic path and the replayed calls, and the
hidden states must be bit-identical (same kernels, same arguments): on plain float32 weights
(MODELDEPLOY_CPU_GEMM=0) here, on quantized GGUF weights in tests/runtime/models/test_quantized.py.
Also: which
steps and models stay generic, and why.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import pytest
from support.decode_paths import check_both_ways

from modeldeploy.kernels import cpu_gemm, cpu_quant, dispatch
from modeldeploy.runtime import LLM, SamplingParams
from modeldeploy.runtime.engine.worker.cpu_decode import CpuDecode

pytestmark = pytest.mark.skipif(
    isinstance(dispatch.cpu_kernels(), str), reason="no C++ compiler: no CPU kernels to replay"
)

PROMPTS = ["the quick brown fox", "a b c d e f g h i j", "hello", "once upon a time there"]


@contextlib.contextmanager
def engine(model, monkeypatch, plain: bool = True, blocks: int = 64, **env: str) -> Iterator[LLM]:
    """An LLM on `model`, with plain float32 layer weights (MODELDEPLOY_CPU_GEMM=0), or packed for
    oneDNN (=1) where `plain` is False, and `env` set while it is built."""
    with monkeypatch.context() as m:
        m.setenv(cpu_gemm.ENV_SWITCH, "0" if plain else "1")
        for k, v in env.items():
            m.setenv(k, v)
        m.setattr(cpu_gemm, "_state", None)  # decided once per process: decide again
        llm = LLM(str(model), dtype="float32", max_model_len=256, num_kv_blocks=blocks)
        try:
            yield llm
        finally:
            llm.engine.close()
            m.setattr(cpu_gemm, "_state", None)


def greedy(llm: LLM, max_tokens: int = 12) -> list[list[int]]:
    # different lengths: the batch shrinks as sequences finish, so several row counts replay
    params = [
        SamplingParams(temperature=0.0, max_tokens=max_tokens + 3 * i, ignore_eos=True) for i in range(4)
    ]
    return [o.token_ids for o in llm.generate(PROMPTS, params)]


def test_plain_float_weights_replay_bit_identical_to_the_generic_path(llama_dir, monkeypatch):
    with engine(llama_dir, monkeypatch) as llm:
        c = llm.engine.runner.cpu_decode
        assert c is not None and c.max_rows == min(cpu_quant.FUSED_MAX_ROWS, cpu_quant.FLOAT_MAX_ROWS)
        kernels = llm.engine.info()["kernels"]
        assert kernels["decode_steps"] == f"static kernel calls up to {c.max_rows} sequences"
        seen = check_both_ways(llm)
        got = greedy(llm)
        assert seen["replayed"] >= 12 and seen["generic"] >= 1  # the prefill step stays generic
    with engine(llama_dir, monkeypatch, MODELDEPLOY_CPU_DECODE="0") as off:
        assert off.engine.runner.cpu_decode is None
        assert greedy(off) == got


def test_steps_it_does_not_take_stay_generic(llama_dir, monkeypatch):
    """More sequences than its rows, a prefill chunk in the step, or an adapter in the batch."""
    with engine(llama_dir, monkeypatch) as llm:
        c = llm.engine.runner.cpu_decode
        assert c is not None
        assert c.eligible(c.max_rows, c.max_rows, False)
        assert not c.eligible(c.max_rows + 1, c.max_rows + 1, False)
        assert not c.eligible(5, 4, False)  # a prefill token in the step
        assert not c.eligible(4, 4, True)
        assert not c.eligible(0, 0, False)


def test_packed_float_weights_replay_bit_identical_too(llama_dir, monkeypatch):
    """oneDNN-packed layers (the float32 default on non-Intel CPUs), their op's result copied into
    the static buffers."""
    with engine(llama_dir, monkeypatch, plain=False) as llm:
        c = llm.engine.runner.cpu_decode
        assert c is not None
        if cpu_gemm.path_in_use() == "onednn":
            assert c.max_rows == min(cpu_quant.FUSED_MAX_ROWS, cpu_gemm.EXACT_ROWS)
        seen = check_both_ways(llm)
        greedy(llm)
        assert seen["replayed"] >= 12


def test_models_it_does_not_take_say_why(tiny_model, llama_dir, caplog, monkeypatch):
    """q/k/v bias (Qwen2), q/k norm (Qwen3), the switch: generic, logged."""
    for model, env, why in [
        (tiny_model("qwen2"), {}, "q/k/v bias"),
        (tiny_model("qwen3"), {}, "q/k/v bias or q/k norm"),
        (llama_dir, {"MODELDEPLOY_CPU_DECODE": "0"}, "MODELDEPLOY_CPU_DECODE=0"),
    ]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="modeldeploy.engine"):
            with engine(model, monkeypatch, plain=False, **env) as llm:
                assert llm.engine.runner.cpu_decode is None
                assert f"CPU decode steps: generic path ({why}" in caplog.text
                assert llm.engine.info()["kernels"]["decode_steps"].startswith(f"generic ({why}")


def test_a_slot_outside_the_cache_raises_naming_it(llama_dir, monkeypatch):
    with engine(llama_dir, monkeypatch, blocks=32) as llm:
        c = llm.engine.runner.cpu_decode
        assert isinstance(c, CpuDecode)
        with pytest.raises(IndexError, match=r"decode step: slot\(s\) outside the cache \(512 slots\)"):
            c.run([5], [3], [10_000], [[0]], [4])
        with pytest.raises(IndexError, match="decode step: position"):
            c.run([5], [1 << 20], [3], [[0]], [4])
