"""A tiny model that has learned to call tools: the honest fixture for `tool_choice: auto`.

A random-weight model never opens `<tool_call>` on its own, so `auto` could only be shown on the
grammar. This module fine-tunes the tiny llama (`make_tiny_model`) for a few hundred steps on CPU
on chat-template samples in the Hermes/Qwen tool format:

- tools offered and the user asks for the weather -> `<tool_call>{"name": "get_weather",
  "arguments": {...}}</tool_call>` (the arguments taken from the user's words);
- tools offered and the user says something else -> a plain sentence;
- no tools and the user asks for JSON -> a small JSON object (so `json_object` outputs end by
  themselves: the model closes its strings, as a real model does);
- no tools otherwise -> a plain sentence.

The loss covers the assistant turns only. The model, its tokenizer (with TOOL_TEMPLATE as chat
template) and a generation config that also stops on `<|im_end|>` are written with
`save_pretrained`, so the runtime loads it like any other model. Test infrastructure only: the
product never imports it.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from importlib.metadata import version
from pathlib import Path
from typing import Any

# A Hermes/Qwen-style template: tools in the system turn, calls as <tool_call>{json}</tool_call>.
TOOL_TEMPLATE = (
    "{{ bos_token }}{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}"
    "</tools><|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['tool_calls'] %}{% for c in m['tool_calls'] %}"
    "<tool_call>{{ c['function'] | tojson }}</tool_call>{% endfor %}"
    "{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "pattern": "^[A-Z][a-z]{1,9}$"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit", "days"],
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Forecast for a city", "parameters": WEATHER},
    }
]
CITIES = ["Paris", "Lyon", "Rome", "Oslo", "Berlin", "Madrid", "Vienna", "Lisbon", "Dublin", "Prague"]
UNITS = ["celsius", "fahrenheit"]
ASKS = [
    "Weather in {city} for {days} days in {unit}?",
    "What is the forecast in {city}, {days} days, {unit}?",
    "Forecast {city} {days} days {unit} please",
]
CHATS = [
    ("Hello", "Hello! How can I help you today?"),
    ("Thanks a lot", "You are welcome."),
    ("Who are you?", "I am a small assistant."),
    ("Tell me a joke", "A canary walked into a cluster and stayed stable."),
    ("Good morning", "Good morning to you too."),
    ("What can you do?", "I can answer questions and check the weather."),
]
JSON_ASKS = ["Reply with a JSON object about {city}", "Give me JSON for {city}", "{city} as a JSON object"]
KEYS = ["name", "ok", "count", "tier"]


def _json_answer(rng: random.Random, city: str) -> str:
    """A small object: a string, a boolean, a number, an enum-like word, keys in a random subset."""
    values = {
        "name": city,
        "ok": rng.random() < 0.5,
        "count": rng.randint(0, 99),
        "tier": rng.choice(["gold", "silver"]),
    }
    keys = [k for k in KEYS if rng.random() < 0.7] or ["name"]
    return json.dumps({k: values[k] for k in keys})


def sample(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any]]:
    """One training conversation: (messages before the answer, tools or None, the assistant turn)."""
    city, days, unit = rng.choice(CITIES), rng.randint(1, 7), rng.choice(UNITS)
    kind = rng.random()
    if kind < 0.4:
        ask = rng.choice(ASKS).format(city=city, days=days, unit=unit)
        call = {"name": "get_weather", "arguments": {"city": city, "unit": unit, "days": days}}
        answer = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}]}
        return [{"role": "user", "content": ask}], TOOLS, answer
    if kind < 0.6:
        user, reply = rng.choice(CHATS)
        return [{"role": "user", "content": user}], TOOLS, {"role": "assistant", "content": reply}
    if kind < 0.85:
        ask = rng.choice(JSON_ASKS).format(city=city)
        return (
            [{"role": "user", "content": ask}],
            None,
            {"role": "assistant", "content": _json_answer(rng, city)},
        )
    user, reply = rng.choice(CHATS)
    return [{"role": "user", "content": user}], None, {"role": "assistant", "content": reply}


def _encode(tok: Any, rng: random.Random) -> tuple[list[int], list[int]]:
    """Token ids of one conversation and its labels (-100 outside the assistant's answer + <|im_end|>)."""
    msgs, tools, answer = sample(rng)
    prompt = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True)
    full = tok.apply_chat_template([*msgs, answer], tools=tools, tokenize=False)
    assert full.startswith(prompt), (prompt, full)
    p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    a_ids = tok(full[len(prompt) :].rstrip("\n"), add_special_tokens=False)["input_ids"]
    return p_ids + a_ids, [-100] * len(p_ids) + a_ids


def make_tool_model(
    out_dir: str | Path, seed: int = 0, steps: int = 300, batch: int = 8, log: Any = None
) -> Path:
    """Fine-tune the tiny llama to call tools (see the module docstring); returns `out_dir`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from modeldeploy.runtime.tiny_model import make_tiny_model

    out = make_tiny_model(out_dir, "llama", seed, hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2)
    tok = AutoTokenizer.from_pretrained(out)
    tok.chat_template = TOOL_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * max(0.05, 1 - s / steps)
    )
    model.train()
    for step in range(steps):
        rows = [_encode(tok, rng) for _ in range(batch)]
        width = max(len(ids) for ids, _ in rows)
        ids = torch.tensor([i + [tok.pad_token_id] * (width - len(i)) for i, _ in rows])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
        mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in rows])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        if log is not None and step % 25 == 0:
            log(f"step {step} loss {loss.item():.4f}")
    model.eval()
    end = tok.convert_tokens_to_ids("<|im_end|>")
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id,
        eos_token_id=[tok.eos_token_id, end],
        pad_token_id=tok.pad_token_id,
        do_sample=False,
    )
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "chat_template.jinja").unlink(missing_ok=True)  # the template lives in tokenizer_config.json
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = TOOL_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return out


def cached_tool_model(seed: int = 0) -> Path:
    """The trained model from a cache (`$MODELDEPLOY_CACHE`, default ~/.cache/modeldeploy) keyed by
    this file, the tiny model's source and the torch/transformers/tokenizers versions: trained once
    per machine, not once per test session. Written to a temporary directory, then renamed."""
    from modeldeploy.runtime import tiny_model

    key = hashlib.sha256()
    for src in (Path(__file__), Path(tiny_model.__file__), Path(tiny_model.CORPUS)):
        key.update(src.read_bytes())
    for pkg in ("torch", "transformers", "tokenizers"):
        key.update(version(pkg).encode())
    root = Path(os.environ.get("MODELDEPLOY_CACHE", Path.home() / ".cache" / "modeldeploy")) / "test-models"
    out = root / f"tool-model-{seed}-{key.hexdigest()[:16]}"
    if (out / "config.json").is_file():
        return out
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".training-"))
    try:
        make_tool_model(tmp, seed)
        try:
            tmp.rename(out)
        except OSError:  # another session finished first: use its copy
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
