"""Server settings: what `modeldeploy serve` adds on top of the engine's EngineConfig."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from modeldeploy.runtime.chat_template import ChatTemplate
from modeldeploy.runtime.config import EngineConfig
from modeldeploy.runtime.engine.client.factory import Layout
from modeldeploy.runtime.server.limits import Limits


@dataclass
class ServerConfig:
    engine: EngineConfig  # max_num_seqs = running slots
    served_model_name: str  # the `model` clients must send
    max_queue: int = 64  # requests allowed to wait for a running slot; beyond: 429
    api_key: str | None = None  # bearer token for /v1/*; health and metrics stay open
    # sha256 (hex) of a second bearer token /v1/* accepts where api_key is set: the operator's gate
    # credential. The pod holds only this hash, never the token (docs/design.md, "Permissions")
    gate_key_sha256: str | None = None
    drain_timeout_s: float = 30.0  # SIGTERM: in-flight requests get this long to finish
    load_delay_s: float = 0.0  # test hook (env MODELDEPLOY_LOAD_DELAY_S): wait before loading
    step_delay_s: float = 0.0  # test hook (env MODELDEPLOY_STEP_DELAY_S): sleep after every engine step
    ignore_response_format: bool = (
        False  # test hook (env MODELDEPLOY_IGNORE_RESPONSE_FORMAT=1): a broken engine
    )
    engine_build: str = ""  # engine image digest / build id, a metric label
    model_revision: str = ""  # bundle.model.revision, a metric label
    retry_after_s: int = 1  # Retry-After sent with 429 / 503
    max_queued_tokens: int = 0  # prompt tokens allowed to wait together; beyond: 429 (0: no bound)
    queue_budget_s: float | None = None  # estimated wait for a slot beyond this: 429 at once (None: none)
    # "process": the step loop in an engine core process of its own (runtime/engine/client/engine_core.py);
    # "thread": on a thread of this process (one GIL with the HTTP work; tests that look inside it)
    engine_core: Layout = "process"
    limits: Limits = field(default_factory=Limits)  # request bounds (limits.py): hostile input gets a 4xx
    # --chat-template FILE, read and compiled at start (runtime/chat_template.py): replaces the tokenizer's
    # template for every chat request (None: the tokenizer's own)
    chat_template: ChatTemplate | None = None

    def validate(self) -> None:
        if self.gate_key_sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", self.gate_key_sha256):
            raise ValueError("--gate-key-sha256 must be 64 lowercase hex digits (a sha256 digest)")
        if self.max_queue < 0:
            raise ValueError(f"--max-queue must be >= 0, got {self.max_queue}")
        if self.drain_timeout_s < 0:
            raise ValueError(f"--drain-timeout must be >= 0, got {self.drain_timeout_s}")
        if self.load_delay_s < 0:
            raise ValueError(f"load delay must be >= 0, got {self.load_delay_s}")
        if self.step_delay_s < 0:
            raise ValueError(f"step delay must be >= 0, got {self.step_delay_s}")
        if self.max_queued_tokens < 0:
            raise ValueError(f"--max-queued-tokens must be >= 0, got {self.max_queued_tokens}")
        if self.queue_budget_s is not None and not self.queue_budget_s > 0:
            raise ValueError(f"--queue-budget must be > 0, got {self.queue_budget_s}")
        if self.engine_core not in ("process", "thread"):
            raise ValueError(f"--engine-core must be process or thread, got {self.engine_core!r}")
        if not self.served_model_name:
            raise ValueError("--served-model-name must not be empty")
