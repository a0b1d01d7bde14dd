"""`make lint`'s checks can fail: the import contracts catch a forbidden import, C901 a complex
product function, E501 a long line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from modeldeploy_dev.lint_imports import run

REPO = Path(__file__).resolve().parents[2]
RUFF = Path(sys.executable).with_name("ruff")


def test_the_dependency_contracts_hold() -> None:
    r = run()
    assert r.returncode == 0 and " 0 broken" in r.stdout, r.stdout + r.stderr


def test_a_forbidden_import_breaks_its_contract() -> None:
    r = run(
        extra={
            "modeldeploy/kernels/forbidden_probe.py": "import modeldeploy.operator.rollout.plan\n",
            "modeldeploy/operator/forbidden_probe.py": "import torch\n",
            "modeldeploy/conformance/forbidden_probe.py": "import modeldeploy_dev.load\n",
        }
    )
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "kernels import nothing of ours BROKEN" in out and "modeldeploy.kernels.forbidden_probe" in out
    assert "the operator imports no torch, transformers or runtime BROKEN" in out
    assert "product code never imports test infrastructure (modeldeploy_dev) BROKEN" in out
    assert "the server never imports the operator KEPT" in out


def _ruff(path: str, source: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(RUFF), "check", "--stdin-filename", path, "--output-format", "concise", "-"],
        input=source,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_operator_functions_above_complexity_15_fail_lint() -> None:
    body = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(16))
    source = f"def branchy(x: int) -> int:\n{body}    return -1\n"
    r = _ruff("src/modeldeploy/operator/branchy.py", source)
    assert r.returncode == 1 and "C901 `branchy` is too complex (17 > 15)" in r.stdout, r.stdout + r.stderr
    for product in ("runtime/engine", "runtime/server", "kernels", "conformance"):  # all product code
        r = _ruff(f"src/modeldeploy/{product}/branchy.py", source)
        assert r.returncode == 1 and "C901" in r.stdout, (product, r.stdout + r.stderr)
    # the bound is the product's: test infrastructure is not held to it
    assert _ruff("devtools/modeldeploy_dev/branchy.py", source).returncode == 0
    small = "def calm(x: int) -> int:\n" + "".join(
        f"    if x == {i}:\n        return {i}\n" for i in range(14)
    )
    assert _ruff("src/modeldeploy/operator/calm.py", small + "    return -1\n").returncode == 0


def test_lines_past_110_columns_fail_lint() -> None:
    long = "x = " + repr("a" * 110) + "\n"
    r = _ruff("tests/long.py", long)
    assert r.returncode == 1 and "E501" in r.stdout, r.stdout + r.stderr
    assert _ruff("tests/short.py", "x = 1\n").returncode == 0
