"""examples/argocd: app of apps with sync waves (operator chart and CRDs at -1, ModelDeployments at 0)."""

from __future__ import annotations

from pathlib import Path

import yaml
from lupa import lua51

from modeldeploy.operator.api.v1alpha1.modeldeployment import KIND, ModelDeployment

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples/argocd"


def load(p: Path) -> dict:
    return yaml.safe_load(p.read_text())


def apps() -> dict[str, dict]:
    out = {}
    for p in sorted((EX / "apps").glob("*.yaml")):
        a = load(p)
        assert a["apiVersion"] == "argoproj.io/v1alpha1" and a["kind"] == "Application", p
        out[a["metadata"]["name"]] = a
    return out


def wave(a: dict) -> int:
    return int(a["metadata"].get("annotations", {}).get("argocd.argoproj.io/sync-wave", "0"))


def test_root_points_at_the_apps_folder() -> None:
    root = load(EX / "root.yaml")
    assert root["kind"] == "Application" and root["spec"]["source"]["path"] == "examples/argocd/apps"
    repos = {a["spec"]["source"]["repoURL"] for a in apps().values()}
    assert repos == {root["spec"]["source"]["repoURL"]}


def test_operator_chart_with_crds_syncs_before_the_models() -> None:
    a = apps()
    op, models = a["modeldeploy-operator"], a["modeldeploy-models"]
    assert wave(op) == -1 and wave(models) == 0
    chart = ROOT / op["spec"]["source"]["path"]
    assert (chart / "Chart.yaml").is_file() and (chart / "crds/modeldeployment.yaml").is_file()
    assert op["spec"]["source"]["helm"]["skipCrds"] is False
    assert "ServerSideApply=true" in op["spec"]["syncPolicy"]["syncOptions"]
    assert "SkipDryRunOnMissingResource=true" in models["spec"]["syncPolicy"]["syncOptions"]


def test_operator_values_are_the_charts_and_name_a_gate_key_secret() -> None:
    """Argo CD renders without cluster access: a chart-made gate key would change on every sync."""
    from modeldeploy.operator.api.chart import Values

    values = apps()["modeldeploy-operator"]["spec"]["source"]["helm"]["valuesObject"]
    chart = yaml.safe_load((ROOT / "charts/modeldeploy-operator/values.yaml").read_text())
    typed = Values.model_validate(chart | values)
    assert typed.gateKey.existingSecret == "modeldeploy-gate-key"
    assert "secret generic modeldeploy-gate-key" in (ROOT / "examples/argocd/README.md").read_text()


def test_models_app_syncs_valid_model_deployments() -> None:
    src = apps()["modeldeploy-models"]["spec"]["source"]
    files = sorted((ROOT / src["path"]).glob(src["directory"]["include"]))
    assert files
    for f in files:
        obj = load(f)
        assert obj["kind"] == KIND
        ModelDeployment.model_validate(obj)  # the API types accept it as the CRD would


def test_application_health_snippet_reads_child_health() -> None:
    cm = load(EX / "argocd-cm-application-health.yaml")
    script = cm["data"]["resource.customizations.health.argoproj.io_Application"]

    def run(obj: dict) -> tuple[str, str]:
        lua = lua51.LuaRuntime()
        lua.globals().obj = lua.table_from(obj, recursive=True)
        hs = lua.execute(script)
        return hs["status"], hs["message"]

    assert run({"metadata": {"name": "x"}}) == ("Progressing", "")
    assert run({"status": {"health": {"status": "Healthy"}}}) == ("Healthy", "")
    assert run({"status": {"health": {"status": "Degraded", "message": "md chat rolled back"}}}) == (
        "Degraded",
        "md chat rolled back",
    )
