"""`modeldeploy serve`: the runtime server under uvicorn, with SIGTERM draining.

The port opens at once and weights load in the background (see readiness.py). On the
first SIGTERM/SIGINT the server keeps listening but reports 503 on /health/ready and
refuses new requests, lets admitted requests (streams too) finish within --drain-timeout,
then exits 0. A second signal exits at once.

Test hooks: env MODELDEPLOY_LOAD_DELAY_S (or the hidden flag --load-delay S) waits S seconds
before loading, so readiness-during-load can be observed on a tiny model; env
MODELDEPLOY_STEP_DELAY_S (or --step-delay S) sleeps S seconds after every engine step, a
deliberately slowed server for `modeldeploy bench` compare tests; env
MODELDEPLOY_IGNORE_RESPONSE_FORMAT=1 serves response_format unconstrained, an engine whose structured
output broke, for the conformance gate's e2e. Never set them in production.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import sys
import threading
import typing
from pathlib import Path
from typing import Any

import uvicorn

from modeldeploy.runtime.server.config import ServerConfig
from modeldeploy.runtime.server.limits import add_limit_flags, limits_from_args

log = logging.getLogger("modeldeploy.server")


# The EngineConfig fields `serve` takes as flags, and the flag of each whose name is not
# --field-name. Type, default, choices and help come from the field (runtime/config.py).
ENGINE_FLAGS: dict[str, str | None] = {
    "model": None,
    "tokenizer": None,
    "max_num_seqs": None,
    "max_model_len": None,
    "max_num_batched_tokens": None,
    "target_itl_ms": None,
    "target_ttft_ms": None,
    "prefill_order": None,
    "block_size": None,
    "num_kv_blocks": None,
    "kv_cache_fraction": None,
    "kv_cache_cpu_bytes": None,
    "enable_prefix_caching": "--no-prefix-caching",
    "enable_chunked_prefill": "--no-chunked-prefill",
    "grammar_cache_size": None,
    "device": None,
    "dtype": None,
    "load_format": None,
    "max_loras": None,
    "tensor_parallel_size": None,
    "cuda_graphs": None,
    "tp_timeout_s": "--tp-timeout",
    "bundle_id": None,
    "model_digest": None,
    "tokenizer_digest": None,
    "hf_overrides": None,
}


def engine_flag(name: str) -> str:
    return ENGINE_FLAGS.get(name) or "--" + name.replace("_", "-")


def json_object(text: str) -> dict[str, Any]:
    """argparse type of a dict field: a JSON object (argparse names the flag on a ValueError)."""
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {type(value).__name__}")
    return value


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    """One flag per ENGINE_FLAGS field, dest = the field's name. A bool field that is on by default
    is turned off by its --no-... flag; one that is off is turned on by its flag."""
    from modeldeploy.runtime.config import EngineConfig

    types = typing.get_type_hints(EngineConfig)
    fields = {f.name: f for f in dataclasses.fields(EngineConfig)}
    defaults = EngineConfig()
    for name in ENGINE_FLAGS:
        f, kind, flag = fields[name], types[name], engine_flag(name)
        help_ = f.metadata["help"]
        if kind is bool:
            help_ = f"turn off: {help_} (on by default)" if f.default else f"{help_} (default: off)"
            p.add_argument(flag, dest=name, action="store_false" if f.default else "store_true", help=help_)
            continue
        base = [t for t in typing.get_args(kind) if t is not type(None)] or [kind]
        parse = json_object if typing.get_origin(kind) is dict else base[0]
        kw: dict[str, Any] = {"dest": name, "type": parse, "metavar": flag[2:].replace("-", "_").upper()}
        if "choices" in f.metadata:
            kw.update(choices=list(f.metadata["choices"]), metavar=None)
        if name == "model":
            kw["required"] = True
        else:
            kw["default"] = getattr(defaults, name)
            if kw["default"] not in (None, "", {}):
                help_ = f"{help_} (default: {kw['default']})"
        p.add_argument(flag, help=help_, **kw)


def configure(p: argparse.ArgumentParser) -> None:
    add_engine_flags(p)
    add_limit_flags(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument(
        "--port",
        type=int,
        default=8000,
        help="TCP port to listen on; 0: any free port (default: %(default)s)",
    )
    p.add_argument(
        "--served-model-name", default=None, help="the `model` clients send (default: the model dir's name)"
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=64,
        help="requests that may wait for a slot; beyond: 429 (default: %(default)s)",
    )
    p.add_argument(
        "--max-queued-tokens",
        type=int,
        default=0,
        help="prompt tokens that may wait together; beyond: 429 (default: 0, no bound)",
    )
    p.add_argument(
        "--queue-budget",
        type=float,
        default=None,
        help="seconds a request may be expected to wait for a slot; beyond: 429 at once "
        "(default: none; a client's x-request-deadline-ms header sets its own)",
    )
    p.add_argument(
        "--adapter",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a LoRA adapter (PEFT directory) served as model NAME; repeatable (default: none)",
    )
    p.add_argument(
        "--adapter-digest",
        action="append",
        default=[],
        metavar="NAME=DIGEST",
        help="refuse to serve unless adapter NAME's directory has this digest (default: not checked)",
    )
    p.add_argument(
        "--adapter-revision",
        action="append",
        default=[],
        metavar="NAME=REV",
        help="adapter NAME's revision, a label in /v1/bundle (default: empty)",
    )
    p.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE",
        help="a Jinja chat template file that replaces the tokenizer's for every chat request (vLLM's "
        "--chat-template); read and compiled at start, its sha256 shown in /v1/bundle "
        "(default: the tokenizer's template)",
    )
    p.add_argument(
        "--model-revision", default="", help="bundle.model.revision, a metric label (default: empty)"
    )
    p.add_argument(
        "--engine-build",
        default=os.environ.get("MODELDEPLOY_ENGINE_BUILD", ""),
        help="engine image digest / build id (default: env MODELDEPLOY_ENGINE_BUILD, else empty)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="seconds in-flight requests get to finish on SIGTERM (default: %(default)s)",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("MODELDEPLOY_API_KEY"),
        help="require 'Authorization: Bearer KEY' on /v1/* (default: env MODELDEPLOY_API_KEY, else open)",
    )
    p.add_argument(
        "--gate-key-sha256",
        default=os.environ.get("MODELDEPLOY_GATE_KEY_SHA256") or None,
        help="with --api-key: also accept a bearer token whose sha256 is this hex digest, the operator's "
        "gate credential; the pod never holds the token itself "
        "(default: env MODELDEPLOY_GATE_KEY_SHA256, else none)",
    )
    p.add_argument(
        "--engine-core",
        choices=["process", "thread"],
        default="process",
        help="where the step loop runs: a process of its own, or a thread of the server "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level (default: %(default)s)",
    )
    p.add_argument("--access-log", action="store_true", help="log every HTTP request (default: off)")
    p.add_argument(
        "--load-delay",
        type=float,
        default=float(os.environ.get("MODELDEPLOY_LOAD_DELAY_S", "0")),
        help=argparse.SUPPRESS,
    )
    p.add_argument(
        "--step-delay",
        type=float,
        default=float(os.environ.get("MODELDEPLOY_STEP_DELAY_S", "0")),
        help=argparse.SUPPRESS,
    )


def build_config(args: argparse.Namespace) -> ServerConfig:
    from modeldeploy.runtime import EngineConfig

    for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "tensor_parallel_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"{engine_flag(name)} must be >= 1, got {getattr(args, name)}")
    if not 1 <= args.port <= 65535 and args.port != 0:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    adapters = adapter_pins(args.adapter, args.adapter_digest, args.adapter_revision)
    engine = EngineConfig(**{name: getattr(args, name) for name in ENGINE_FLAGS}, adapters=adapters)
    if args.cuda_graphs and args.device == "cpu":
        raise ValueError("--cuda-graphs: needs a CUDA device (--device is cpu)")
    if args.cuda_graphs and args.tensor_parallel_size > 1:
        raise ValueError("--cuda-graphs: not supported with --tensor-parallel-size > 1 yet")
    if args.tp_timeout_s <= 0:
        raise ValueError(f"--tp-timeout must be > 0, got {args.tp_timeout_s}")
    if args.tensor_parallel_size > 1 and adapters:
        raise ValueError("--tensor-parallel-size: LoRA adapters (--adapter) are not supported with it yet")
    name = args.served_model_name or Path(args.model).resolve().name
    chat_template = None
    if args.chat_template is not None:
        from modeldeploy.runtime.chat_template import load_chat_template

        chat_template = load_chat_template(args.chat_template)  # ValueError naming --chat-template
    if name in {a["name"] for a in adapters}:
        raise ValueError(f"--adapter: {name!r} is also the served model name")
    cfg = ServerConfig(
        engine=engine,
        served_model_name=name,
        max_queue=args.max_queue,
        max_queued_tokens=args.max_queued_tokens,
        queue_budget_s=args.queue_budget,
        api_key=args.api_key,
        gate_key_sha256=args.gate_key_sha256,
        drain_timeout_s=args.drain_timeout,
        load_delay_s=args.load_delay,
        step_delay_s=args.step_delay,
        ignore_response_format=os.environ.get("MODELDEPLOY_IGNORE_RESPONSE_FORMAT") == "1",
        engine_build=args.engine_build,
        model_revision=args.model_revision,
        engine_core=args.engine_core,
        limits=limits_from_args(args),
        chat_template=chat_template,
    )
    cfg.validate()
    return cfg


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        name, sep, rest = v.partition("=")
        if not sep or not name or not rest:
            raise ValueError(f"{flag}: expected NAME=VALUE, got {v!r}")
        if name in out:
            raise ValueError(f"{flag}: {name!r} is given twice")
        out[name] = rest
    return out


def adapter_pins(paths: list[str], digests: list[str], revisions: list[str]) -> list[dict[str, str]]:
    """--adapter / --adapter-digest / --adapter-revision -> EngineConfig.adapters."""
    by_path = _pairs(paths, "--adapter")
    by_digest = _pairs(digests, "--adapter-digest")
    by_rev = _pairs(revisions, "--adapter-revision")
    for flag, names in (("--adapter-digest", by_digest), ("--adapter-revision", by_rev)):
        extra = sorted(set(names) - set(by_path))
        if extra:
            raise ValueError(f"{flag}: {extra[0]!r} is not an --adapter")
    pins = []
    for name, path in by_path.items():
        pin = {"name": name, "path": path}
        if name in by_digest:
            pin["digest"] = by_digest[name]
        if name in by_rev:
            pin["revision"] = by_rev[name]
        pins.append(pin)
    return pins


def main(args: argparse.Namespace) -> int:
    from modeldeploy.runtime.engine.client.engine_core import LOG_FORMAT  # the core process logs the same way

    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT)
    try:
        cfg = build_config(args)
    except ValueError as e:
        print(f"modeldeploy serve: error: {e}", file=sys.stderr)
        return 2
    from modeldeploy.runtime.server.app import create_app

    app = create_app(cfg, freeze_heap=True)
    # Idle keep-alive connections stay open longer than a load balancer's idle timeout (ALB 60 s):
    # with uvicorn's 5 s, a balancer reusing a connection just as the server closes it answers 502.
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=args.access_log,
        timeout_graceful_shutdown=5,
        lifespan="on",
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    server = DrainingServer(config, app.state.ctx)
    server.run()
    return server.exit_code


KEEP_ALIVE_S = 75
# After the engine dies: health answers 503 for FATAL_GRACE_S (probes and load balancers see it, open
# streams get their error event), then uvicorn stops; the process is gone by FATAL_BACKSTOP_S regardless.
FATAL_GRACE_S = 1.0
FATAL_BACKSTOP_S = 8.0


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first SIGTERM/SIGINT drains instead of closing the socket at once."""

    def __init__(self, config: uvicorn.Config, ctx):
        super().__init__(config)
        self.ctx = ctx
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False
        self.exit_code = 0
        ctx.exit_on_fatal = self._fatal

    def _fatal(self) -> None:
        """The engine died: stop serving and exit 1 (any thread). uvicorn closes within its graceful
        timeout; a backstop timer ends the process regardless, so a dead rank never leaves a hang."""
        if self.exit_code:
            return
        self.exit_code = 1
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.call_later, FATAL_GRACE_S, self._stop_now)
        else:
            self._stop_now()
        backstop = threading.Timer(FATAL_BACKSTOP_S, os._exit, args=(1,))
        backstop.daemon = True
        backstop.start()

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def _stop_now(self) -> None:
        self.should_exit = True

    def handle_exit(self, sig: int, frame) -> None:
        if not self._draining and self._loop is not None and not self.should_exit:
            self._draining = True
            log.info(
                "received %s: draining (timeout %.1fs)",
                signal.Signals(sig).name,
                self.ctx.cfg.drain_timeout_s,
            )
            self._loop.call_soon_threadsafe(self._start_drain)
            return
        super().handle_exit(sig, frame)  # second signal: stop now

    def _start_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self._drain())  # keep a reference: tasks are weakly held

    async def _drain(self) -> None:
        clean = await self.ctx.drain()
        log.info("drain %s; shutting down", "complete" if clean else "timed out")
        self.should_exit = True
