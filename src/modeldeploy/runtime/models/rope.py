"""Rotary position embedding: the frequencies of each RoPE scaling type, as transformers computes them.

Types (transformers' names, `rope_parameters["rope_type"]`, or `rope_scaling["type"]` in older configs):

- static, one set of inverse frequencies for every position: `default`; `linear` (frequencies divided
  by `factor`: CodeLlama); `yarn` (NTK-by-parts blend of interpolated and extrapolated frequencies,
  and an attention factor that multiplies cos and sin: long-context Qwen2.5, DeepSeek-style);
  `llama3` (Llama 3.1's smoothed low/high frequency split). The runtime precomputes their cos/sin
  per position once (`Rope.cache`) and the kernels index it by position.
- length-dependent: `dynamic` (dynamic NTK: past max_position_embeddings the base grows with the
  sequence length) and `longrope` (Phi-3 style: `short_factor` up to original_max_position_embeddings,
  `long_factor` past it, and an attention factor).

Every function below repeats transformers' own expressions (`modeling_rope_utils.py`: the same torch
ops on the same shapes, the same float32/float64 mix), so the frequencies are the same bits, and so
are the cos/sin rows (checked against transformers' rotary embedding: tests/runtime/models/
test_rope_scaling.py).

Length-dependent types, per sequence. In transformers (`dynamic_rope_update`) the frequencies of a
forward come from `max(position_ids) + 1` of that forward. For one sequence generated with a KV cache
this means: the prompt's tokens rotate with the frequencies for the prompt length L, a token decoded
at position p with those for length p + 1, and cached keys keep the rotation they got. The engine
does exactly that for each sequence on its own: position p of a sequence whose prompt has L tokens
rotates with the frequencies for length `max(L, p + 1)` (`Rope.key`), however the prompt is chunked,
whatever else shares the step, and again the same when a preempted sequence is recomputed. So each
sequence's greedy tokens equal transformers' `generate` of that prompt alone, on a fresh model.

Where that differs:
- transformers batches one frequency set per forward, from the batch's largest position (padding
  included), so a short prompt batched with a long one is rotated as if it were long; and its dynamic
  type keeps state across calls (`max_seq_len_cached` only grows, until a call shorter than
  max_position_embeddings resets it), so a second `generate` may not repeat the first. Here neither
  happens: each sequence gets what transformers gives it alone, on a fresh model.
- vLLM's dynamic NTK uses one fixed scale, the base for max_position_embeddings x factor, at every
  position and length, so its output differs from transformers' even for short prompts.

KV blocks of these types depend on L too (through the prompt's rotation), so the prefix cache keys
them by `Rope.prefix_key` as well as by their tokens: a hit is only a block rotated the same way.

The longest context (`max_length`, what max_model_len defaults to and may not exceed), as vLLM
derives it: linear and dynamic max_position_embeddings x factor; yarn original_max_position_embeddings
x factor; default, llama3 and longrope max_position_embeddings (Llama 3.1's and Phi-3's configs state
the extended length there).
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any

import torch

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
LENGTH_DEPENDENT = ("dynamic", "longrope")
_MEMO_LIMIT = 4096  # dynamic: inverse frequencies kept per sequence length


def _number(rope: dict[str, Any], key: str, *, at_least: float | None = None, optional: bool = False) -> None:
    """Refuse a missing or non-numeric `key` (or one below `at_least`), naming the type and the key."""
    value = rope.get(key)
    if value is None and optional:
        return
    kind = rope["rope_type"]
    if value is None:
        raise ValueError(f"rope scaling {kind!r}: {key} is missing")
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"rope scaling {kind!r}: {key} must be a number, got {value!r}")
    if at_least is not None and value < at_least:
        raise ValueError(f"rope scaling {kind!r}: {key} must be >= {at_least:g}, got {value!r}")


def check(rope: dict[str, Any], head_dim: int) -> None:
    """Refuse a rope dict (type already resolved into `rope_type`) that transformers could not run or
    that this runtime does not: an unknown type, a missing or malformed parameter. Errors name it."""
    kind = rope["rope_type"]
    if kind not in ROPE_TYPES:
        raise ValueError(f"unsupported rope scaling type {kind!r}; supported: {', '.join(ROPE_TYPES)}")
    _number(rope, "rope_theta", at_least=0.0)
    partial = rope.get("partial_rotary_factor", 1.0)
    if partial not in (None, 1, 1.0):
        raise ValueError(
            f"rope scaling {kind!r}: partial_rotary_factor {partial!r} is not supported (these "
            "architectures rotate the whole head)"
        )
    if kind in ("linear", "dynamic", "llama3"):
        _number(rope, "factor", at_least=1.0)
    if kind in ("yarn", "longrope", "llama3"):
        orig = rope.get("original_max_position_embeddings")
        if isinstance(orig, bool) or not isinstance(orig, int) or orig < 1:
            raise ValueError(
                f"rope scaling {kind!r}: original_max_position_embeddings must be a positive integer, "
                f"got {orig!r}"
            )
    if kind == "yarn":
        _number(rope, "factor", at_least=1.0, optional=True)
        for key in ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
            _number(rope, key, optional=True)
    if kind == "longrope":
        _number(rope, "factor", at_least=1.0, optional=True)
        _number(rope, "attention_factor", at_least=0.0, optional=True)
        for key in ("short_factor", "long_factor"):
            factors = rope.get(key)
            if not isinstance(factors, list | tuple) or not all(
                isinstance(x, Real) and not isinstance(x, bool) for x in factors
            ):
                raise ValueError(f"rope scaling 'longrope': {key} must be a list of numbers, got {factors!r}")
            if len(factors) != head_dim // 2:
                raise ValueError(
                    f"rope scaling 'longrope': {key} has {len(factors)} entries; head_dim {head_dim} "
                    f"needs {head_dim // 2} (one per frequency)"
                )
    if kind == "llama3":
        _number(rope, "low_freq_factor")
        _number(rope, "high_freq_factor")


def max_length(rope: dict[str, Any], max_position_embeddings: int) -> tuple[int, str]:
    """The longest context the model is made for, and how it was derived (for messages and docs)."""
    kind, mpe = rope["rope_type"], max_position_embeddings
    if kind in ("linear", "dynamic"):
        factor = rope["factor"]
        return int(mpe * factor), f"max_position_embeddings {mpe} x {kind} factor {factor:g}"
    if kind == "yarn" and rope.get("factor") is not None:
        orig, factor = rope["original_max_position_embeddings"], rope["factor"]
        return int(orig * factor), f"original_max_position_embeddings {orig} x yarn factor {factor:g}"
    return mpe, f"max_position_embeddings {mpe}"


def _yarn_mscale(scale: float, mscale: float = 1) -> float:
    """transformers' `yarn_get_mscale`."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def inv_freq(
    rope: dict[str, Any], head_dim: int, max_position_embeddings: int, seq_len: int | None = None
) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [D/2] float32, attention factor) as transformers' ROPE_INIT_FUNCTIONS give
    them for `seq_len` (None: at init). Only dynamic and longrope read `seq_len`; dynamic reads it as
    the 0-dim int64 tensor `dynamic_rope_update` passes (float32 arithmetic, not Python floats)."""
    kind, dim, base = rope["rope_type"], head_dim, rope["rope_theta"]
    attention = 1.0
    if kind == "default":
        inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    elif kind == "linear":
        inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))
        inv /= rope["factor"]
    elif kind == "dynamic":
        factor = rope["factor"]
        length: Any
        if seq_len is None:
            length = max_position_embeddings
        else:
            length = torch.maximum(
                torch.tensor(seq_len, dtype=torch.int64),
                torch.tensor(max_position_embeddings, dtype=torch.int64),
            )
        scaled = base * ((factor * length / max_position_embeddings) - (factor - 1)) ** (dim / (dim - 2))
        inv = 1.0 / (scaled ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))
    elif kind == "yarn":
        inv, attention = _yarn(rope, dim, base, max_position_embeddings)
    elif kind == "longrope":
        orig = rope["original_max_position_embeddings"]
        factor = rope.get("factor")
        if factor is None:
            factor = max_position_embeddings / orig
        attention = rope.get("attention_factor")
        if attention is None:
            attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
        use_long = bool(seq_len and seq_len > orig)
        ext = torch.tensor(rope["long_factor" if use_long else "short_factor"], dtype=torch.float32)
        shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        inv = 1.0 / (ext * base**shape)
    elif kind == "llama3":
        inv = _llama3(rope, dim, base)
    else:
        raise ValueError(f"unsupported rope scaling type {kind!r}; supported: {', '.join(ROPE_TYPES)}")
    return inv, float(attention)


def _yarn(
    rope: dict[str, Any], dim: int, base: float, max_position_embeddings: int
) -> tuple[torch.Tensor, float]:
    """transformers' `_compute_yarn_parameters`."""
    orig = rope["original_max_position_embeddings"]
    factor = rope.get("factor")
    if factor is None:
        factor = max_position_embeddings / orig
    attention = rope.get("attention_factor")
    mscale, mscale_all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
    if attention is None:
        if mscale and mscale_all_dim:
            attention = float(_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim))
        else:
            attention = _yarn_mscale(factor)
    beta_fast = rope.get("beta_fast") or 32
    beta_slow = rope.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    inv = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv, float(attention)


def _llama3(rope: dict[str, Any], dim: int, base: float) -> torch.Tensor:
    """transformers' `_compute_llama3_parameters`."""
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    factor, lo, hi = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    lo_wave, hi_wave = old / lo, old / hi
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > lo_wave, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < hi_wave) & ~(wavelen > lo_wave)
    return torch.where(medium, smoothed, scaled)


def _cos_sin(positions: torch.Tensor, inv: torch.Tensor, attention: float) -> torch.Tensor:
    """[T, D] float32: cos of positions x inv, then sin, each times the attention factor (as
    transformers scales its cos and sin)."""
    freqs = positions[:, None] * inv
    cos, sin = freqs.cos(), freqs.sin()
    if attention != 1.0:
        cos, sin = cos * attention, sin * attention
    return torch.cat([cos, sin], dim=-1)


class Rope:
    """One model's rotary embedding: its cos/sin cache, and for the length-dependent types the
    per-token rows of a step. All host-side arithmetic is float32 on the CPU, like the cache."""

    def __init__(self, rope: dict[str, Any], head_dim: int, max_position_embeddings: int):
        self.params, self.head_dim, self.max_pos = rope, head_dim, max_position_embeddings
        self.kind: str = rope["rope_type"]
        self.length_dependent = self.kind in LENGTH_DEPENDENT
        # the frequencies of a short sequence (static types: of every sequence)
        self.inv, self.attention = inv_freq(rope, head_dim, max_position_embeddings)
        # lengths up to `threshold` use `inv`: max_position_embeddings for dynamic (transformers'
        # original_max_seq_len), original_max_position_embeddings for longrope
        self.threshold = (
            rope["original_max_position_embeddings"] if self.kind == "longrope" else max_position_embeddings
        )
        self._memo: dict[int, torch.Tensor] = {}
        self.long_inv: torch.Tensor | None = None
        if self.kind == "longrope":
            self.long_inv = inv_freq(rope, head_dim, max_position_embeddings, self.threshold + 1)[0]

    def short_rows(self, max_pos: int) -> int:
        """Longrope: rows of the short factors' part of a `max_pos` cache (a token there has
        p < length <= original_max_position_embeddings); the long factors' rows follow."""
        return min(self.threshold, max_pos)

    def cache(self, max_pos: int, device: torch.device) -> torch.Tensor:
        """[max_pos, D] float32 indexed by position: cos of the D/2 frequencies, then sin. Longrope:
        the short factors' rows for positions below original_max_position_embeddings, then max_pos
        rows of the long factors' (`indices` maps a token to its row)."""
        if self.long_inv is None:
            return _cos_sin(torch.arange(max_pos, dtype=torch.float32), self.inv, self.attention).to(device)
        short = _cos_sin(
            torch.arange(self.short_rows(max_pos), dtype=torch.float32), self.inv, self.attention
        )
        long = _cos_sin(torch.arange(max_pos, dtype=torch.float32), self.long_inv, self.attention)
        return torch.cat([short, long]).to(device)

    def key(self, length: int) -> int:
        """Which frequencies a sequence of `length` tokens uses: 0 for `inv` (up to the threshold),
        else 1 (longrope: the long factors) or the length itself (dynamic)."""
        if length <= self.threshold:
            return 0
        return 1 if self.kind == "longrope" else length

    def prefix_key(self, prompt_len: int) -> int:
        """What besides the tokens a cached KV block depends on: the prompt's frequency key. Position
        p of a prompt of L tokens rotates with key(max(L, p + 1)), so sequences whose prompts share
        key(L) rotate every position alike."""
        return self.key(prompt_len)

    def _inv_for(self, key: int) -> torch.Tensor:
        if key == 0:
            return self.inv
        if self.long_inv is not None:
            return self.long_inv
        inv = self._memo.get(key)
        if inv is None:
            if len(self._memo) >= _MEMO_LIMIT:
                self._memo.clear()
            inv = self._memo[key] = inv_freq(self.params, self.head_dim, self.max_pos, key)[0]
        return inv

    def indices(self, positions: list[int], lens: list[int], max_pos: int) -> list[int] | None:
        """Cache rows for tokens at `positions` of sequences whose frequencies are those for `lens`
        (max(prompt length, p + 1) each), or None when some token needs frequencies the cache does
        not hold (dynamic past max_position_embeddings): then `rows`."""
        if self.kind == "longrope":
            t, offset = self.threshold, self.short_rows(max_pos)
            return [p + offset if n > t else p for p, n in zip(positions, lens, strict=True)]
        if all(n <= self.threshold for n in lens):
            return positions
        return None

    def rows(self, positions: list[int], lens: list[int], device: torch.device) -> torch.Tensor:
        """[T, D] float32: each token's own cos/sin row (dynamic NTK steps past max_position_embeddings;
        the kernels then read row t for token t). Tokens within the original length get the cache's
        arithmetic too, so a sequence's rotations never depend on what shares its step."""
        keys = [self.key(n) for n in lens]
        order = sorted(set(keys))
        slot = {k: i for i, k in enumerate(order)}
        table = torch.stack([self._inv_for(k) for k in order])  # [U, D/2]
        inv = table[torch.tensor([slot[k] for k in keys], dtype=torch.int64)]  # [T, D/2]
        pos = torch.tensor(positions, dtype=torch.float32)
        return _cos_sin(pos, inv, self.attention).to(device)
