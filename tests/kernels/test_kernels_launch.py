"""The wrappers' launch arguments, checked on CPU against the CUDA C++ signatures.

With no GPU the kernels cannot run here, so `launch` is replaced by a recorder; every
recorded launch must name a compiled instantiation (kernels/build.py) of the tensor's
dtype, have a non-empty grid, and pass exactly one NumPy scalar of the right width per
C++ parameter (pointer -> uint64, int -> int32, long long -> int64, float -> float32).
The checks' problems (`modeldeploy_dev.kernel_checks`) are built on CPU too, so their inputs and twins
are exercised in CI.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from modeldeploy.kernels import activation, attention, build, cache, lora, norm, rotary
from modeldeploy_dev import kernel_checks as checks

pytest.importorskip("cupy", reason="cupy is a dev dependency")


def cpp_params(family: str, template: str) -> list[type]:
    """NumPy scalar type expected for each parameter of `template`'s __global__ function."""
    src = re.sub(r"//[^\n]*", "", build.source(family))  # comments may hold ')'
    m = re.search(rf"__global__ void(?: __launch_bounds__\([^)]*\))?\s*{template}\(([^)]*)\)", src, re.S)
    assert m, template
    params = [p.strip() for p in m.group(1).split(",")]
    kinds = []
    for p in params:
        if "*" in p:
            kinds.append(np.uint64)
        elif p.startswith("long long"):
            kinds.append(np.int64)
        elif p.startswith("int"):
            kinds.append(np.int32)
        elif p.startswith("float"):
            kinds.append(np.float32)
        else:
            raise AssertionError(f"unhandled parameter {p!r}")
    return kinds


@pytest.fixture
def launches(monkeypatch):
    calls: list[tuple] = []

    def record(family, name, device, grid, block, args):
        calls.append((family, name, grid, block, args))

    for mod in (activation, attention, cache, lora, norm, rotary):
        monkeypatch.setattr(mod, "launch", record)
    monkeypatch.setattr(attention, "_sm_count", lambda device: 132)
    return calls


def check_launch(call, dtype: torch.dtype):
    family, name, grid, block, args = call
    assert name in build.name_expressions(family)
    assert build.CTYPES[str(dtype)[6:]] in name
    assert all(g >= 1 for g in grid) and 32 <= block[0] <= 1024 and block[0] % 32 == 0
    template = name.split("<")[0]
    expected = cpp_params(family, template)
    assert [type(a) for a in args] == expected, (name, [type(a) for a in args], expected)


@pytest.mark.parametrize(
    "p", checks.correctness_problems("cpu"), ids=lambda p: f"{p.kernel}-{str(p.dtype)[6:]}-{p.label}"
)
def test_problem_launches_match_signatures(p, launches):
    inputs = p.setup(5)
    twin_in = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    want = p.twin(twin_in)
    assert all(torch.isfinite(w.double()).all() for w in want)
    assert p.nbytes(inputs) > 0
    p.cuda(inputs)  # recorded, not run
    assert launches, "the wrapper fell back to the twin instead of launching"
    for call in launches:
        check_launch(call, p.dtype)


def test_split_k_launches_reduce(launches):
    p = checks.decode_problem([1, 17, 700, 33], 2, 4, 128, torch.bfloat16, device="cpu")
    p.cuda(p.setup(0))
    assert [c[1].split("<")[0] for c in launches] == [
        "paged_attention_kernel",
        "paged_attention_reduce_kernel",
    ]
    assert launches[0][2][2] > 1  # grid.z = partitions


def test_unaligned_rows_take_the_scalar_path(launches):
    x = torch.randn(3, 100, dtype=torch.float16)
    norm.rms_norm(x, torch.ones(100, dtype=torch.float16), 1e-6)
    norm.rms_norm(torch.randn(3, 128, dtype=torch.float16), torch.ones(128, dtype=torch.float16), 1e-6)
    assert launches[0][1].endswith(", 1>") and launches[1][1].endswith(", 8>")


def test_unsupported_layouts_fall_back_to_twins(launches):
    q = torch.randn(2, 6, 96)  # head_dim 96: no instantiation
    kc = torch.randn(4, 16, 2, 96)
    out = attention.paged_attention_decode(
        q, kc, kc, torch.tensor([[0], [1]], dtype=torch.int32), torch.tensor([3, 5], dtype=torch.int32), 0.1
    )
    assert out.shape == q.shape and not launches


def test_partitions_cover_all_keys():
    for base, keys in [(8, 1024), (1, 100_000), (600, 4096), (4, 16), (2, 129)]:
        p, size = attention.partitions(base, keys, 132)
        assert p * size >= keys and (p - 1) * size < keys and (p == 1 or size % 16 == 0)
