"""How big the KV cache is, and the context it can serve: the CPU budget from the memory the process
can still take (a pod's cgroup limit included), the blocks that fit on either device, and
max_model_len lowered to what they hold (LLMEngine calls these once, at load)."""

from __future__ import annotations

import logging

import torch

from modeldeploy.runtime.config import EngineConfig
from modeldeploy.runtime.loader import Loaded

log = logging.getLogger("modeldeploy.engine")

# The default CPU KV budget (kv_cache_cpu_bytes unset): this share of the memory available once the
# weights are resident, at most CPU_KV_CAP, across all tensor-parallel ranks. vLLM's CPU backend takes a
# fixed 4 GiB unless VLLM_CPU_KVCACHE_SPACE says otherwise; a fixed size fails on a small pod and the
# old 256 MiB could not hold one 8192-token sequence of a 30-layer model, so we take half of what is free
# (the other half: activations, the tokenizer, the server, other processes) and keep vLLM's 4 GiB as the
# ceiling, which holds 11 full 8192-token contexts of SmolLM2-135M in float32.
CPU_KV_SHARE = 0.5
CPU_KV_CAP = 4 << 30
CPU_KV_UNKNOWN = 1 << 30  # where no memory figure can be read (not Linux): a modest fixed budget


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


def available_memory_bytes() -> int | None:
    """Memory this process can still take: the kernel's MemAvailable, bounded by the cgroup's limit less
    its non-reclaimable usage (in a pod, MemAvailable is the node's, the limit is the container's)."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    for limit_path, usage_path in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        limit, usage = _read_int(limit_path), _read_int(usage_path)
        if limit is None or usage is None or limit >= 1 << 60:  # cgroup v1 writes a huge number for none
            continue
        room = max(0, limit - usage + _cgroup_inactive_file(limit_path))
        avail = room if avail is None else min(avail, room)
        break
    return avail


def _cgroup_inactive_file(limit_path: str) -> int:
    """Page cache the cgroup would drop before failing an allocation (counted in its usage)."""
    stat = limit_path.rsplit("/", 1)[0] + "/memory.stat"
    try:
        with open(stat) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key in ("inactive_file", "total_inactive_file"):
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def cpu_kv_budget(available: int | None, ranks: int = 1) -> int:
    """Bytes of KV cache per rank when kv_cache_cpu_bytes is unset (see CPU_KV_SHARE)."""
    total = CPU_KV_UNKNOWN if available is None else int(min(CPU_KV_CAP, CPU_KV_SHARE * available))
    return max(1, total // ranks)


def fit_max_model_len(config: EngineConfig, loaded: Loaded, num_blocks: int) -> int:
    """The context length the KV cache can serve: one sequence must fit in all its blocks. A length
    the user set is kept or refused; the model's default is lowered to what fits, with a log line."""
    block, want = config.block_size, loaded.max_model_len
    per_seq = (want + block - 1) // block
    if num_blocks >= per_seq:
        return want
    budget = (
        "num_kv_blocks"
        if config.num_kv_blocks
        else "kv_cache_fraction"
        if loaded.device.type == "cuda"
        else "kv_cache_cpu_bytes"
    )
    if config.max_model_len is not None:
        raise ValueError(
            f"max_model_len: {want} tokens need {per_seq} KV blocks of {block} tokens, but the KV "
            f"cache has {num_blocks} ({budget}); lower max_model_len or give the cache more memory"
        )
    fits = num_blocks * block
    log.warning(
        "max_model_len: lowered from %d (the model's) to %d tokens, what %d KV blocks of %d tokens "
        "hold (%s); set it, or give the cache more memory, to change this",
        want,
        fits,
        num_blocks,
        block,
        budget,
    )
    return fits


def block_bytes(loaded: Loaded, block_size: int) -> int:
    """Bytes of one KV block on this rank (its kv heads only under tensor parallelism): a key and a
    value tensor per layer, as the model runner allocates them."""
    a = loaded.rank_args
    return 2 * a.num_layers * block_size * a.num_kv_heads * a.head_dim * loaded.dtype.itemsize


def auto_blocks(
    config: EngineConfig, loaded: Loaded, reserved_bytes: int = 0, worker_free: int | None = None
) -> int:
    """KV blocks that fit: on cuda, free memory less activations and `reserved_bytes`
    (the LoRA slots, allocated after this), times kv_cache_fraction. Per rank under tensor
    parallelism: a block holds this rank's kv heads, and the rank with least free memory decides."""
    per_block = block_bytes(loaded, config.block_size)
    per_seq = (loaded.max_model_len + config.block_size - 1) // config.block_size
    if loaded.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(loaded.device)
        if worker_free is not None:
            free = min(free, worker_free)
        a = loaded.args
        activations = config.max_num_batched_tokens * (
            4 * loaded.rank_args.intermediate_size + 8 * a.hidden_size
        ) * 4 + (512 << 20)
        return max(1, int((free - activations - reserved_bytes) * config.kv_cache_fraction) // per_block)
    budget = config.kv_cache_cpu_bytes
    if budget is None:
        budget = cpu_kv_budget(available_memory_bytes(), config.tensor_parallel_size)
    return max(1, min(budget // per_block, config.max_num_seqs * per_seq))
