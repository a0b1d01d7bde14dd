"""Every CUDA source compiles with NVRTC for compute_90, for every template instantiation
the wrappers may launch, on a machine without a GPU.

CuPy's own compile path asks the device for its architecture, so this goes to NVRTC
directly (`cupy_backends.cuda.libs.nvrtc`), with the same sources, options and name
expressions the runtime uses (`modeldeploy.kernels.build`). No skip: CI must be able to
compile, otherwise a syntax error could land unseen.
"""

from __future__ import annotations

import pytest

from modeldeploy.kernels import build

nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="cupy is a dev dependency")

ARCH = "-arch=compute_90"


def compile_ptx(src: str, filename: str, names: tuple[str, ...] = ()) -> tuple[str, dict[str, str]]:
    """Compile to PTX; return (ptx, lowered names). Raises RuntimeError with the NVRTC log."""
    prog = nvrtc.createProgram(src, filename, [], [])
    try:
        for n in names:
            nvrtc.addNameExpression(prog, n)
        try:
            nvrtc.compileProgram(prog, [*build.nvrtc_options(), ARCH])
        except nvrtc.NVRTCError as e:
            raise RuntimeError(f"{filename}: {e}\n{nvrtc.getProgramLog(prog)}") from e
        return nvrtc.getPTX(prog).decode(errors="replace"), {n: nvrtc.getLoweredName(prog, n) for n in names}
    finally:
        nvrtc.destroyProgram(prog)


def test_nvrtc_loads_and_headers_found():
    major, _ = nvrtc.getVersion()
    assert major >= 12
    assert build.cuda_include_dir() is not None, (
        "cuda_fp16.h / cuda_bf16.h not found: install the nvidia-cuda-runtime wheel (make setup)"
    )


def test_every_cu_file_is_a_known_family():
    on_disk = {p.stem for p in build.CUDA_DIR.glob("*.cu")}
    assert on_disk == set(build.FAMILIES)


@pytest.mark.parametrize("family", build.FAMILIES)
def test_family_compiles_for_compute_90(family):
    names = build.name_expressions(family)
    ptx, lowered = compile_ptx(build.source(family), f"{family}.cu", names)
    assert ".target sm_90" in ptx
    assert len(names) >= 3  # one per dtype at least
    for dt in build.CTYPES.values():
        assert any(dt in n for n in names), f"{family}: no {dt} instantiation"
    for n, mangled in lowered.items():  # each instantiation really emitted
        assert mangled.startswith("_Z") and f".entry {mangled}(" in ptx, n


def test_sources_inline_the_shared_header():
    for family in build.FAMILIES:
        src = build.source(family)
        assert '#include "' not in src and "__device__ __forceinline__ float warp_sum" in src


def test_a_syntax_error_fails_the_compile():
    broken = build.source("norm").replace("float ss = 0.f;", "float ss = 0.f")  # drop a ';'
    assert broken != build.source("norm")
    with pytest.raises(RuntimeError, match="error"):
        compile_ptx(broken, "broken.cu", build.name_expressions("norm"))


def test_a_bad_instantiation_fails_the_compile():
    with pytest.raises(RuntimeError, match="nope"):
        compile_ptx(build.source("attention"), "attention.cu", ("paged_attention_kernel<float, 64, nope>",))
