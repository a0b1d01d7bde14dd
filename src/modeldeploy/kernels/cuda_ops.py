"""The CuPy kernels by dispatch name, for `dispatch` to register.

`dispatch` imports this module the first time it sees a CUDA tensor and copies `KERNELS` into
its table; this module never imports `dispatch`, so the dependency runs one way. Without CuPy
the import raises ImportError and dispatch keeps using the torch twins. Each wrapper falls
back to its twin for layouts or dtypes its kernel does not cover (e.g. head_dim 96).
"""

from __future__ import annotations

import cupy  # noqa: F401  (ImportError here = no CUDA kernels)

from modeldeploy.kernels import activation, attention, cache, lora, norm, quant_cuda, rotary

KERNELS = {
    "rms_norm": norm.rms_norm,
    "rotary_embedding": rotary.rotary_embedding,
    "silu_and_mul": activation.silu_and_mul,
    "write_kv": cache.write_kv,
    "paged_attention_decode": attention.paged_attention_decode,
    "paged_attention_prefill": attention.paged_attention_prefill,
    "lora_apply": lora.lora_apply,
    "quant_linear": quant_cuda.linear,
}
