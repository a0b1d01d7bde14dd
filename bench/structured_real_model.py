"""Structured output on the real model (SmolLM2-135M-Instruct): 100 chat requests over 5 schemas,
string length limits, patterns, formats and array limits included, through our server and the
official `openai` client. Every output is validated with jsonschema (formats checked): it must be
valid, or cut by max_tokens with finish_reason "length"; anything else is a failure.

    .venv/bin/python bench/structured_real_model.py --out bench/results/structured.md
    .venv/bin/python bench/structured_real_model.py --model DIR   # another model directory

The default model directory is the imported pin (modeldeploy_dev.real_model, under
~/.cache/modeldeploy/models/). A dated section (date, git revision, command, figures) is appended
to --out; the exit status is 1 when any output is invalid.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = Path.home() / ".cache/modeldeploy/models/smollm2-135m-instruct"

SCHEMAS: dict[str, dict[str, Any]] = {
    "ticket": {
        "type": "object",
        "properties": {
            "title": {"type": "string", "minLength": 3, "maxLength": 40},
            "priority": {"enum": ["low", "medium", "high"]},
            "tags": {
                "type": "array",
                "items": {"type": "string", "maxLength": 12},
                "minItems": 1,
                "maxItems": 3,
            },
        },
        "required": ["title", "priority", "tags"],
        "additionalProperties": False,
    },
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 2, "maxLength": 30},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "email": {"type": "string", "format": "email", "maxLength": 40},
        },
        "required": ["name", "age", "email"],
        "additionalProperties": False,
    },
    "event": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 32},
            "date": {"type": "string", "format": "date"},
            "start": {"type": "string", "format": "time"},
            "attendees": {"type": "integer", "minimum": 1, "maximum": 500},
        },
        "required": ["name", "date", "start", "attendees"],
        "additionalProperties": False,
    },
    "bug": {
        "type": "object",
        "properties": {
            "id": {"type": "string", "pattern": "^BUG-[0-9]{3,5}$"},
            "summary": {"type": "string", "minLength": 10, "maxLength": 60},
            "severity": {"type": "integer", "minimum": 1, "maximum": 4},
        },
        "required": ["id", "summary", "severity"],
        "additionalProperties": False,
    },
    "shopping": {
        "type": "object",
        "properties": {
            "store": {"type": "string", "pattern": "^[A-Z][A-Za-z ]*$", "maxLength": 20},
            "items": {
                "type": "array",
                "items": {"type": "string", "minLength": 2, "maxLength": 16},
                "minItems": 2,
                "maxItems": 5,
            },
        },
        "required": ["store", "items"],
        "additionalProperties": False,
    },
}

SUBJECTS = [
    "a broken login page",
    "a birthday party",
    "a software engineer from Lisbon",
    "a crash when saving files",
    "groceries for a pasta dinner",
    "a team meeting about the roadmap",
    "a retired teacher",
    "a slow database query",
    "camping supplies",
    "a conference on robotics",
]
PROMPTS = {
    "ticket": "Write a support ticket as JSON about {}.",
    "person": "Describe {} as JSON with name, age and email.",
    "event": "Describe an event as JSON: {}.",
    "bug": "File a bug report as JSON about {}.",
    "shopping": "Write a shopping list as JSON for {}.",
}


def requests() -> list[tuple[str, int, str]]:
    """100 (schema, seed, prompt): 20 per schema, half greedy (seed -1), half sampled."""
    out = []
    for name in SCHEMAS:
        for i in range(20):
            seed = -1 if i < 10 else i
            out.append((name, seed, PROMPTS[name].format(SUBJECTS[i % len(SUBJECTS)])))
    return out


def run_one(client: Any, name: str, seed: int, prompt: str, max_tokens: int) -> dict[str, Any]:
    import jsonschema

    schema = SCHEMAS[name]
    kw: dict[str, Any] = {"temperature": 0.0} if seed < 0 else {"temperature": 0.8, "seed": seed}
    t0 = time.perf_counter()
    r = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": prompt}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": name, "schema": schema, "strict": True},
        },
        max_tokens=max_tokens,
        **kw,
    )
    choice = r.choices[0]
    text = choice.message.content or ""
    row = {
        "schema": name,
        "seed": seed,
        "finish_reason": choice.finish_reason,
        "tokens": r.usage.completion_tokens if r.usage else None,
        "seconds": time.perf_counter() - t0,
        "text": text,
    }
    if choice.finish_reason == "length":
        row["verdict"] = "truncated"
        return row
    try:
        doc = json.loads(text)
        jsonschema.validate(doc, schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        row["verdict"] = "valid" if choice.finish_reason == "stop" else f"finish {choice.finish_reason}"
    except (json.JSONDecodeError, jsonschema.ValidationError) as e:
        row["verdict"], row["error"] = "invalid", str(e)[:200]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(DEFAULT_MODEL), help="model directory (default: the imported pin)")
    ap.add_argument("--out", default=None, help="append a dated section to this markdown file")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--json", default=None, help="write every request's record here")
    args = ap.parse_args()
    model = Path(args.model)
    if not (model / "config.json").is_file():
        raise SystemExit(f"--model: {model} is not a model directory (no config.json)")

    import openai

    from modeldeploy.runtime import EngineConfig
    from modeldeploy.runtime.server.config import ServerConfig
    from modeldeploy_dev.harness import ThreadedServer

    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    args.rev = rev.stdout.strip()  # the code that runs, not HEAD at the end
    ecfg = EngineConfig(
        model=str(model), device="cpu", dtype="float32", max_num_seqs=args.concurrency, max_model_len=1024
    )
    t_load = time.perf_counter()
    with ThreadedServer(ServerConfig(engine=ecfg, served_model_name="smollm2"), timeout_s=600) as server:
        load_s = time.perf_counter() - t_load
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=600)
        reqs = requests()
        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            rows = list(pool.map(lambda r: run_one(client, *r, args.max_tokens), reqs))
        wall = time.perf_counter() - t0
    verdicts = Counter(r["verdict"] for r in rows)
    by_schema = {name: dict(Counter(r["verdict"] for r in rows if r["schema"] == name)) for name in SCHEMAS}
    tokens = sum(r["tokens"] or 0 for r in rows)
    ok = set(verdicts) <= {"valid", "truncated"}
    summary = {
        "requests": len(rows),
        "verdicts": dict(verdicts),
        "by_schema": by_schema,
        "wall_s": round(wall, 1),
        "load_s": round(load_s, 1),
        "output_tokens": tokens,
        "tok_s": round(tokens / wall, 1),
        "distinct_outputs": len({r["text"] for r in rows}),
        "ok": ok,
    }
    print(json.dumps(summary, indent=2))
    for r in rows:
        if r["verdict"] not in ("valid", "truncated"):
            print("INVALID", r["schema"], r["seed"], r.get("error"), repr(r["text"][:200]))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    if args.out:
        _append(Path(args.out), args, model, summary, rows)
    return 0 if ok else 1


def _append(
    out: Path, args: argparse.Namespace, model: Path, s: dict[str, Any], rows: list[dict[str, Any]]
) -> None:
    examples = {}
    for r in rows:
        if r["verdict"] == "valid" and r["schema"] not in examples:
            examples[r["schema"]] = r["text"]
    lines = [
        f"\n## {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, git {args.rev}\n",
        f"`{' '.join(['.venv/bin/python', *sys.argv])}`  ",
        f"model `{model}` (float32, CPU, max_num_seqs {args.concurrency}), max_tokens {args.max_tokens}; "
        "10 greedy + 10 sampled (temperature 0.8, seeded) chat requests per schema.\n",
        f"- requests: {s['requests']}; verdicts: {s['verdicts']} (invalid must be 0: "
        f"{'met' if s['ok'] else 'NOT MET'})",
        f"- wall {s['wall_s']} s for all 100 (load {s['load_s']} s), {s['output_tokens']} output tokens, "
        f"{s['tok_s']} tok/s; {s['distinct_outputs']} distinct outputs\n",
        "| schema | limits | verdicts |",
        "|---|---|---|",
    ]
    limits = {
        "ticket": "minLength/maxLength, enum, array of maxLength strings, minItems/maxItems",
        "person": "minLength/maxLength, integer bounds, format email + maxLength",
        "event": "maxLength, format date, format time, integer bounds",
        "bug": "pattern ^BUG-[0-9]{3,5}$, minLength/maxLength, integer bounds",
        "shopping": "pattern + maxLength together, array minItems/maxItems of bounded strings",
    }
    lines += [f"| {n} | {limits[n]} | {s['by_schema'][n]} |" for n in SCHEMAS]
    lines.append("\nOne valid output per schema:\n")
    lines += [f"- {n}: `{t}`" for n, t in examples.items()]
    new = not out.exists() or out.stat().st_size == 0
    with out.open("a") as f:
        if new:
            f.write(
                "# Structured output on the real model\n\n"
                "`bench/structured_real_model.py`: 100 chat requests over 5 schemas through the server "
                "and the official openai client, each output validated with jsonschema (formats "
                "checked). Pass: every output valid, or cut by max_tokens with finish_reason `length`.\n"
            )
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
