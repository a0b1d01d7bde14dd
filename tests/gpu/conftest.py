"""GPU tests: the runtime's CUDA paths against references, on a CUDA device only.

Every test in this directory is marked `gpu` and skips, with the reason, where torch sees no
CUDA device or cupy is missing, so `pytest tests` passes on CPU-only machines. On a GPU machine
(no virtualenv needed):

    PYTHONPATH=src:devtools python3 -m pytest -q tests/gpu

Each test is cheap (tiny models, seconds): the timings live in bench/gpu/, and
`make gpu-check` runs both.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _missing() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch not installed"
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    try:
        import cupy  # noqa: F401
    except ImportError:
        return "cupy not installed (pip install modeldeploy[gpu])"
    return None


MISSING = _missing()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.gpu)
            if MISSING:
                item.add_marker(pytest.mark.skip(reason=MISSING))


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Counts of CuPy kernel launches by kernel name, to prove the CUDA kernels (not the torch
    twins) ran."""
    from modeldeploy.kernels import activation, attention, cache, lora, norm, quant_cuda, rotary

    counts: dict[str, int] = {}
    for mod in (activation, attention, cache, lora, norm, quant_cuda, rotary):

        def counted(family, name, *a, _real=mod.launch, **k):
            key = name.split("<")[0]
            counts[key] = counts.get(key, 0) + 1
            return _real(family, name, *a, **k)

        monkeypatch.setattr(mod, "launch", counted)
    yield counts
