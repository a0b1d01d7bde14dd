"""The structured-output conformance check: our server passes it; the same server with
response_format ignored (an engine upgrade that broke constrained decoding) fails it; the
operator's gate asks for it exactly when the bundle declares structured output."""

from __future__ import annotations

import pytest

from modeldeploy.conformance import ConformanceConfig, run_conformance
from modeldeploy.conformance.structured import SCHEMA, violations
from modeldeploy.operator.analysis.gate import ConformanceRunner
from modeldeploy.operator.api.v1alpha1.bundle import ServingConfig
from modeldeploy.runtime import EngineConfig
from modeldeploy.runtime.server import structured as server_structured
from modeldeploy.runtime.server.config import ServerConfig
from modeldeploy_dev.harness import ThreadedServer

ONLY = [
    "readiness",
    "normal_response",
    "streaming",
    "usage_accounting",
    "stop_sequences",
    "error_handling",
    "cancellation",
    "bounded_load",
    "adapters",
]


@pytest.fixture(scope="module")
def server(llama_dir):
    ecfg = EngineConfig(model=str(llama_dir), device="cpu", dtype="float32", max_num_seqs=4, bundle_id="so")
    with ThreadedServer(ServerConfig(engine=ecfg, served_model_name="tiny")) as s:
        yield s


def _run(url: str):
    return run_conformance(ConformanceConfig(url=url, skip=ONLY, structured_output=True))


def test_our_server_passes(server):
    report = _run(server.url)
    assert [c.name for c in report.checks] == ["structured_output"]
    assert report.passed, report.table()


def test_a_server_that_ignores_response_format_fails(server, monkeypatch):
    monkeypatch.setattr(server_structured, "from_response_format", lambda rf, limits=None: None)
    report = _run(server.url)
    check = report.checks[0]
    assert not report.passed and check.verdict == "fail"
    assert any("unsupported schema feature: status 200" in f for f in check.failures)
    assert any("not JSON" in f or "does not validate" in f or "finish_reason" in f for f in check.failures)


def test_not_run_unless_declared(server):
    report = run_conformance(ConformanceConfig(url=server.url, skip=ONLY))
    assert report.checks == []


def test_validator_catches_each_violation():
    good = {"service": "api", "tier": "gold", "replicas": 3, "healthy": True, "owner": "ops"}
    assert violations(good) == []
    assert violations({**good, "tier": "tin"}) and violations({**good, "replicas": 10})
    assert violations({**good, "service": "API"}) and violations({**good, "healthy": 1})
    assert violations({**good, "extra": 1}) and violations({k: v for k, v in good.items() if k != "tier"})
    assert violations({**good, "owner": ""}) and violations({**good, "owner": "x" * 9})
    assert violations({**good, "owner": 7})
    assert violations([good]) and set(SCHEMA["required"]) == set(good)


def test_gate_passes_the_bundle_declaration_to_the_suite():
    seen: list[ConformanceConfig] = []

    def fake(cfg):
        seen.append(cfg)
        raise ValueError("no server in this test")

    runner = ConformanceRunner(run=fake)
    runner.start(("uid", "b1"), "http://10.0.0.1:8000", structured_output=True)
    runner.wait(("uid", "b1"), 5)
    runner.start(("uid", "b2"), "http://10.0.0.1:8000")
    runner.wait(("uid", "b2"), 5)
    assert [c.structured_output for c in seen] == [True, False]
    assert ServingConfig.model_validate({"structuredOutput": True}).structured_output is True
    assert ServingConfig().structured_output is False
