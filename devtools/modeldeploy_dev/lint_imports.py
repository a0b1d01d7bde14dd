"""`python -m modeldeploy_dev.lint_imports`: the dependency rules of docs/design.md, checked by import-linter.

The contracts live in pyproject.toml (`[tool.importlinter]`). The product is a plain src layout
(`src/modeldeploy` is the package), so grimp reads it straight from `src/`. `extra` lays the
product out as symlinks in a temporary folder and adds files there only, so a test can prove that a
forbidden import breaks its contract without touching the checkout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _mirror(src: Path, out: Path) -> Path:
    """`src`'s .py files as symlinks under `out` (folders real, so extra files can be added)."""
    for path in src.rglob("*.py"):
        rel = path.relative_to(src)
        if "__pycache__" in rel.parts:
            continue
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).symlink_to(path)
    return out


def run(repo: Path = REPO, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """lint-imports over `repo`'s src/ (+ `extra` files: path under src/ -> source)."""
    with tempfile.TemporaryDirectory(prefix="modeldeploy-imports-") as tmp:
        src = repo / "src"
        if extra:
            src = _mirror(src, Path(tmp) / "src")
            for rel, text in extra.items():
                (src / rel).parent.mkdir(parents=True, exist_ok=True)
                (src / rel).write_text(text)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(repo / "devtools")])}
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
