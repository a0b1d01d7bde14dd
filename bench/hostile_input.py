"""Hostile requests against `modeldeploy serve` of the real model while a normal stream runs (issue 39,
item 3): each hostile request must be answered with a 4xx naming its bound within 1 s, and the
concurrent stream's inter-token latency p99 must stay within 1.5x of its unloaded value.

For each case: a greedy chat stream (`--tokens` tokens, ignore_eos) starts; once its first token has
arrived, the hostile request is sent again and again (one at a time, at most `--repeats` times) until
the stream ends. Recorded: the status and message code of the answers, the slowest answer, and the
stream's ITL p99 against the median of unloaded streams run before, between and after the cases.
Bounded: every request has a timeout, the server is killed at the end, the whole run stops after
`--budget` seconds (default 300).

    .venv/bin/python bench/hostile_input.py --out bench/results/hostile_input.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
MSGS = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


def deep(depth: int) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        s = {"type": "object", "properties": {"a": s}, "required": ["a"]}
    return s


def _rf(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


def cases(model: str) -> list[tuple[str, str, bytes]]:
    """(name, path, body bytes)."""

    def j(path: str, body: dict[str, Any]) -> tuple[str, bytes]:
        return path, json.dumps({"model": model, **body}).encode()

    chat = "/v1/chat/completions"
    tools = [
        {"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}}
        for i in range(1000)
    ]
    out = [
        ("schema nested 200 deep", *j(chat, {"messages": MSGS, "response_format": _rf(deep(200))})),
        (
            "enum of 20,000 values",
            *j(chat, {"messages": MSGS, "response_format": _rf({"enum": [f"v{i}" for i in range(20_000)]})}),
        ),  # noqa: E501
        (
            "pattern ^(\\w+\\s?)*$, maxLength 500",
            *j(
                chat,
                {
                    "messages": MSGS,
                    "response_format": _rf({"type": "string", "pattern": "^(\\w+\\s?)*$", "maxLength": 500}),
                },
            ),
        ),  # noqa: E501
        (
            "pattern ^(.*a){20}$, maxLength 500",
            *j(
                chat,
                {
                    "messages": MSGS,
                    "response_format": _rf({"type": "string", "pattern": "^(.*a){20}$", "maxLength": 500}),
                },
            ),
        ),  # noqa: E501
        (
            "schema of 5,000 properties (~150 kB)",
            *j(
                chat,
                {
                    "messages": MSGS,
                    "response_format": _rf(
                        {
                            "type": "object",
                            "properties": {f"p{i:05d}": {"type": "integer"} for i in range(5000)},
                        }
                    ),
                },
            ),
        ),  # noqa: E501
        (
            "tool parameters nested 100 deep",
            *j(
                chat,
                {
                    "messages": MSGS,
                    "tools": [{"type": "function", "function": {"name": "f", "parameters": deep(100)}}],
                    "tool_choice": "required",
                },
            ),
        ),  # noqa: E501
        ("1,000 tools", *j(chat, {"messages": MSGS, "tools": tools})),
        (
            "top_logprobs 20 with n 16",
            *j(chat, {"messages": MSGS, "logprobs": True, "top_logprobs": 20, "n": 16}),
        ),
        ("10 MB body", *j("/v1/completions", {"prompt": "x" * 10_000_000})),
        ("invalid UTF-8", "/v1/completions", b'{"model": "' + model.encode() + b'", "prompt": "a\xff\xfe"}'),
        (
            "lone surrogate \\ud800",
            "/v1/completions",
            b'{"model": "' + model.encode() + b'", "prompt": "a\\ud800"}',
        ),
        ("model ../x", *j("/v1/completions", {"prompt": "x"} | {"model": "../x"})),
        ("model a/b", *j("/v1/completions", {"prompt": "x"} | {"model": "a/b"})),
        ("model with NUL", *j("/v1/completions", {"prompt": "x"} | {"model": "a\x00b"})),
    ]
    return out


def stream_itls(url: str, model: str, tokens: int, started: threading.Event) -> list[float]:
    """Inter-token gaps (s) of one greedy chat stream, first token excluded."""
    body = {
        "model": model,
        "messages": MSGS,
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    times: list[float] = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                times.append(time.perf_counter())
                started.set()
    started.set()
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))] if xs else float("nan")


def run_case(
    url: str, model: str, tokens: int, repeats: int, case: tuple[str, str, bytes] | None
) -> dict[str, Any]:
    started = threading.Event()
    result: dict[str, Any] = {}

    def stream() -> None:
        result["itl"] = stream_itls(url, model, tokens, started)

    t = threading.Thread(target=stream)
    t.start()
    answers: list[tuple[int, float, str]] = []
    if case is not None:
        name, path, body = case
        started.wait(120)
        with httpx.Client(timeout=30) as c:
            while t.is_alive() and len(answers) < repeats:
                t0 = time.perf_counter()
                r = c.post(url + path, content=body, headers={"content-type": "application/json"})
                err = (
                    r.json().get("error", {})
                    if r.headers.get("content-type", "").startswith("application/json")
                    else {}
                )
                answers.append((r.status_code, time.perf_counter() - t0, str(err.get("message", ""))))
    t.join(180)
    return {"itl": result.get("itl", []), "answers": answers}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="model dir (default: the cached SmolLM2-135M-Instruct)")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--budget", type=float, default=300)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    deadline = time.monotonic() + a.budget
    if a.model is None:
        sys.path.insert(0, str(ROOT / "devtools"))
        from modeldeploy_dev.real_model import cached_real_model

        a.model = str(cached_real_model())
    name = "smollm2"
    cmd = [sys.executable, "-m", "modeldeploy", "serve", "--model", a.model, "--served-model-name", name]
    cmd += ["--port", str(a.port), "--device", "cpu", "--dtype", "float32", "--max-model-len", "2048"]
    url = f"http://127.0.0.1:{a.port}"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
    rows, base = [], []
    try:
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        else:
            raise SystemExit("server not ready within the budget")
        run_case(url, name, 8, 0, None)  # warm-up
        all_cases = cases(name)
        half = len(all_cases) // 2
        for i, case in enumerate(all_cases):
            if i in (0, half):
                base.append(p99(run_case(url, name, a.tokens, 0, None)["itl"]))
            if time.monotonic() > deadline - 20:
                print("budget spent: stopping before", case[0], file=sys.stderr)
                break
            r = run_case(url, name, a.tokens, a.repeats, case)
            rows.append((case[0], r))
            print(
                case[0], r["answers"][:1], f"p99 {p99(r['itl']) * 1000:.1f} ms", file=sys.stderr, flush=True
            )
        base.append(p99(run_case(url, name, a.tokens, 0, None)["itl"]))
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    text = report(rows, base, a, cmd)
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    return 0


def report(rows: list[tuple[str, dict[str, Any]]], base: list[float], a: Any, cmd: list[str]) -> str:
    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    unloaded = statistics.median(base)
    lines = [
        "# Hostile input: refusals and a concurrent stream's inter-token latency",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; git revision {rev}",
        f"- command: `.venv/bin/python bench/hostile_input.py{' --out ' + a.out if a.out else ''}`",
        f"- server: `{' '.join(['modeldeploy', *cmd[3:]])}` (engine core process, default limits)",
        f"- stream: greedy chat, {a.tokens} tokens, ignore_eos; the hostile request is re-sent (one at a "
        f"time, at most {a.repeats}) from the stream's first token to its end",
        "- unloaded ITL p99 (streams before, between and after the cases): "
        + ", ".join(f"{b * 1000:.1f}" for b in base)
        + f" ms; median {unloaded * 1000:.1f} ms",
        f"- machine: {os.cpu_count()} CPUs, shared (load average {os.getloadavg()[0]:.1f} at the end)",
        "",
        "| hostile request | status | answers | slowest answer (ms) | ITL p99 during (ms) | vs unloaded | message (first answer) |",  # noqa: E501
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in rows:
        statuses = sorted({s for s, _, _ in r["answers"]})
        slow = max((t for _, t, _ in r["answers"]), default=float("nan"))
        msg = r["answers"][0][2].replace("|", "\\|")[:160] if r["answers"] else ""
        q = p99(r["itl"])
        lines.append(
            f"| {name} | {', '.join(map(str, statuses))} | {len(r['answers'])} | {slow * 1000:.0f} | "
            f"{q * 1000:.1f} | {q / unloaded:.2f}x | {msg} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
