"""tests/ mirrors src/: a newcomer who opens a package finds its tests at the same path under tests/.

Test modules live in the folder of the package they test (tests/operator/rollout for
src/modeldeploy/operator/rollout); helpers shared across folders live in tests/support, data in
tests/data; e2e/ (the local cluster) stays apart.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "modeldeploy"
TESTS = ROOT / "tests"
# Folders of tests/ that mirror no package: shared helpers, data, the repository-wide checks, and the
# parts of the repository outside src/ (the chart, the examples, devtools/, bench/, the GPU tier).
NOT_PACKAGES = {"support", "data", "project", "chart", "examples", "devtools", "bench", "gpu", "cli"}


def packages() -> list[Path]:
    """Every Python package under src/modeldeploy, as a path relative to it (the root excluded: its
    own modules, the CLI and the digest/fetch helpers, are tested in tests/cli)."""
    return sorted(p.parent.relative_to(SRC) for p in SRC.rglob("__init__.py") if p.parent != SRC)


def test_no_test_module_at_the_top_of_tests() -> None:
    top = sorted(p.name for p in TESTS.glob("*.py") if p.name != "conftest.py")
    assert top == [], f"modules at the top of tests/ (move them to the folder of what they test): {top}"


def test_every_package_has_its_tests_folder() -> None:
    missing = [str(p) for p in packages() if not any((TESTS / p).rglob("test_*.py"))]
    assert missing == [], f"src/modeldeploy packages with no tests/<same path>/test_*.py: {missing}"


def test_every_tests_folder_mirrors_a_package_or_is_named() -> None:
    pkgs = {str(p) for p in packages()}
    stray = []
    for d in sorted(p for p in TESTS.rglob("*") if p.is_dir() and "__pycache__" not in p.parts):
        rel = d.relative_to(TESTS)
        if rel.parts[0] in NOT_PACKAGES:
            continue
        if str(rel) not in pkgs:
            stray.append(str(rel))
    assert stray == [], f"tests/ folders that mirror no src/modeldeploy package: {stray}"


def test_test_module_names_are_unique() -> None:
    # pytest's prepend import mode (no __init__.py in tests/) imports each test module by its basename
    names = [p.name for p in TESTS.rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
