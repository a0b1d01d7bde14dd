"""Where the engine's resident memory creeps under a varied load: live memory, or free memory that
glibc's malloc keeps (bench/soak.py found the engine core's RSS growing after warm-up).

  .venv/bin/python bench/heap_cpu.py [--steps 1500] [--trim-every 0] [--out heap.json]

The engine in this process on the real model (float32, CPU), fed requests with the soak's mix of
prompt lengths (64/384/1536 tokens, 64-128 out) so that every step has another shape. Every
`--sample` steps: RSS, and glibc's own account (`mallinfo2`, summed over its arenas): bytes in use
by live allocations (`uordblks` + `hblkhd`, the mmapped ones) and bytes free but kept (`fordblks`).
At the end, `malloc_trim(0)` once and RSS again. A creep that is mostly `fordblks` and that one
trim gives back is the allocator holding freed activation buffers (fragmentation), not a leak.
`--trim-every N` calls `malloc_trim(0)` every N steps (what the engine core does when it is given
`MODELDEPLOY_MALLOC_TRIM_S`), to compare.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import sys
import time
from pathlib import Path

import psutil

from modeldeploy_dev.real_model import cached_real_model


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks")
        + ("fordblks", "keepcost")
    ]


LIBC = ctypes.CDLL("libc.so.6")
LIBC.mallinfo2.restype = MallInfo2


def heap() -> dict[str, float]:
    mi = LIBC.mallinfo2()
    mib = 1 / 2**20
    return {
        "rss_mib": round(psutil.Process().memory_info().rss * mib, 1),
        "live_mib": round((mi.uordblks + mi.hblkhd) * mib, 1),
        "free_kept_mib": round(mi.fordblks * mib, 1),
        "arena_mib": round(mi.arena * mib, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--sample", type=int, default=100)
    ap.add_argument("--trim-every", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    import torch

    from modeldeploy.runtime import EngineConfig, SamplingParams
    from modeldeploy.runtime.engine.heap import freeze_after_load
    from modeldeploy.runtime.engine.llm_engine import LLMEngine

    torch.set_num_threads(a.threads)
    eng = LLMEngine(
        EngineConfig(model=str(cached_real_model()), dtype="float32", max_model_len=2048, max_num_seqs=32)
    )
    freeze_after_load()
    rng = random.Random(0)
    vocab = eng.loaded_info.args.vocab_size
    samples, t0, n = [], time.monotonic(), 0
    samples.append({"step": 0, **heap()})
    for step in range(1, a.steps + 1):
        while len(eng.scheduler.running) + len(eng.scheduler.waiting) < 8:  # bounded: 8 in flight
            plen = rng.choices([64, 384, 1536], [0.70, 0.25, 0.05])[0] - rng.randrange(0, 32)
            ids = [rng.randrange(100, min(vocab, 40000)) for _ in range(plen)]
            sp = SamplingParams(max_tokens=rng.randint(64, 128), temperature=0.0, ignore_eos=True)
            eng.add_request(f"r{n}", ids, sp)
            n += 1
        eng.step()
        if a.trim_every and step % a.trim_every == 0:
            LIBC.malloc_trim(0)
        if step % a.sample == 0:
            samples.append({"step": step, "t": round(time.monotonic() - t0, 1), **heap()})
            print(samples[-1], flush=True)
    before = heap()
    t = time.perf_counter()
    LIBC.malloc_trim(0)
    res = {
        "steps": a.steps,
        "requests": n,
        "threads": a.threads,
        "trim_every": a.trim_every,
        "samples": samples,
        "before_trim": before,
        "trim_ms": round((time.perf_counter() - t) * 1000, 1),
        "after_trim": heap(),
        "env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
    }
    print(json.dumps({k: v for k, v in res.items() if k != "samples"}, indent=1))
    if a.out:
        a.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
