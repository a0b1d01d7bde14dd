"""What the benchmark sends: the 70/25/5 prompt mix or a dataset, with lengths in tokens.

Lengths are counted with the target's tokenizer when one is given (`--tokenizer DIR`, read
with the `tokenizers` library if it is installed: no torch, no transformers) and estimated
at 4 characters per token otherwise; the record says which. Synthetic prompts are random
word sequences drawn from a seeded RNG, so every request differs (no accidental prefix-cache
hits) and a seed replays the same workload against every URL.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from modeldeploy.conformance.bench.checks import parse_check

_WORDS = (
    "the model serves tokens from a paged cache while the scheduler admits new requests under "
    "a budget of batched tokens and the operator watches latency across cohorts of pods in a "
    "cluster where every bundle is pinned by digest so that a canary can be compared with the "
    "stable fleet before traffic moves forward or rolls back when analysis finds a regression in "
    "time to first token inter token latency error rate or goodput at the objective river "
    "mountain window garden language system number people water history music market energy "
    "planet signal memory kernel thread socket matrix vector layer weight prompt answer"
).split()


@dataclass(frozen=True)
class Shape:
    """One class of the synthetic mix: its share of requests and its lengths in tokens.

    A length given as a range (`*_min` set) is drawn uniformly from [min, max] and is not
    jittered: "64-128 output tokens" means exactly that, as in vLLM's random-range datasets."""

    name: str
    weight: float
    prompt_tokens: int
    output_tokens: int
    prompt_min: int | None = None
    output_min: int | None = None

    def draw(self, rng: random.Random, jitter: float) -> tuple[int, int]:
        """(prompt, output) lengths of one request of this shape."""
        return _length(self.prompt_tokens, self.prompt_min, rng, jitter), _length(
            self.output_tokens, self.output_min, rng, jitter
        )


def _length(top: int, low: int | None, rng: random.Random, jitter: float) -> int:
    if low is not None:
        return rng.randint(low, top)
    return max(1, round(top * rng.uniform(1.0 - jitter, 1.0)))


def _tokens(text: str) -> tuple[int | None, int]:
    """`128` -> (None, 128); `64-128` -> (64, 128). ValueError if neither."""
    low, dash, top = text.partition("-")
    if not dash:
        return None, int(text)
    lo, hi = int(low), int(top)
    if lo > hi:
        raise ValueError(text)
    return lo, hi


# The seeds' 70 % short / 25 % medium / 5 % long; sized so the longest fits a 1024-token context.
DEFAULT_MIX = (
    Shape("short", 0.70, 128, 64),
    Shape("medium", 0.25, 384, 128),
    Shape("long", 0.05, 640, 256),
)


def parse_mix(text: str) -> tuple[Shape, ...]:
    """`name:weight:prompt_tokens:output_tokens,...` -> shapes (weights need not sum to 1); a
    length may be a range `lo-hi` (`short:0.7:64:64-128`)."""
    shapes = []
    for part in text.split(","):
        bits = part.strip().split(":")
        if len(bits) != 4:
            raise ValueError(f"--mix: {part!r} is not name:weight:prompt_tokens:output_tokens")
        try:
            (p_min, p_max), (o_min, o_max) = _tokens(bits[2]), _tokens(bits[3])
            shape = Shape(bits[0], float(bits[1]), p_max, o_max, p_min, o_min)
        except ValueError:
            raise ValueError(
                f"--mix: {part!r} has a weight or length that is not a number or a range lo-hi with lo <= hi"
            ) from None
        lows = [x for x in (shape.prompt_min, shape.output_min) if x is not None]
        if shape.weight <= 0 or min([shape.prompt_tokens, shape.output_tokens, *lows]) < 1:
            raise ValueError(f"--mix: {part!r} needs weight > 0 and lengths >= 1")
        shapes.append(shape)
    return tuple(shapes)


class TokenCounter:
    """Token counts from a tokenizer.json (the `tokenizers` library), or a 4-chars-per-token estimate."""

    def __init__(self, tokenizer_dir: str | None = None):
        self.tok: Any = None
        self.method = "estimate: 4 characters per token"
        if tokenizer_dir is None:
            return
        path = Path(tokenizer_dir) / "tokenizer.json"
        if not path.is_file():
            raise ValueError(f"--tokenizer: {tokenizer_dir} has no tokenizer.json")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            self.method = "estimate: 4 characters per token (the tokenizers library is not installed)"
            return
        self.tok = Tokenizer.from_file(str(path))
        self.method = f"tokenizers: {path}"

    def count(self, text: str) -> int:
        if self.tok is None:
            return max(1, math.ceil(len(text) / 4))
        return len(self.tok.encode(text, add_special_tokens=False).ids)

    def text_of(self, rng: random.Random, n: int) -> str:
        """A random word sequence of about n tokens (exactly n where the tokenizer round-trips)."""
        words: list[str] = []
        while len(words) < 4 * n + 8:  # bounded: a word is at least one token in any tokenizer
            words.extend(rng.choice(_WORDS) for _ in range(max(1, n // 4)))
            if self.count(" ".join(words)) >= n:
                break
        text = " ".join(words)
        if self.tok is not None:
            ids = self.tok.encode(text, add_special_tokens=False).ids[:n]
            return self.tok.decode(ids)
        return text[: 4 * n]


@dataclass
class Item:
    """One request to send: a completion prompt or chat messages, with its intended lengths."""

    shape: str
    prompt: str
    prompt_tokens: int  # counted or estimated (see TokenCounter.method); usage has the server's count
    output_tokens: int | None  # max_tokens to ask for (None: the server's default)
    messages: list[dict[str, str]] | None = None
    check: dict[str, Any] | None = None  # checks.py: the output must pass it to count as good
    response_format: dict[str, Any] | None = None  # sent as is (chat and completions)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("prompt")
        d.pop("messages")
        for key in ("check", "response_format"):
            if d[key] is None:
                d.pop(key)
        return d


def synthetic(
    shapes: tuple[Shape, ...], n: int, rng: random.Random, counter: TokenCounter, jitter: float = 0.1
) -> list[Item]:
    """n requests drawn from the mix by weight; lengths cut by up to `jitter` so batches are not uniform
    (ranges are drawn from the range instead)."""
    weights = [s.weight for s in shapes]
    out = []
    for _ in range(n):
        s = rng.choices(shapes, weights)[0]
        p, o = s.draw(rng, jitter)
        text = counter.text_of(rng, p)
        out.append(Item(s.name, text, counter.count(text), o))
    return out


def load_dataset(path: str, counter: TokenCounter, default_output: int = 128) -> list[Item]:
    """JSONL ({"prompt"| "messages", optional "output_tokens"|"max_tokens"}) or ShareGPT JSON."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--dataset: {path} does not exist")
    text = p.read_text()
    rows: list[Any]
    try:
        whole = json.loads(text)
        rows = whole if isinstance(whole, list) else [whole]
    except json.JSONDecodeError:
        rows = []
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"--dataset: {path} line {i} is not JSON: {e}") from None
    items = [it for i, r in enumerate(rows, 1) if (it := _item(r, i, path, counter, default_output))]
    if not items:
        raise ValueError(f"--dataset: {path} holds no usable prompt")
    return items


def _item(row: Any, i: int, path: str, counter: TokenCounter, default_output: int) -> Item | None:
    if not isinstance(row, dict):
        raise ValueError(f"--dataset: {path} entry {i} is not an object")
    item = _prompt_item(row, i, path, counter, default_output)
    if item is not None and row.get("check") is not None:
        item.check = parse_check(row["check"], f"--dataset: {path} entry {i}")
    rf = row.get("response_format")
    if item is not None and rf is not None:
        if not isinstance(rf, dict) or "type" not in rf:
            raise ValueError(f"--dataset: {path} entry {i}: response_format must be an object with a type")
        item.response_format = rf
    return item


def _prompt_item(
    row: dict[str, Any], i: int, path: str, counter: TokenCounter, default_output: int
) -> Item | None:
    out = row.get("output_tokens", row.get("max_tokens"))
    if out is not None and (not isinstance(out, int) or out < 1):
        raise ValueError(f"--dataset: {path} entry {i}: output_tokens must be an integer >= 1")
    if "conversations" in row:  # ShareGPT: first human turn is the prompt, the next gpt turn its length
        turns = row["conversations"]
        human = next((t.get("value", "") for t in turns if t.get("from") in ("human", "user")), "")
        reply = next((t.get("value", "") for t in turns if t.get("from") in ("gpt", "assistant")), None)
        if not human:
            return None  # ShareGPT dumps hold empty conversations; skipping them is the convention
        n = out or (max(1, counter.count(reply)) if reply else default_output)
        return Item("dataset", human, counter.count(human), n, [{"role": "user", "content": human}])
    if "messages" in row:
        msgs = row["messages"]
        if not isinstance(msgs, list) or not all(isinstance(m, dict) and "content" in m for m in msgs):
            raise ValueError(f"--dataset: {path} entry {i}: messages must be a list of {{role, content}}")
        joined = "\n".join(str(m["content"]) for m in msgs)
        return Item("dataset", joined, counter.count(joined), out or default_output, msgs)
    if isinstance(row.get("prompt"), str):
        pr = row["prompt"]
        return Item(
            "dataset", pr, counter.count(pr), out or default_output, [{"role": "user", "content": pr}]
        )
    raise ValueError(f"--dataset: {path} entry {i} has none of prompt, messages, conversations")


def sample(items: list[Item], n: int, rng: random.Random) -> list[Item]:
    """n dataset entries in a seeded order (with repetition only when the dataset is smaller)."""
    order = list(items)
    rng.shuffle(order)
    return [order[i % len(order)] for i in range(n)]
