"""The serving-contract suite: a pure HTTP client (httpx), never torch or the engine.

from modeldeploy.conformance import ConformanceConfig, run_conformance
report = run_conformance(ConformanceConfig(url="http://10.0.0.7:8000"))
report.passed, report.to_dict()
"""

from modeldeploy.conformance.suite import CHECKS, ConformanceConfig, Report, run_conformance

__all__ = ["CHECKS", "ConformanceConfig", "Report", "run_conformance"]
