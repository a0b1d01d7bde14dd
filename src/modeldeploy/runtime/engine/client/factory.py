"""`make_client`: the engine client for a layout. Apart from `base.py` so that neither
implementation imports the module that imports them both."""

from __future__ import annotations

from typing import Literal

from modeldeploy.runtime.config import EngineConfig
from modeldeploy.runtime.engine.client.base import EngineClient

Layout = Literal["process", "thread"]


def make_client(config: EngineConfig, layout: Layout = "process") -> EngineClient:
    """The engine client for `layout`: "process" runs the step loop in an engine core process of
    its own (no GIL shared with the HTTP work), "thread" on a thread of this process."""
    if layout == "process":
        from modeldeploy.runtime.engine.client.core_client import EngineCoreClient

        return EngineCoreClient(config)
    if layout == "thread":
        from modeldeploy.runtime.engine.client.async_engine import AsyncEngine  # imports torch

        return AsyncEngine(config)
    raise ValueError(f"engine_core: must be process or thread, got {layout!r}")
