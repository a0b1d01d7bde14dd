"""The server-contract suite's bundle name, server config and metrics readers."""

from __future__ import annotations

import httpx

from modeldeploy.conformance.prom import Metrics
from modeldeploy.runtime import EngineConfig
from modeldeploy.runtime.server.config import ServerConfig

BUNDLE = "bundle-test-0001"


def _cfg(model_dir, **kw) -> ServerConfig:
    ecfg = EngineConfig(
        model=str(model_dir),
        device="cpu",
        dtype="float32",
        max_num_seqs=kw.pop("max_num_seqs", 2),
        bundle_id=BUNDLE,
    )
    return ServerConfig(
        engine=ecfg, served_model_name="tiny", engine_build="test-build", model_revision="r1", **kw
    )


def metrics(s) -> Metrics:
    return Metrics(httpx.get(s.url + "/metrics").text)


def outcome(m: Metrics, o: str) -> float:
    return m.get("modeldeploy_requests_total", outcome=o, bundle=BUNDLE)
