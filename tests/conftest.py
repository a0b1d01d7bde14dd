"""Shared fixtures: tiny random-weight models written to disk once per test session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Factory: tiny_model(arch="llama", seed=0, **sizes) -> model dir (cached per arguments)."""
    from modeldeploy.runtime.tiny_model import make_tiny_model

    cache: dict[tuple, Path] = {}

    def make(arch: str = "llama", seed: int = 0, **sizes) -> Path:
        key = (arch, seed, tuple(sorted(sizes.items())))
        if key not in cache:
            name = f"{arch}-{seed}-" + "-".join(f"{k}{v}" for k, v in sorted(sizes.items()))
            cache[key] = make_tiny_model(tmp_path_factory.mktemp(name), arch, seed, **sizes)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def llama_dir(tiny_model: Callable[..., Path]) -> Path:
    return tiny_model("llama")


@pytest.fixture(scope="session")
def tool_model_dir() -> Path:
    """The tiny llama fine-tuned to call tools and answer JSON (modeldeploy_dev.tool_model): a few
    hundred CPU steps (about a minute on an idle machine), cached per machine by source hash."""
    from modeldeploy_dev.tool_model import cached_tool_model

    return cached_tool_model()
