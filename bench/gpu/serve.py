"""The HTTP server on CUDA with the engine core in its own process (spawned) and on a thread,
against the engine alone: generated tokens/s at 32 streams, 128 requests of 64 tokens, on a
1024-hidden, 8-layer bf16 llama (random weights).

    python3 bench/gpu/serve.py OUT.json
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from modeldeploy_dev.gpu_bench import main
from modeldeploy_dev.stream_load import run_engine, run_server

STREAMS, REQUESTS, TOKENS = 32, 128, 64


def measure() -> dict:
    from modeldeploy.runtime import AsyncEngine, EngineConfig
    from modeldeploy.runtime.server.config import ServerConfig
    from modeldeploy.runtime.tiny_model import make_tiny_model
    from modeldeploy_dev.harness import ThreadedServer

    result: dict = {"streams": STREAMS, "requests": REQUESTS, "max_tokens": TOKENS}
    with tempfile.TemporaryDirectory() as tmp:
        shape = dict(hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=4)
        d = make_tiny_model(Path(tmp) / "m", "llama", seed=0, **shape)
        ecfg = dict(model=str(d), device="cuda", dtype="bfloat16", max_num_seqs=32, bundle_id="gpu-check")
        eng = AsyncEngine(EngineConfig(**ecfg))

        async def engine_side() -> dict:
            await eng.start()
            try:
                await run_engine(eng, STREAMS, STREAMS, TOKENS, "warm")
                return await run_engine(eng, REQUESTS, STREAMS, TOKENS, "measure")
            finally:
                await eng.shutdown()

        result["engine_tok_s"] = asyncio.run(engine_side())["tok_s"]
        for layout in ("process", "thread"):
            cfg = ServerConfig(
                engine=EngineConfig(**ecfg), served_model_name="bench", max_queue=256, engine_core=layout
            )
            with ThreadedServer(cfg, timeout_s=90) as srv:
                asyncio.run(run_server(srv.url, STREAMS, STREAMS, TOKENS))  # warm-up
                tok_s = asyncio.run(run_server(srv.url, REQUESTS, STREAMS, TOKENS))["tok_s"]
            result[f"server_{layout}_tok_s"] = tok_s
            result[f"server_{layout}_vs_engine"] = tok_s / result["engine_tok_s"]
    return result


if __name__ == "__main__":
    sys.exit(main(measure))
