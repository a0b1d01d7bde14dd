"""Compiling the CPU kernels (cpu/paged_attention.cpp, cpu/quant_gemm.cpp): here on first use, or ahead
of time for an image.

Two ways to get a shared object, tried in this order by `cpu_attention` and `cpu_quant`:

1. **Prebuilt** (the runtime image): `python3 cpu_build.py --out DIR` compiles one object per
   x86-64 micro-architecture level (v4 = AVX-512, v3 = AVX2 + FMA, v2 = SSE4.2) in a builder
   stage that has a compiler, and copies the OpenMP runtime next to them (found through an
   `$ORIGIN` rpath), so the slim final image needs neither a compiler nor libgomp from apt. At
   load, the highest level this CPU supports is picked; a file name carries the source's hash,
   so an image whose objects were built from other source never loads them.
2. **Built here** with `-march=native`, into a cache directory, when a compiler is on PATH
   (an install from the sdist, a checkout).

This module is stdlib only (no torch, no package imports): the builder stage runs it as a plain
script before anything is installed.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).parent / "cpu" / "paged_attention.cpp"
QUANT_SOURCE = Path(__file__).parent / "cpu" / "quant_gemm.cpp"  # weight-only int4/int8 GEMM (cpu_quant)
SOURCES = (SOURCE, QUANT_SOURCE)  # what an image prebuilds
FLAGS = ("-O3", "-fopenmp", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno")
ENV_PREBUILT = "MODELDEPLOY_CPU_KERNELS_PREBUILT"  # directory of prebuilt objects (the image sets it)
# x86-64 psABI levels, highest first, with the /proc/cpuinfo flags each one needs (gcc >= 11).
LEVELS: dict[str, tuple[str, ...]] = {
    "x86-64-v4": ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
    "x86-64-v3": ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"),
    "x86-64-v2": ("cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"),
}
_LEVEL_NEEDS = {  # a level needs its own flags and those of every level below it
    name: tuple(f for lower in list(LEVELS)[i:] for f in LEVELS[lower]) for i, name in enumerate(LEVELS)
}


def cpuinfo_line(key: str) -> str:
    """The first line of /proc/cpuinfo starting with `key` ('' where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(key):
                return line
    except OSError:
        pass
    return ""


def cpu_flags() -> str:
    """The `flags` line of /proc/cpuinfo ('' where there is none)."""
    return cpuinfo_line("flags")


def compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def source_hash(source: Path = SOURCE) -> str:
    return hashlib.sha256(source.read_bytes()).hexdigest()[:16]


def prebuilt_name(level: str, source: Path = SOURCE) -> str:
    return f"{source.stem}_{source_hash(source)}_{level}.so"


def levels_of(flags: str) -> list[str]:
    """The prebuilt levels this CPU can run, best first (none off x86-64)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return []
    have = set(flags.split())
    return [name for name, needs in _LEVEL_NEEDS.items() if have.issuperset(needs)]


def find_prebuilt(
    directory: Path, flags: str | None = None, source: Path = SOURCE
) -> tuple[Path, str] | None:
    """(object, level) of the best prebuilt object in `directory` for this CPU and this source."""
    for level in levels_of(cpu_flags() if flags is None else flags):
        path = directory / prebuilt_name(level, source)
        if path.is_file():
            return path, level
    return None


def compile_to(
    cxx: str, out: Path, arch_flags: tuple[str, ...], extra: tuple[str, ...] = (), source: Path = SOURCE
) -> None:
    """Compile `source` into `out` atomically (concurrent builders, e.g. tensor-parallel ranks, agree)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".so.tmp")
    os.close(fd)
    proc = subprocess.run(
        [cxx, *FLAGS, *arch_flags, str(source), "-o", tmp, *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(f"{cxx} failed: {proc.stderr.strip()[-2000:]}")
    os.chmod(tmp, 0o755)  # mkstemp made it 0600: an image's non-root user must be able to load it
    os.replace(tmp, out)


def build_here(cache_dirs: list[Path], source: Path = SOURCE) -> Path:
    """The `-march=native` object for this CPU and compiler, built into the first writable cache dir."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler on PATH (g++, c++, clang++; or set CXX)")
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256(
        b"\0".join([source.read_bytes(), version.encode(), " ".join(FLAGS).encode(), cpu_flags().encode()])
    )
    name = f"{source.stem}_{key.hexdigest()[:16]}.so"
    errors = []
    for d in cache_dirs:
        target = d / name
        if target.exists():
            return target
        try:
            compile_to(cxx, target, ("-march=native",), source=source)
            return target
        except OSError as e:
            errors.append(f"{d}: {e}")
    raise RuntimeError("no writable cache directory: " + "; ".join(errors))


def open_library(path: Path, abi_symbol: str, abi_version: int, signatures: dict[str, tuple[list[Any], Any]]):
    """Load a built object, check its ABI version and declare each function's (argtypes, restype):
    an object built from other sources raises here, and its caller falls back to the torch twins."""
    lib = ctypes.CDLL(str(path))
    if getattr(lib, abi_symbol)() != abi_version:
        raise RuntimeError("ABI version mismatch")
    for name, (argtypes, restype) in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, restype
    return lib


def _libgomp(cxx: str) -> Path:
    out = subprocess.run([cxx, "-print-file-name=libgomp.so.1"], capture_output=True, text=True, timeout=30)
    path = Path(out.stdout.strip()).resolve()
    if not path.is_file():
        raise RuntimeError(
            f"{cxx} -print-file-name=libgomp.so.1 found no OpenMP runtime ({out.stdout.strip()!r})"
        )
    return path


def build_prebuilt(out: Path, levels: list[str], sources: tuple[Path, ...] = (SOURCE,)) -> list[Path]:
    """One object per source and level in `out`, plus libgomp.so.1 beside them (their rpath is $ORIGIN)."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler on PATH (g++, c++, clang++; or set CXX)")
    built = []
    for source in sources:
        for level in levels:
            target = out / prebuilt_name(level, source)
            compile_to(cxx, target, (f"-march={level}", "-mtune=generic"), ("-Wl,-rpath,$ORIGIN",), source)
            built.append(target)
    shutil.copy(_libgomp(cxx), out / "libgomp.so.1")
    return built


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="prebuild the CPU kernels (attention, quantized GEMM) for images")
    p.add_argument(
        "--out", required=True, help="directory for the objects (the image's $" + ENV_PREBUILT + ")"
    )
    p.add_argument("--levels", default=",".join(LEVELS), help="comma-separated x86-64 levels to build")
    a = p.parse_args(argv)
    levels = [x.strip() for x in a.levels.split(",") if x.strip()]
    unknown = [x for x in levels if x not in LEVELS]
    if unknown or not levels:
        p.error(f"--levels: unknown level(s) {unknown or levels}; choose from {', '.join(LEVELS)}")
    try:
        for path in build_prebuilt(Path(a.out), levels, SOURCES):
            print(f"built {path}")
    except RuntimeError as e:
        print(f"cpu_build: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
