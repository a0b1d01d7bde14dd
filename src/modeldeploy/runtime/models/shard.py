"""Which slice of each weight a tensor-parallel rank holds (Megatron layout).

- Column-parallel (output rows split): q/k/v by heads (with Qwen2's biases), gate/up by the
  intermediate size. Each rank computes its own heads' attention end to end.
- Row-parallel (input columns split, partial sums all-reduced): o_proj and down_proj.
- KV heads: split when there are at least as many as ranks (they must divide), replicated when
  fewer (the ranks must be a multiple: rank r holds kv head r // (N / Hkv), as vLLM does), so
  every rank's query heads find their kv head locally. The KV cache is sharded the same way.
- Replicated: the RMSNorm weights (Qwen3's per-head q/k norms too) and the embedding. The
  embedding is a lookup, not a matmul: replicating it costs memory (V x E per rank) but no
  compute, and saves an all-reduce of the whole hidden stream every step.
- The LM head lives on rank 0 only: rank 0 is the only rank that samples, so the others never
  compute logits (with tied embeddings it is the embedding, which every rank has anyway).

Each rank reads only its slices from safetensors (`loader.py`): no rank materialises the model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from modeldeploy.runtime.models.llama import ModelArgs

LM_HEAD = "lm_head.weight"


@dataclass(frozen=True)
class Shard:
    rank: int = 0
    size: int = 1

    @property
    def parallel(self) -> bool:
        return self.size > 1

    def check(self, args: ModelArgs) -> None:
        """ValueError naming the config field and the numbers when the model cannot be split N ways."""
        n = self.size
        if args.num_heads % n:
            raise ValueError(
                f"tensor_parallel_size: num_attention_heads {args.num_heads} is not divisible "
                f"by tensor_parallel_size {n}"
            )
        hkv = args.num_kv_heads
        if hkv >= n and hkv % n:
            raise ValueError(
                f"tensor_parallel_size: num_key_value_heads {hkv} is not divisible by "
                f"tensor_parallel_size {n}"
            )
        if hkv < n and n % hkv:
            raise ValueError(
                f"tensor_parallel_size: {n} is not a multiple of num_key_value_heads {hkv} "
                "(kv heads are replicated when there are fewer than ranks)"
            )
        if args.intermediate_size % n:
            raise ValueError(
                f"tensor_parallel_size: intermediate_size {args.intermediate_size} is not divisible "
                f"by tensor_parallel_size {n}"
            )

    def kv_heads(self, args: ModelArgs) -> tuple[int, int]:
        """(first kv head, count) this rank holds."""
        n, hkv = self.size, args.num_kv_heads
        if hkv >= n:
            per = hkv // n
            return self.rank * per, per
        return self.rank // (n // hkv), 1

    def kv_head_replicas(self, args: ModelArgs) -> int:
        return max(1, self.size // args.num_kv_heads)

    def rank_args(self, args: ModelArgs) -> ModelArgs:
        """The shapes this rank's layers run with: its heads, kv heads and intermediate slice."""
        return dataclasses.replace(
            args,
            num_heads=args.num_heads // self.size,
            num_kv_heads=self.kv_heads(args)[1],
            intermediate_size=args.intermediate_size // self.size,
        )

    def wants(self, name: str) -> bool:
        return name != LM_HEAD or self.rank == 0

    def slice_of(self, name: str, args: ModelArgs) -> tuple[int, int, int] | None:
        """(dim, start, stop) of `name` this rank holds, or None for the whole tensor."""
        if not self.parallel or ".layers." not in name:
            return None
        d, r = args.head_dim, self.rank
        q_rows = args.num_heads // self.size * d
        kv0, kvn = self.kv_heads(args)
        inter = args.intermediate_size // self.size
        leaf = name.split(".layers.", 1)[1].split(".", 1)[1]  # e.g. self_attn.q_proj.weight
        table = {
            "self_attn.q_proj": (0, r * q_rows, (r + 1) * q_rows),
            "self_attn.k_proj": (0, kv0 * d, (kv0 + kvn) * d),
            "self_attn.v_proj": (0, kv0 * d, (kv0 + kvn) * d),
            "self_attn.o_proj": (1, r * q_rows, (r + 1) * q_rows),
            "mlp.gate_proj": (0, r * inter, (r + 1) * inter),
            "mlp.up_proj": (0, r * inter, (r + 1) * inter),
            "mlp.down_proj": (1, r * inter, (r + 1) * inter),
        }
        module = leaf.rsplit(".", 1)[0]
        return table.get(module)  # norms (input, post, q_norm, k_norm): replicated
