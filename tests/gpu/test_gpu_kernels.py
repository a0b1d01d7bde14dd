"""CuPy kernels against their torch twins on a CUDA device (skipped without one).

Fresh random inputs per case (seeded by case index), outputs poisoned with NaN before each
call, relative-error bounds per dtype (`modeldeploy_dev.kernel_checks.TOL`; write_kv must be exact).
"""

from __future__ import annotations

import pytest
import torch

from modeldeploy_dev import kernel_checks as checks


def _cuda_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device: kernels are checked against the twins only on a GPU machine"
    try:
        import cupy  # noqa: F401
    except ImportError:
        return "cupy not installed (pip install modeldeploy[gpu])"
    return None


REASON = _cuda_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

PROBLEMS = checks.correctness_problems("cuda") if REASON is None else []
IDS = [f"{p.kernel}-{str(p.dtype)[6:]}-{p.label}" for p in PROBLEMS]


@pytest.mark.parametrize("index", range(len(PROBLEMS) or 1), ids=IDS or None)
def test_kernel_matches_twin(index):
    result = checks.run(PROBLEMS[index], seed=1000 + index)
    assert result["ok"], result


ATTN = [i for i, p in enumerate(PROBLEMS) if p.kernel.startswith("paged_attention")]


@pytest.mark.parametrize("index", ATTN or [0], ids=[IDS[i] for i in ATTN] or None)
def test_attention_unroll8_matches_twin(index, monkeypatch):
    """UNROLL=8 instantiations (used where build.ATTN_UNROLL8 lists the shape)."""
    from modeldeploy.kernels import attention

    monkeypatch.setattr(attention, "UNROLL", 8)
    result = checks.run(PROBLEMS[index], seed=2000 + index)
    assert result["ok"], result


def test_dispatch_routes_cuda_tensors_to_cupy():
    from modeldeploy.kernels import activation, dispatch

    x = torch.randn(4, 64, device="cuda")
    dispatch.silu_and_mul(x)
    assert dispatch._CUDA["silu_and_mul"] is activation.silu_and_mul
    assert dispatch._impl("silu_and_mul", x) is activation.silu_and_mul


def test_launch_follows_torch_current_stream():
    """A kernel queued on a side stream must be ordered after that stream's prior work."""
    from modeldeploy.kernels import activation

    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.randn(256, 8192, device="cuda")
        x.mul_(2.0)  # queued on s, before the kernel
        out = activation.silu_and_mul(x)
    s.synchronize()
    torch.testing.assert_close(out, torch.nn.functional.silu(x[:, :4096]) * x[:, 4096:])
