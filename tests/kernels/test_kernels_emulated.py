"""The CUDA kernels, run on the CPU through `modeldeploy_dev.kernel_emulate` (g++ + one host thread per CUDA
thread), against their torch twins, through the unchanged wrappers.

This is what lets CI (no GPU) catch indexing, masking, split-K and argument-order bugs in
the .cu sources; the same problems run on a real GPU in tests/gpu/test_gpu_kernels.py. Outputs
are poisoned with NaN first (`checks.run` semantics), inputs are fresh per case.
"""

from __future__ import annotations

import pytest
import torch

from modeldeploy.kernels import activation, attention, cache, lora, norm, rotary
from modeldeploy_dev import kernel_checks as checks
from modeldeploy_dev import kernel_emulate as emulate

pytestmark = pytest.mark.skipif(
    not emulate.available(), reason="g++ not found: cannot emulate CUDA on the CPU"
)

f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16
PROBLEMS = [
    checks.rms_norm_problem(3, 512, f32, True, "cpu"),  # 16-byte vector path
    checks.rms_norm_problem(4, 100, bf16, True, "cpu"),  # scalar path
    checks.rms_norm_problem(2, 256, f16, False, "cpu"),
    checks.silu_and_mul_problem(3, 256, bf16, "cpu"),
    checks.silu_and_mul_problem(2, 36, f32, "cpu"),
    checks.rotary_problem(3, 4, 2, 64, f32, "cpu"),
    checks.rotary_problem(2, 2, 1, 128, bf16, "cpu"),
    checks.rotary_problem(3, 2, 2, 36, f16, "cpu"),  # scalar path (D/2 = 18)
    checks.write_kv_problem(9, 2, 64, f16, "cpu"),
    checks.write_kv_problem(5, 1, 36, f32, "cpu"),
    checks.decode_problem([1, 17, 300, 33], 2, 4, 128, f32, "cpu"),  # split-K (see fixture)
    checks.decode_problem([40, 16, 3], 4, 1, 64, bf16, "cpu"),
    checks.decode_problem([20, 70], 1, 8, 64, f16, "cpu"),
    checks.prefill_problem([37, 30, 5], [7, 20, 1], 2, 4, 64, f32, "cpu"),
    checks.prefill_problem([18, 9], [0, 9], 1, 2, 128, bf16, "cpu"),  # a sequence with no new tokens
    checks.lora_problem(9, 64, 96, 12, 3, f32, "cpu"),
    checks.lora_problem(6, 40, 36, 8, 2, bf16, "cpu"),
    checks.lora_problem(5, 33, 20, 4, 1, f16, "cpu"),
]


@pytest.fixture(autouse=True)
def emulated(monkeypatch):
    launches = []

    def record(*a, **k):
        launches.append(a[1])
        emulate.launch(*a, **k)

    for mod in (activation, attention, cache, lora, norm, rotary):
        monkeypatch.setattr(mod, "launch", record)
    monkeypatch.setattr(attention, "_sm_count", lambda device: 16)  # small "GPU": split-K kicks in
    return launches


@pytest.mark.parametrize(
    "index", range(len(PROBLEMS)), ids=[f"{p.kernel}-{str(p.dtype)[6:]}-{p.label}" for p in PROBLEMS]
)
def test_emulated_kernel_matches_twin(index, emulated):
    p = PROBLEMS[index]
    d = p.setup(index)
    twin_in = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in d.items()}
    got, want = p.cuda(d), p.twin(twin_in)
    assert emulated, "no kernel was launched"
    tol = 0.0 if p.kernel == "write_kv" else checks.TOL[p.dtype]
    for g, w in zip(got, want, strict=True):
        err = checks.rel_err(g, w)
        assert err <= tol, (p.label, err)


def test_split_k_really_split(emulated):
    p = checks.decode_problem([1, 17, 300, 33], 2, 4, 128, f32, "cpu")
    d = p.setup(0)
    p.cuda(d)
    assert any(n.startswith("paged_attention_reduce_kernel") for n in emulated)


@pytest.mark.slow
def test_engine_with_emulated_kernels_matches_transformers(emulated, monkeypatch, tiny_model):
    """The whole engine on CPU with every hot op routed to the (emulated) CUDA kernels:
    greedy tokens must equal transformers'. Checks the engine's real layouts (q/k/v views
    of qkv, slot mappings, block tables, mixed decode + prefill batches) against the kernels."""
    from transformers import AutoModelForCausalLM

    from modeldeploy.kernels import cuda_ops, dispatch
    from modeldeploy.runtime import LLM, SamplingParams

    monkeypatch.setattr(dispatch, "_impl", lambda name, t: cuda_ops.KERNELS[name])
    model_dir = tiny_model("llama", hidden_size=256, num_heads=4, num_kv_heads=2)
    prompts = [[5, 6, 7, 8, 9, 10, 11], list(range(20, 60))]
    outs = LLM(model_dir, dtype="float32", device="cpu").generate(
        prompts, SamplingParams(temperature=0, max_tokens=8)
    )
    kinds = {n.split("<")[0] for n in emulated}
    assert kinds >= {
        "rms_norm_kernel",
        "silu_and_mul_kernel",
        "rotary_kernel",
        "write_kv_kernel",
        "paged_attention_kernel",
    }, kinds
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for p, o in zip(prompts, outs, strict=True):
        x = torch.tensor([p])
        with torch.no_grad():
            g = hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=8)
        assert o.token_ids == g[0, len(p) :].tolist()


@pytest.mark.parametrize(
    "make",
    [
        lambda: checks.decode_problem([1, 17, 300, 33], 2, 4, 128, bf16, "cpu"),
        lambda: checks.prefill_problem([37, 21], [7, 21], 1, 8, 128, f16, "cpu"),
    ],
    ids=["decode", "prefill"],
)
def test_unroll8_variant_matches_twin(make, emulated, monkeypatch):
    """The UNROLL=8 instantiations the GPU check times against the default."""
    monkeypatch.setattr(attention, "UNROLL", 8)
    p = make()
    d = p.setup(3)
    twin_in = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in d.items()}
    got, want = p.cuda(d), p.twin(twin_in)
    assert any(n.endswith(", 8>") for n in emulated), emulated
    assert checks.rel_err(got[0], want[0]) <= checks.TOL[p.dtype]


@pytest.mark.slow
def test_engine_with_emulated_lora_kernels_matches_peft(emulated, monkeypatch, tiny_model, tmp_path):
    """Base, adapter A and adapter B rows in one batch with every hot op, the LoRA shrink/expand
    kernels included, routed to the (emulated) CUDA kernels: greedy tokens equal transformers + peft."""
    from modeldeploy.kernels import cuda_ops, dispatch
    from modeldeploy.runtime import LLM, SamplingParams
    from modeldeploy_dev.lora_fixtures import hf_greedy, make_adapters

    monkeypatch.setattr(dispatch, "_impl", lambda name, t: cuda_ops.KERNELS[name])
    base = tiny_model("llama")
    adapters = make_adapters(base, tmp_path)
    pins = [{"name": n, "path": str(p)} for n, p in adapters.items()]
    prompts = [[5, 6, 7, 8, 9], list(range(20, 40)), [300, 4, 77]]
    names = [None, "tenant-a", "tenant-b"]
    llm = LLM(base, dtype="float32", device="cpu", adapters=pins)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4), adapter=names)
    assert {n.split("<")[0] for n in emulated} >= {"lora_shrink_kernel", "lora_expand_kernel"}
    for p, n, o in zip(prompts, names, outs, strict=True):
        assert o.token_ids == hf_greedy(base, adapters[n] if n else None, [p], 4)[0], n
