"""The serving runtime: engine (`runtime.engine`), models and the HTTP server.

`from modeldeploy.runtime import LLM, SamplingParams, EngineConfig` is the offline API;
names are resolved lazily so importing the package does not import torch.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "LLM": "modeldeploy.runtime.engine.llm",
    "SamplingParams": "modeldeploy.runtime.engine.sampling_params",
    "EngineConfig": "modeldeploy.runtime.config",
    "RequestOutput": "modeldeploy.runtime.engine.output",
    "AsyncEngine": "modeldeploy.runtime.engine.client.async_engine",
    "EngineClient": "modeldeploy.runtime.engine.client.base",
    "make_client": "modeldeploy.runtime.engine.client.factory",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(name)
