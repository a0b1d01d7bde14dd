"""A closed-loop streaming load for the serving benches: N greedy requests of `max_tokens` tokens
(ignore_eos) kept C at a time, either through an AsyncEngine in this process (`run_engine`) or
against a server's /v1/completions over SSE (`run_server`). Each returns tokens, wall seconds,
tokens/s and the TTFTs. bench/server_cpu.py, bench/tracing_cpu.py (from a client process) and the
GPU serve timing (bench/gpu/serve.py) share it.
"""

from __future__ import annotations

import asyncio
import json
import time


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def prompts(n: int) -> list[str]:
    return [f"Request {i}: the operator rolls a pinned bundle onto GPU nodes and" for i in range(n)]


async def run_engine(eng, n: int, c: int, max_tokens: int, tag: str) -> dict:
    from modeldeploy.runtime import SamplingParams

    sem = asyncio.Semaphore(c)
    ttft: list[float] = []
    tokens = 0

    async def one(i: int, p: str) -> None:
        nonlocal tokens
        async with sem:
            t0 = time.perf_counter()
            first = True
            async for out in eng.generate(
                f"{tag}-{i}", p, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
            ):
                if first and out.new_token_ids:
                    ttft.append(time.perf_counter() - t0)
                    first = False
                if out.finished:
                    tokens += len(out.token_ids)

    await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts(4))))  # warm-up
    ttft.clear()
    tokens = 0
    t0 = time.perf_counter()
    await asyncio.gather(*(one(100 + i, p) for i, p in enumerate(prompts(n))))
    wall = time.perf_counter() - t0
    return {"tokens": tokens, "wall_s": wall, "tok_s": tokens / wall, "ttft": ttft}


async def sse_request(host: str, port: int, body: bytes) -> tuple[float, int]:
    """One streamed completion over a raw HTTP/1.1 socket -> (TTFT seconds, completion tokens).

    A minimal client on purpose: httpx's per-chunk cost on this 2-core machine would be
    measured as server overhead. TTFT = first body bytes carrying generated text.
    """
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    ttft, tail = None, b""
    while data := await reader.read(1 << 16):
        if ttft is None and b'"text":' in data:
            ttft = time.perf_counter() - t0
        tail = (tail + data)[-4096:]
    writer.close()
    assert b"data: [DONE]" in tail, tail[-300:]
    assert ttft is not None, "the stream ended without text (every request sets ignore_eos)"
    usage = json.loads(tail[tail.rindex(b'"usage":') + 8 :].split(b"}", 1)[0] + b"}")
    return ttft, usage["completion_tokens"]


async def run_server(url: str, n: int, c: int, max_tokens: int) -> dict:
    host, port = url.removeprefix("http://").split(":")
    sem = asyncio.Semaphore(c)
    ttft: list[float] = []
    tokens = 0

    async def one(p: str, record: bool) -> None:
        nonlocal tokens
        body = json.dumps(
            {
                "model": "bench",
                "prompt": p,
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        ).encode()
        async with sem:
            t, k = await sse_request(host, int(port), body)
        if record:
            ttft.append(t)
            tokens += k

    await asyncio.gather(*(one(p, False) for p in prompts(4)))  # warm-up
    t0 = time.perf_counter()
    await asyncio.gather(*(one(p, True) for p in prompts(n)))
    wall = time.perf_counter() - t0
    return {"tokens": tokens, "wall_s": wall, "tok_s": tokens / wall, "ttft": ttft}
