"""CuPy plumbing for the kernel wrappers: compile each template instantiation once per
device, then launch it on torch's current stream with raw data pointers (zero copy, no sync).

Arguments are passed as NumPy scalars whose width matches the C++ parameter:
pointers as uint64, `int` as int32, `long long` as int64, `float` as float32.
"""

from __future__ import annotations

from functools import cache

import cupy
import numpy as np
import torch

from modeldeploy.kernels import build

_modules: list[cupy.RawModule] = []


@cache
def kernel(family: str, name: str, device: int) -> cupy.RawKernel:
    """Compile one instantiation (CuPy caches the binary on disk) and load it on `device`.

    One module per instantiation keeps first-use compile time to what is launched; CI
    compiles every instantiation (tests/kernels/test_kernels_nvrtc.py).
    """
    if name not in build.name_expressions(family):
        raise KeyError(f"{name} is not an instantiation of {family}.cu listed in kernels/build.py")
    with cupy.cuda.Device(device):
        mod = cupy.RawModule(
            code=build.source(family), options=build.nvrtc_options(), name_expressions=(name,)
        )
        _modules.append(mod)  # keep the module (and its loaded binary) alive
        return mod.get_function(name)  # compiles now: fail here, not mid-step


_streams: dict[int, cupy.cuda.Stream] = {}


def _stream(device: torch.device) -> cupy.cuda.Stream:
    """CuPy view of torch's current stream on `device` (cached per stream handle)."""
    ts = torch.cuda.current_stream(device)
    s = _streams.get(ts.cuda_stream)
    if s is None:
        try:  # CuPy >= 14 with torch's __cuda_stream__
            s = cupy.cuda.Stream.from_external(ts)
        except (AttributeError, TypeError):  # older CuPy or torch
            s = cupy.cuda.ExternalStream(ts.cuda_stream, device.index)
        _streams[ts.cuda_stream] = s
    return s


def launch(
    family: str, name: str, device: torch.device, grid: tuple[int, ...], block: tuple[int, ...], args: tuple
) -> None:
    """Launch `name` from `family` on `device`'s current torch stream."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    device = torch.device("cuda", index)
    fn = kernel(family, name, index)
    with cupy.cuda.Device(index), _stream(device):
        fn(grid, block, args)


def ptr(t: torch.Tensor | None) -> np.uint64:
    """Device pointer of a tensor's first element (nullptr for None)."""
    return np.uint64(0 if t is None else t.data_ptr())


def aligned(t: torch.Tensor, nbytes: int = 16) -> bool:
    return t.data_ptr() % nbytes == 0


i32, i64, f32 = np.int32, np.int64, np.float32


def dtype_name(t: torch.Tensor) -> str:
    """'float32' / 'float16' / 'bfloat16' (keys of build.CTYPES), or another torch name."""
    return str(t.dtype).removeprefix("torch.")


def rows(t: torch.Tensor) -> torch.Tensor:
    """2-D [rows, last] view (copy only if the last dim is strided or the view is impossible)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def vec_for(dtype: str, *tensors_or_sizes: torch.Tensor | int) -> int:
    """16-byte vector width if every size/stride is a multiple of it and every pointer is
    16-byte aligned, else 1 (scalar path)."""
    v = build.vec_width(dtype)
    for x in tensors_or_sizes:
        ok = aligned(x) if isinstance(x, torch.Tensor) else x % v == 0
        if not ok:
            return 1
    return v


def threads_for(work_items: int, cap: int = 1024) -> int:
    """Block size: enough 32-thread warps to cover work_items once, at most cap."""
    return max(32, min(cap, (work_items + 31) // 32 * 32))
