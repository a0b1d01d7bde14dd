"""The documentation house: a short README that is the front door, `docs/` as the manual built by
mkdocs in strict mode, and reference pages generated from the code that fail the tests when stale.

Why tests and not only `make lint`: a change to an API type, a flag, a metric or a chart value that
forgets `make docs` must fail where every change is checked, and a README that grows back into a
manual must be caught the same way.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from modeldeploy_dev import docs_ref

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_README_LINES = 200


def test_generated_reference_pages_are_current(capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m modeldeploy_dev.docs_ref --check`, in-process: exit 0 means no page is stale."""
    rc = docs_ref.main(["--check"])
    assert rc == 0, capsys.readouterr().err + "run `python -m modeldeploy_dev.docs_ref` (make docs)"


def test_check_mode_names_the_stale_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A page that differs from what the code generates makes --check exit 1 and name that page only."""
    (tmp_path / docs_ref.REFERENCE).mkdir(parents=True)
    for name in docs_ref.PAGES:
        shutil.copy(ROOT / docs_ref.REFERENCE / name, tmp_path / docs_ref.REFERENCE / name)
    page = tmp_path / docs_ref.REFERENCE / "metrics.md"
    page.write_text(page.read_text().replace("modeldeploy_requests_total", "modeldeploy_requests_old_total"))
    assert docs_ref.main(["--check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "docs/reference/metrics.md" in err and "crd.md" not in err, err


def test_reference_pages_cover_their_sources() -> None:
    """Spot checks that each page walked its source, not a copy of it: a CRD field, a serve flag with
    its default, a runtime and an operator metric, a chart value with its values.yaml default."""
    pages = {name: (ROOT / docs_ref.REFERENCE / name).read_text() for name in docs_ref.PAGES}
    assert "## `modeldeployment.spec.rollout.analysis.quality`" in pages["crd.md"]
    assert "`pauseSeconds` | integer |  | `60` |" in pages["crd.md"]
    assert "## `modeldeploy serve`" in pages["cli.md"] and "`--max-queue` `MAX_QUEUE`" in pages["cli.md"]
    assert "modeldeploy cluster` and `modeldeploy demo` are registered by" in pages["cli.md"]
    assert "## `modeldeploy cluster`" not in pages["cli.md"]  # development commands are not the product's
    assert "| `modeldeploy_time_to_first_token_seconds` | histogram |" in pages["metrics.md"]
    assert (
        "| `modeldeploy_rollout_phase` | gauge | `namespace`, `modeldeployment`, `phase` |"
        in pages["metrics.md"]
    )
    assert "| `resyncSeconds` | integer | `30` |" in pages["helm-values.md"]


def test_cli_page_ignores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flags whose default comes from the environment, and the terminal width, leave the page as is."""
    before = docs_ref.cli_page()
    monkeypatch.setenv("MODELDEPLOY_ENGINE_BUILD", "sha256:from-the-environment")
    monkeypatch.setenv("MODELDEPLOY_API_KEY", "a-secret-that-must-not-be-printed")
    monkeypatch.setenv("COLUMNS", "37")
    after = docs_ref.cli_page()
    assert after == before
    assert "a-secret-that-must-not-be-printed" not in after


def test_readme_is_a_front_door() -> None:
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move the rest into docs/"
    for command in ("make demo", "make test"):
        assert re.search(rf"^{command}\s", text, re.M), f"README.md must show `{command}` as a command line"


def test_readme_links_resolve() -> None:
    """The README is outside the docs site, so mkdocs does not check it: every relative link must name a
    file that exists, and an anchor must be a heading of that page."""
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    local = [link for link in links if not re.match(r"^[a-z]+://", link)]
    assert local, "README.md links into docs/"
    for link in local:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.is_file(), f"README.md links to {link}: no such file"
        if anchor:
            headings = re.findall(r"^#+ (.+?)\s*$", target.read_text(), re.M)
            slugs = {re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", h.lower())).strip("-") for h in headings}
            assert anchor in slugs, f"README.md links to {link}: no heading with that anchor in {path}"


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None,
    reason="mkdocs is not installed (it comes with the dev extra: `make setup`)",
)
def test_docs_site_builds_strict(tmp_path: Path) -> None:
    """`mkdocs build --strict`: every page in the nav, no link to a missing page or anchor."""
    site = tmp_path / "site"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(ROOT / "mkdocs.yml"),
            "-d",
            str(site),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    for page in ("index.html", "canary/index.html", "reference/crd/index.html", "design/index.html"):
        assert (site / page).is_file(), page
