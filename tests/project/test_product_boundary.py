"""The product (what `pip install modeldeploy` and both images carry) holds no test infrastructure.

The local cluster, the process node, the harnesses, the kernel emulation and the demo live in the
separate `modeldeploy-dev` distribution (devtools/). These tests build the product's real wheel and
read its file list, and scan the product's sources for imports of the dev package.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT_DIRS = ["src/modeldeploy"]


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (whl,) = out.glob("modeldeploy-*.whl")
    return zipfile.ZipFile(whl).namelist()


def test_wheel_carries_the_product_and_no_test_infrastructure(wheel_names: list[str]) -> None:
    for must in (
        "modeldeploy/operator/rollout/plan.py",
        "modeldeploy/runtime/server/app.py",
        "modeldeploy/cli.py",
    ):
        assert must in wheel_names
    leaked = [
        n
        for n in wheel_names
        if n.startswith(("modeldeploy/e2e/", "modeldeploy_dev/", "e2e/", "tests/"))
        or n.endswith(
            (
                "/harness.py",
                "/kernel_emulate.py",
                "/kernel_checks.py",
                "/demo.py",
                "/demo_cli.py",
                "conftest.py",
            )
        )
        or "/test_" in n
    ]
    assert leaked == []


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_product_sources_never_import_the_dev_package() -> None:
    offenders = {
        str(p.relative_to(ROOT)): sorted(n for n in _imports(p) if n.split(".")[0] == "modeldeploy_dev")
        for d in PRODUCT_DIRS
        for p in (ROOT / d).rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    # and the scan itself sees imports (a scan that finds nothing proves nothing)
    assert "modeldeploy_dev.cluster.local" in _imports(ROOT / "e2e" / "conftest.py")
