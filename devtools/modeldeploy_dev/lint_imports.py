"""`python -m modeldeploy_dev.lint_imports`: the DESIGN dependency rules, checked by import-linter.

The contracts live in pyproject.toml (`[tool.importlinter]`). import-linter (grimp) finds a
package's modules by walking the folder its `__init__.py` is in, but `modeldeploy` is
assembled from several top-level folders by `package-dir` (operator/ is
`modeldeploy.operator`, and so on). So this builds the installed layout as a tree of
symlinks in a temporary folder, from pyproject's own `package-dir`, and runs lint-imports
over that. `extra` adds files to the tree only (a test proves a forbidden import fails).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def layout(repo: Path, out: Path) -> Path:
    """Mirror `modeldeploy` as installed (folders real, .py files symlinked) under `out`; returns `out`."""
    mapping = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for package, folder in sorted(mapping.items()):
        src, dst = repo / folder, out.joinpath(*package.split("."))
        for path in src.rglob("*.py"):
            rel = path.relative_to(src)
            if "__pycache__" in rel.parts or _mapped_elsewhere(package, rel, mapping):
                continue
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            (dst / rel).symlink_to(path)
    return out


def _mapped_elsewhere(package: str, rel: Path, mapping: dict[str, str]) -> bool:
    """A file under a folder that another package-dir entry maps (e.g. e2e/cluster) belongs to that one."""
    dotted = ".".join((package, *rel.parent.parts))
    return any(
        dotted == p or dotted.startswith(p + ".")
        for p in mapping
        if p != package and p.startswith(package + ".")
    )


def run(repo: Path = REPO, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """lint-imports over the installed layout of `repo` (+ `extra` files: path in the tree -> source)."""
    with tempfile.TemporaryDirectory(prefix="modeldeploy-imports-") as tmp:
        tree = layout(repo, Path(tmp) / "tree")
        for rel, text in (extra or {}).items():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            (tree / rel).write_text(text)
        dev = repo / "devtools"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(dev)])}
        cli = (
            "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
        )
        cmd = [sys.executable, "-c", cli, "--no-cache", str(repo / "pyproject.toml")]
        return subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=600)


def main() -> int:
    r = run()
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    return r.returncode


if __name__ == "__main__":
    raise SystemExit(main())
