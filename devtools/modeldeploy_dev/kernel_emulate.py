"""Run the CUDA sources on the CPU: a debugging and CI aid for machines without a GPU.

The exact `.cu` text (as `build.source` gives it) is compiled by the host C++ compiler after
a small prelude that maps the CUDA built-ins onto the host: one `std::thread` per CUDA
thread, blocks one after another, `__shared__` as `static` (so shared by the block's
threads), `__syncthreads` as a block barrier, `__shfl_xor_sync` through a per-warp buffer and
barrier, and fp16/bf16 as host types with round-to-nearest-even conversions.

`launch(family, name, device, grid, block, args)` has the signature of
`kernels.launch.launch`, so the wrappers run unchanged on CPU tensors with it patched in:
this checks indexing, masking, split-K merging and argument order end to end. It does not
check anything GPU-specific (timing, coalescing, real warp divergence, memory model).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import numpy as np

from modeldeploy.kernels import build

PRELUDE = r"""
#include <algorithm>
#include <barrier>
#include <cstdint>
#include <cstring>
#include <math.h>
#include <memory>
#include <thread>
#include <vector>

struct dim3 { unsigned x = 1, y = 1, z = 1; };
namespace emu {
inline dim3 grid_dim, block_dim;
inline thread_local dim3 thread_idx, block_idx;
inline std::barrier<>* block_barrier = nullptr;
inline std::vector<std::barrier<>*> warp_barriers;
inline float lane_buf[1024];

template <class F> void launch(dim3 grid, dim3 block, F body) {
  grid_dim = grid; block_dim = block;
  const unsigned n = block.x, warps = (n + 31) / 32;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        std::barrier<> bar(n);
        block_barrier = &bar;
        std::vector<std::unique_ptr<std::barrier<>>> wb;
        warp_barriers.clear();
        for (unsigned w = 0; w < warps; ++w) {
          wb.emplace_back(new std::barrier<>(std::min(32u, n - 32 * w)));
          warp_barriers.push_back(wb.back().get());
        }
        std::vector<std::thread> threads;
        for (unsigned t = 0; t < n; ++t)
          threads.emplace_back([=] { thread_idx = {t, 0, 0}; block_idx = {x, y, z}; body(); });
        for (auto& th : threads) th.join();
      }
}
}  // namespace emu

#define threadIdx emu::thread_idx
#define blockIdx emu::block_idx
#define blockDim emu::block_dim
#define gridDim emu::grid_dim
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __shared__ static
using std::min;
using std::max;

inline void __syncthreads() { emu::block_barrier->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int offset) {
  const unsigned t = threadIdx.x, w = t / 32;
  emu::lane_buf[t] = v;
  emu::warp_barriers[w]->arrive_and_wait();
  const float r = emu::lane_buf[w * 32 + ((t % 32) ^ offset)];
  emu::warp_barriers[w]->arrive_and_wait();
  return r;
}
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __int_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }

struct __half { _Float16 v; };
inline float __half2float(__half h) { return (float)h.v; }
inline __half __float2half_rn(float f) { return __half{(_Float16)f}; }
struct __nv_bfloat16 { uint16_t bits; };
inline float __bfloat162float(__nv_bfloat16 b) {
  uint32_t u = (uint32_t)b.bits << 16; float f; std::memcpy(&f, &u, 4); return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u; std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{(uint16_t)((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return __nv_bfloat16{(uint16_t)(u >> 16)};
}
"""

_KERNEL = re.compile(
    r"template\s*<([^>]*)>\s*__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?"
    r"(\w+)\s*\(([^)]*)\)",
    re.S,
)


def available() -> bool:
    return shutil.which("g++") is not None


def _signatures(family: str) -> dict[str, tuple[list[str], list[str]]]:
    """kernel name -> (template parameter names, parameter types without names)."""
    src = re.sub(r"//[^\n]*", "", build.source(family))
    out = {}
    for m in _KERNEL.finditer(src):
        tparams = [p.split()[-1] for p in m.group(1).split(",")]
        types = [re.sub(r"\s*\b\w+\s*$", "", p.strip()) for p in m.group(3).split(",")]
        out[m.group(2)] = (tparams, types)
    return out


def _glue(family: str, names: tuple[str, ...]) -> str:
    sigs = _signatures(family)
    parts = []
    for i, name in enumerate(names):
        kname, targs = name.split("<", 1)
        tparams, types = sigs[kname]
        targs = [a.strip() for a in targs.rstrip(">").split(",")]
        concrete = []
        for t in types:
            for p, a in zip(tparams, targs, strict=True):
                t = re.sub(rf"\b{p}\b", a, t)
            concrete.append(t)
        decl = ", ".join(f"{t} p{j}" for j, t in enumerate(concrete))
        call = ", ".join(f"p{j}" for j in range(len(concrete)))
        parts.append(
            f'extern "C" void emu_{i}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, {decl}) '
            f"{{ emu::launch(dim3{{gx, gy, gz}}, dim3{{bx, 1, 1}}, [=] {{ {name}({call}); }}); }}"
        )
    return "\n".join(parts)


@cache
def _library(family: str) -> ctypes.CDLL:
    names = build.name_expressions(family)
    src = (
        PRELUDE
        + re.sub(r"#include <cuda_(fp16|bf16)\.h>", "", build.source(family))
        + "\n"
        + _glue(family, names)
    )
    key = hashlib.sha256(src.encode()).hexdigest()[:16]
    d = Path(tempfile.gettempdir()) / "modeldeploy-emu"
    d.mkdir(exist_ok=True)
    lib = d / f"{family}-{key}.so"
    if not lib.exists():  # per-process temp names: parallel test runs are safe
        cpp = d / f"{family}-{key}.{os.getpid()}.cpp"
        cpp.write_text(src)
        tmp = d / f"{family}-{key}.{os.getpid()}.so"
        subprocess.run(
            ["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-w", str(cpp), "-o", str(tmp)],
            check=True,
            capture_output=True,
            text=True,
        )
        tmp.replace(lib)
        cpp.unlink()
    return ctypes.CDLL(str(lib))


_CTYPES = {
    np.uint64: ctypes.c_void_p,
    np.int64: ctypes.c_longlong,
    np.int32: ctypes.c_int,
    np.float32: ctypes.c_float,
}


def launch(
    family: str, name: str, device, grid: tuple[int, ...], block: tuple[int, ...], args: tuple
) -> None:
    """Drop-in for `kernels.launch.launch` on CPU tensors (pointers are host addresses)."""
    fn = getattr(_library(family), f"emu_{build.name_expressions(family).index(name)}")
    g = (*grid, 1, 1)[:3]
    cargs = [_CTYPES[type(a)](int(a) if isinstance(a, np.integer) else float(a)) for a in args]
    fn(*(ctypes.c_uint(x) for x in (*g, block[0])), *cargs)
