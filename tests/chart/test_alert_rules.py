"""The chart's alert rules through promtool: `check rules` on the file the
PrometheusRule ships, and `test rules` (tests/data/prometheus-rules-test.yaml) with each alert
firing on the series that should trip it and not on healthy, sub-threshold or short-lived ones."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "charts" / "modeldeploy-operator" / "files" / "prometheus-rules.yaml"
UNIT = ROOT / "tests" / "data" / "prometheus-rules-test.yaml"


def promtool_path() -> Path | None:
    try:
        from modeldeploy_dev.cluster.local import Binaries, cache_root, pinned_versions
    except ImportError:
        return None
    return Binaries(cache_root(), pinned_versions()).promtool


PROMTOOL = promtool_path()
pytestmark = pytest.mark.skipif(
    PROMTOOL is None or not PROMTOOL.exists(),
    reason=f"promtool not built ({PROMTOOL}): run `make cluster-build` "
    "(devtools/modeldeploy_dev/cluster/build.sh)",
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PROMTOOL), *args], capture_output=True, text=True, timeout=120, cwd=UNIT.parent
    )


def test_check_rules() -> None:
    r = promtool("check", "rules", str(RULES))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 8 rules found" in r.stdout, r.stdout


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    alerts = {
        r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r
    }
    tests = yaml.safe_load(UNIT.read_text())["tests"]
    fired = {t["alertname"] for g in tests for t in g.get("alert_rule_test", []) if t["exp_alerts"]}
    quiet = {t["alertname"] for g in tests for t in g.get("alert_rule_test", []) if not t["exp_alerts"]}
    assert alerts == fired == quiet


def test_rules_unit_tests_pass() -> None:
    r = promtool("test", "rules", UNIT.name)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_unit_tests_can_fail(tmp_path: Path) -> None:
    """A wrong expectation is reported, so the passing run above means something."""
    text = UNIT.read_text().replace(
        'summary: "team-a/s-0: KV cache 97% used', 'summary: "team-a/s-0: KV cache 96% used'
    )
    text = text.replace("../../charts", str(ROOT / "charts"))
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    r = promtool("test", "rules", str(bad))
    assert r.returncode != 0 and "ModelDeploymentKVCacheFull" in r.stdout + r.stderr
