"""EngineConfig: every knob of the engine in one dataclass, defaults visible.

`dataclasses.asdict(config)` after `resolve()` is the effective configuration that the
server publishes on /v1/bundle, so nothing here may be implicit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
LOAD_FORMATS = ("safetensors", "dummy")
PREFILL_ORDERS = ("auto", "fcfs", "shortest")
# prefill_order "auto" on cpu: shortest-first with this step bound unless target_itl_ms is given. Why
# 500 ms: a 1536-token prompt takes ~2 s to prefill on 2 cores, so one unbounded step made a short
# prompt arriving during it miss a 1.5 s TTFT; in 500 ms steps it waits one step, and the chunks stay
# big enough to keep the GEMMs efficient and decodes a small share of each step (150 ms collapsed past
# capacity: bench/results/serving_real_cpu.md).
CPU_STEP_TARGET_MS = 500.0
# and this TTFT target: a prompt that can still meet it keeps its place in arrival order
# (engine/core/scheduler.py)
CPU_TTFT_TARGET_MS = 1500.0
ADAPTER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # DNS label: also a URL/metric-safe model name


def knob(default: Any, help: str, **meta: Any) -> Any:
    """A field with its help text (and `choices`, if any): `modeldeploy serve` derives its flags from
    these, so each default and its description live here only."""
    return field(default=default, metadata={"help": help, **meta})


@dataclass
class EngineConfig:
    model: str = knob("", "model directory (HF layout: config, tokenizer, safetensors)")
    tokenizer: str | None = knob(None, "tokenizer directory (default: the model's)")
    dtype: str = knob("auto", "auto: the config's torch dtype on cuda, float32 on cpu", choices=DTYPES)
    device: str = knob("auto", "auto: cuda when available", choices=DEVICES)
    max_num_seqs: int = knob(16, "sequences running in the engine at once")
    max_num_batched_tokens: int = knob(2048, "tokens per step, prefill chunks and decodes together")
    # The chunked-prefill time bound (engine/core/scheduler.py, PrefillCost): a step's prefill chunk is sized
    # from the measured seconds per prefill token so the step (decode rows first) stays under this.
    target_itl_ms: float | None = knob(
        None,
        "target step time in milliseconds, the inter-token latency decoding streams see while prompts "
        "prefill: each step's prefill chunk is sized from the measured per-token prefill cost to stay "
        "under it (default: off, only max_num_batched_tokens bounds a step)",
    )
    target_ttft_ms: float | None = knob(
        None,
        "target time to first token in milliseconds, for prefill_order shortest or auto: a prompt whose "
        "remaining prefill (at the measured per-token cost) still fits before it keeps its place in "
        "arrival order, one that cannot falls behind the shortest-first rest (default: off)",
    )
    # engine/core/scheduler.py: which prompts' prefill a step carries first
    prefill_order: str = knob(
        "auto",
        "fcfs: prompts prefill in arrival order; shortest: fewest prompt tokens left first (a prompt "
        "waiting longer than 4 s goes first), and with target_itl_ms every step's prefill is bounded "
        "by time, so a short prompt arriving during a long one waits one chunk, not the whole prompt; "
        f"auto: shortest on cpu with target_itl_ms {CPU_STEP_TARGET_MS:.0f} and target_ttft_ms "
        f"{CPU_TTFT_TARGET_MS:.0f} unless set, fcfs on cuda (shortest if target_ttft_ms is set)",
        choices=PREFILL_ORDERS,
    )
    max_model_len: int | None = knob(
        None,
        "context length in tokens (default: the model's max_position_embeddings, times its RoPE scaling "
        "factor where that extends it, lowered with a log line to what the KV cache holds; given "
        "explicitly, a KV cache that cannot hold it is an error)",
    )
    block_size: int = knob(16, "tokens per KV block")
    num_kv_blocks: int | None = knob(
        None, "KV blocks (default: sized from kv_cache_fraction on cuda, kv_cache_cpu_bytes on cpu)"
    )
    kv_cache_fraction: float = knob(0.9, "share (0-1] of free device memory given to the KV cache (cuda)")
    # None: sized at load from the memory available after the weights (engine/llm_engine.py,
    # cpu_kv_budget), then resolved here so /v1/bundle shows the bytes that were used.
    kv_cache_cpu_bytes: int | None = knob(
        None,
        "KV cache size in bytes on cpu when num_kv_blocks is unset (default: half the memory available "
        "after the weights load, container limit included, at most 4 GiB)",
    )
    enable_prefix_caching: bool = knob(True, "reuse the KV blocks of a shared prompt prefix")
    enable_chunked_prefill: bool = knob(True, "split long prompts over steps within the token budget")
    model_digest: str | None = knob(
        None, "refuse to serve unless the model dir has this digest (default: not checked)"
    )
    tokenizer_digest: str | None = knob(
        None, "refuse to serve unless the tokenizer dir has this digest (default: not checked)"
    )
    bundle_id: str = knob("", "bundle id: keys the prefix cache, labels every metric series (default: empty)")
    load_format: str = knob(
        "safetensors", "dummy: random weights from config.json (benchmarks)", choices=LOAD_FORMATS
    )
    seed: int = knob(0, "seed of dummy weights")
    grammar_cache_size: int = knob(64, "compiled grammars kept (LRU by schema hash)")
    extra: dict[str, str] = field(default_factory=dict)
    # vLLM's --hf-overrides: fields of the model's config.json replaced at load (a JSON object;
    # nested objects merge; `rope_theta` reaches `rope_parameters` where the config keeps it there).
    # Part of the serving config, so part of the bundle id: a numerics change is a new bundle.
    hf_overrides: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "JSON object of model config fields to override at load, e.g. '{\"rope_theta\": 1e6}' "
            "(default: none)"
        },
    )
    # LoRA adapters, pinned like the model: [{"name", "path", "digest", "revision"}]; a request
    # selects one by name. At most max_loras are on the device at once, the rest in host memory.
    adapters: list[dict[str, str]] = field(default_factory=list)
    max_loras: int = knob(4, "adapters held on the device at once")
    # Tensor parallelism: ranks in this pod (rank 0 = the engine process, ranks 1.. = worker
    # processes that only run the model); gloo on cpu, NCCL on cuda (one GPU per rank).
    tensor_parallel_size: int = knob(
        1, "ranks the model is split over: one process and one GPU each (gloo on cpu)"
    )
    tp_timeout_s: float = knob(
        30.0, "seconds a collective may wait for a rank before the engine fails (a hung rank)"
    )
    # Pure-decode steps replay CUDA graphs captured at load, one per batch-size bucket
    # (engine/worker/graphs.py); cuda only, without tensor parallelism. Off by default until the GPU
    # check has measured it.
    cuda_graphs: bool = knob(
        False,
        "replay pure-decode steps from CUDA graphs captured at load (cuda only, no tensor parallelism)",
    )

    def resolve_schedule(self, device: str) -> None:
        """prefill_order "auto" -> what runs on `device` (see CPU_STEP_TARGET_MS), so /v1/bundle shows
        the policy used. A GPU step carrying a whole long prompt is tens of milliseconds, so arrival
        order costs nothing there; on CPU it is seconds."""
        if self.prefill_order != "auto":
            return
        if device != "cpu":  # a TTFT target given asks for its order on any device
            self.prefill_order = "fcfs" if self.target_ttft_ms is None else "shortest"
            return
        self.prefill_order = "shortest"
        if self.target_itl_ms is None and self.enable_chunked_prefill:
            self.target_itl_ms = CPU_STEP_TARGET_MS
        if self.target_ttft_ms is None:
            self.target_ttft_ms = CPU_TTFT_TARGET_MS

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        if not self.model:
            raise ValueError("model: a model directory is required")
        for f in fields(self):  # every knob declared with `choices` (dtype, device, prefill_order, ...)
            allowed = f.metadata.get("choices")
            if allowed is not None and getattr(self, f.name) not in allowed:
                raise ValueError(f"{f.name}: {getattr(self, f.name)!r} is not one of {', '.join(allowed)}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "grammar_cache_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("max_model_len", "num_kv_blocks", "kv_cache_cpu_bytes"):  # None: sized at load
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        self._validate_schedule()
        if not 0.0 < self.kv_cache_fraction <= 1.0:
            raise ValueError(f"kv_cache_fraction: must be in (0, 1], got {self.kv_cache_fraction}")
        for name in ("model_digest", "tokenizer_digest"):
            v = getattr(self, name)
            if v is not None and not (v.startswith("sha256:") and len(v) == 71):
                raise ValueError(f"{name}: must be 'sha256:' + 64 hex digits, got {v!r}")
        if not isinstance(self.hf_overrides, dict) or not all(isinstance(k, str) for k in self.hf_overrides):
            raise ValueError(f"hf_overrides: must be a JSON object, got {self.hf_overrides!r}")
        self._validate_adapters()
        self._validate_parallel()
        if (
            not self.enable_chunked_prefill
            and self.max_model_len is not None
            and self.max_num_batched_tokens < self.max_model_len
        ):
            raise ValueError(
                "max_num_batched_tokens: without chunked prefill it must be >= max_model_len "
                f"({self.max_num_batched_tokens} < {self.max_model_len})"
            )

    def _validate_schedule(self) -> None:
        if self.target_itl_ms is not None and not (self.target_itl_ms > 0 and self.enable_chunked_prefill):
            raise ValueError(
                f"target_itl_ms: must be > 0 and needs chunked prefill, got {self.target_itl_ms} "
                f"(enable_chunked_prefill {self.enable_chunked_prefill})"
            )
        if self.target_ttft_ms is not None and not self.target_ttft_ms > 0:
            raise ValueError(f"target_ttft_ms: must be > 0, got {self.target_ttft_ms}")
        if self.target_ttft_ms is not None and self.prefill_order == "fcfs":
            raise ValueError(
                f"target_ttft_ms: orders prompts by deadline, which needs prefill_order shortest or auto, "
                f"got fcfs (target_ttft_ms {self.target_ttft_ms})"
            )

    def _validate_parallel(self) -> None:
        tp = self.tensor_parallel_size
        if not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tensor_parallel_size: must be an integer >= 1, got {tp!r}")
        if not self.tp_timeout_s > 0:
            raise ValueError(f"tp_timeout_s: must be > 0, got {self.tp_timeout_s}")
        if self.cuda_graphs and tp > 1:
            raise ValueError(
                f"cuda_graphs: not supported with tensor parallelism yet (tensor_parallel_size {tp})"
            )
        if self.cuda_graphs and self.device == "cpu":
            raise ValueError("cuda_graphs: needs a CUDA device (device is cpu)")
        if tp > 1 and self.adapters:
            raise ValueError(
                f"tensor_parallel_size: LoRA adapters are not supported with tensor parallelism yet "
                f"(tensor_parallel_size {tp}, {len(self.adapters)} adapter(s))"
            )

    def _validate_adapters(self) -> None:
        if not isinstance(self.max_loras, int) or self.max_loras < 1:
            raise ValueError(f"max_loras: must be an integer >= 1, got {self.max_loras!r}")
        seen: set[str] = set()
        for i, pin in enumerate(self.adapters):
            where = f"adapters[{i}]"
            unknown = set(pin) - {"name", "path", "digest", "revision"}
            if unknown:
                raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
            name = pin.get("name", "")
            if not isinstance(name, str) or len(name) > 63 or not ADAPTER_NAME.match(name):
                raise ValueError(
                    f"{where}.name: {name!r} is not a DNS label (lowercase letters, digits, '-', at most 63)"
                )
            if name in seen:
                raise ValueError(f"{where}.name: {name!r} is given twice")
            seen.add(name)
            if not pin.get("path"):
                raise ValueError(f"{where}.path: adapter {name!r} needs a directory")
            d = pin.get("digest")
            if d and not (d.startswith("sha256:") and len(d) == 71):
                raise ValueError(f"{where}.digest: must be 'sha256:' + 64 hex digits, got {d!r}")
