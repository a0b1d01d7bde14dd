"""The server's shared state: engine, load state, admission, metrics, and request preparation."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from modeldeploy.runtime.chat_template import template_digest
from modeldeploy.runtime.engine.client.base import EngineClient
from modeldeploy.runtime.engine.request_check import RequestError, check_request
from modeldeploy.runtime.server.admission import REASONS, Admission
from modeldeploy.runtime.server.config import ServerConfig
from modeldeploy.runtime.server.errors import APIError
from modeldeploy.runtime.server.metrics import ServerMetrics
from modeldeploy.runtime.server.readiness import LoadState

log = logging.getLogger("modeldeploy.server")
_SAMPLING_FIELDS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "min_tokens",
    "prompt_logprobs",  # before "logprobs": the first field named in the message is the param
    "logprobs",
    "n",
)
# Below this a temperature is greedy in all but name; dividing logits by it overflows float32
# (the engine's sampler then fails), so it is served as temperature 0, as vLLM does.
GREEDY_EPS = 1e-5


class ServerContext:
    def __init__(self, cfg: ServerConfig, engine: EngineClient | None):
        self.cfg, self._engine = cfg, engine
        self.state = LoadState()
        self.admission = Admission(
            cfg.engine.max_num_seqs,
            cfg.max_queue,
            cfg.retry_after_s,
            cfg.max_queued_tokens,
            cfg.queue_budget_s,
        )
        self.created = int(time.time())
        self.jobs: dict[str, Any] = {}
        labels = {
            "bundle": cfg.engine.bundle_id,
            "engine_build": cfg.engine_build,
            "model_revision": cfg.model_revision,
        }
        adapters = [a["name"] for a in cfg.engine.adapters]
        self.metrics = ServerMetrics(labels, self.live_values, adapters)
        self.exit_on_fatal: Callable[[], None] | None = None  # set by `modeldeploy serve` (cli.py)

    @property
    def engine(self) -> EngineClient:
        """The engine client; RuntimeError before it has been created (the first moments of a load)."""
        if self._engine is None:
            raise RuntimeError("engine: not created yet")
        return self._engine

    def attach(self, engine: EngineClient) -> None:
        """Adopt the engine client before it starts: its abort and failure reports come here."""
        self._engine = engine
        engine.on_abort_release = self.metrics.cancel_released
        engine.on_fatal = self.fatal
        if self.cfg.step_delay_s:
            engine.step_delay_s = self.cfg.step_delay_s  # test hook: a deliberately slowed server

    def fatal(self, message: str) -> None:
        """The engine died (step loop, or a tensor-parallel rank): 503 from now on, and exit non-zero
        when running as `modeldeploy serve`, so the pod restarts instead of hanging. Any thread."""
        if self.state.status != "failed":
            self.state.status, self.state.error = "failed", f"engine failed: {message}"
        log.error("engine failed: %s", message)
        if self.exit_on_fatal is not None:
            self.exit_on_fatal()

    # ---- readiness -------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.state.status == "ready" and self.live

    @property
    def live(self) -> bool:
        """False after a load failure or a crashed engine step loop: Kubernetes should restart us."""
        error = self._engine.error if self._engine is not None else None
        if error is not None and self.state.status != "failed":
            self.state.status, self.state.error = "failed", f"engine step loop failed: {error}"
        return self.state.live

    def check_serving(self) -> None:
        s = self.state
        if s.status == "loading":
            raise APIError(
                503,
                f"model is loading (phase {s.phase}, progress {s.progress:.2f})",
                code="loading",
                headers={"Retry-After": str(self.cfg.retry_after_s)},
            )
        if s.status == "failed":
            raise APIError(503, f"model failed to load: {s.error}", code="load_failed")
        if s.status == "draining":
            raise APIError(503, "server is draining and admits no new requests", code="draining")

    async def drain(self) -> bool:
        """Stop admitting, let admitted requests finish within the drain timeout, abort the rest."""
        if self.state.status in ("ready", "loading"):
            self.state.status = "draining"
        log.info("draining: %d running, %d waiting", self.admission.running, self.admission.waiting)
        clean = await self.admission.drain(self.cfg.drain_timeout_s)
        if not clean:
            log.warning(
                "drain timeout (%.1fs): aborting %d requests", self.cfg.drain_timeout_s, len(self.jobs)
            )
            for rid, job in list(self.jobs.items()):
                job.server_aborted = True
                self.engine.abort(rid)
            await asyncio.sleep(0.2)
        return clean

    # ---- request preparation ---------------------------------------------------------
    @property
    def adapter_names(self) -> list[str]:
        return [a["name"] for a in self.cfg.engine.adapters]

    @property
    def served_models(self) -> list[str]:
        """The base model's name, then each LoRA adapter's."""
        return [self.cfg.served_model_name, *self.adapter_names]

    def check_model(self, name: str) -> str | None:
        """The adapter a request's `model` selects (None = the base model); 404 if it is neither."""
        if name == self.cfg.served_model_name:
            return None
        if name in self.adapter_names:
            return name
        served = ", ".join(repr(m) for m in self.served_models)
        raise APIError(
            404,
            f"model {name!r} does not exist; this server serves {served}",
            param="model",
            code="model_not_found",
        )

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def encode_text(self, text: str) -> list[int]:
        return list(self.engine.tokenizer(text, add_special_tokens=True)["input_ids"])

    @property
    def chat_template(self) -> str | None:
        """The template every chat request renders with: --chat-template's text, else the tokenizer's."""
        if self.cfg.chat_template is not None:
            return self.cfg.chat_template.text
        return getattr(self.engine.tokenizer, "chat_template", None)

    def chat_template_info(self) -> dict[str, Any]:
        """/v1/bundle `chat_template`: where the template in use comes from and its digest (the
        tokenizer's is known once the engine has loaded)."""
        pinned = self.cfg.chat_template
        if pinned is not None:
            return {"source": "file", "path": pinned.path, "digest": pinned.digest}
        template = None
        if self.state.load_seconds:
            try:
                template = getattr(self.engine.tokenizer, "chat_template", None)
            except Exception:  # noqa: BLE001 - introspection is best effort
                template = None
        return {"source": "tokenizer", "path": None, "digest": template_digest(template)}

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> list[int]:
        """The template's text, tokenized. `continue_final_message` leaves the last (assistant) message
        open, with no end-of-turn after it: how a given answer is scored or continued (vLLM's flags)."""
        tok = self.engine.tokenizer
        try:
            text = tok.apply_chat_template(
                messages,
                tools=tools,
                chat_template=self.cfg.chat_template.text if self.cfg.chat_template is not None else None,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
            )
        except Exception as e:  # noqa: BLE001 - a template error is the request's problem
            raise APIError(400, f"messages: the chat template rejected them: {e}", param="messages") from None
        return list(tok(text, add_special_tokens=False)["input_ids"])

    def check_ids(self, ids: list[int], param: str) -> None:
        vocab = len(self.engine.tokenizer)
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise APIError(
                400, f"{param}: token id {bad[0]} is outside the vocabulary [0, {vocab})", param=param
            )

    def limit_tokens(self, n_prompt: int, max_tokens: int | None, param: str, prompt_param: str) -> int:
        """`check_request` (the engine's rule) as a 400 naming the field."""
        try:
            return check_request(n_prompt, max_tokens, self.max_model_len, prompt_param, param)
        except RequestError as e:
            raise APIError(400, str(e), param=e.field, code=e.code) from None

    def sampling(
        self,
        req: Any,
        max_tokens: int,
        structured: Any = None,
        logprobs: int | None = None,
        prompt_logprobs: int | None = None,
    ) -> Any:
        from modeldeploy.runtime import SamplingParams

        temperature = 0.0 if req.temperature < GREEDY_EPS else req.temperature
        bias = {}
        for key, value in (req.logit_bias or {}).items():
            if not key.isdigit() or int(key) >= len(self.engine.tokenizer):
                raise APIError(
                    400,
                    f"logit_bias: key {key!r} is not a token id of this model's vocabulary",
                    param="logit_bias",
                )
            bias[int(key)] = float(value)
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            seed=req.seed,
            stop=req.stop_list(),
            ignore_eos=req.ignore_eos,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            repetition_penalty=req.repetition_penalty,
            logit_bias=bias,
            min_tokens=req.min_tokens,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            n=getattr(req, "n", 1),
            structured=structured,
        )
        try:
            params.validate()
        except ValueError as e:
            msg = str(e)
            param = next((f for f in _SAMPLING_FIELDS if f in msg), None)
            raise APIError(400, msg, param=param) from None
        return params

    # ---- introspection ---------------------------------------------------------------
    def engine_info(self) -> dict[str, Any]:
        if not self.ready and self.state.status != "draining":
            return {}
        try:
            return dict(self.engine.info())
        except Exception:  # noqa: BLE001 - info is best effort while loading
            return {}

    def effective_config(self) -> dict[str, Any]:
        cfg = self.engine.config if self.state.load_seconds else self.cfg.engine
        return dataclasses.asdict(cfg)

    def bundle(self) -> dict[str, Any]:
        info = self.engine_info()
        ecfg = self.effective_config()
        return {
            "bundle_id": ecfg.get("bundle_id", ""),
            "served_model_name": self.cfg.served_model_name,
            "status": self.state.status,
            "engine_build": self.cfg.engine_build,
            "model": {
                "path": ecfg.get("model"),
                "revision": self.cfg.model_revision,
                "digest": info.get("model_digest") or ecfg.get("model_digest"),
                "architecture": info.get("architecture"),
            },
            "tokenizer": {"digest": info.get("tokenizer_digest") or ecfg.get("tokenizer_digest")},
            "chat_template": self.chat_template_info(),
            "adapters": info.get("adapters") or ecfg.get("adapters", []),
            "lora": info.get("lora"),
            "device": info.get("device", ecfg.get("device")),
            "dtype": info.get("dtype", ecfg.get("dtype")),
            "engine_config": ecfg,
            "engine_info": info,
            "grammar_library": info.get("grammar_library") or _grammar_library(),
            "parallel": info.get("parallel")
            or {"tensor_parallel_size": ecfg.get("tensor_parallel_size", 1), "worker_pids": []},
            "server": {
                "max_num_seqs": self.admission.max_running,
                "max_queue": self.cfg.max_queue,
                "max_queued_tokens": self.cfg.max_queued_tokens,
                "queue_budget_s": self.cfg.queue_budget_s,
                "drain_timeout_s": self.cfg.drain_timeout_s,
                "auth": self.cfg.api_key is not None,
            },
        }

    def live_values(self) -> dict[str, Any]:
        stats = None
        if self.state.load_seconds:
            try:
                stats = self.engine.stats()
            except Exception:  # noqa: BLE001 - a scrape must never fail
                stats = None
        info = self.engine_info()
        ecfg = self.cfg.engine
        return {
            "running": self.admission.running,
            "waiting": self.admission.waiting,
            "rejections": {r: self.admission.rejections[r] for r in REASONS},
            "late_starts": self.admission.late_starts,
            "waits": self.admission.waits,
            "queued_tokens": self.admission.queued_tokens,
            "kv_usage": getattr(stats, "kv_usage", 0.0),
            "load_progress": self.state.progress,
            "load_seconds": self.state.load_seconds,
            "prompt_tokens": getattr(stats, "prompt_tokens_total", 0),
            "generation_tokens": getattr(stats, "generation_tokens_total", 0),
            "preemptions": getattr(stats, "preemptions_total", 0),
            "lora_resident": {n: n in getattr(stats, "lora_resident", ()) for n in self.adapter_names},
            "lora_loads": getattr(stats, "lora_loads_total", 0),
            "tensor_parallel_size": getattr(stats, "tensor_parallel_size", ecfg.tensor_parallel_size),
            "tp_allreduce_bytes": getattr(stats, "tp_allreduce_bytes_total", 0),
            "build_info": {
                "bundle": ecfg.bundle_id,
                "engine_build": self.cfg.engine_build,
                "model": self.cfg.served_model_name,
                "model_revision": self.cfg.model_revision,
                "model_digest": str(info.get("model_digest") or ecfg.model_digest or ""),
                "tokenizer_digest": str(info.get("tokenizer_digest") or ecfg.tokenizer_digest or ""),
                "device": str(info.get("device", ecfg.device)),
                "dtype": str(info.get("dtype", ecfg.dtype)),
            },
        }


def _grammar_library() -> dict[str, str]:
    """The constrained-decoding library this image carries (known before the engine has loaded)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return {"name": "xgrammar", "version": version("xgrammar")}
    except PackageNotFoundError:
        return {"name": "xgrammar", "version": "not installed"}
