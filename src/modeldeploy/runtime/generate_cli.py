"""`modeldeploy generate`: offline generation from a model directory (the demo's engine step)."""

from __future__ import annotations

import argparse
import json
import time


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="HF-format model directory")
    parser.add_argument("--prompt", action="append", required=True, help="a prompt (repeatable)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--model-digest", default=None, help="expected sha256:... manifest digest")
    parser.add_argument("--json", action="store_true", help="print one JSON object per prompt")


def main(args: argparse.Namespace) -> int:
    from modeldeploy.runtime import LLM, SamplingParams

    try:
        llm = LLM(args.model, dtype=args.dtype, device=args.device, model_digest=args.model_digest)
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
        t0 = time.perf_counter()
        outs = llm.generate(args.prompt, params)
    except ValueError as e:
        raise SystemExit(f"modeldeploy generate: {e}") from None
    dt = time.perf_counter() - t0
    for prompt, out in zip(args.prompt, outs, strict=True):
        if args.json:
            print(
                json.dumps(
                    {
                        "prompt": prompt,
                        "token_ids": out.token_ids,
                        "text": out.text,
                        "finish_reason": out.finish_reason,
                    }
                )
            )
        else:
            print(f"{prompt!r} -> {out.text!r}  [{len(out.token_ids)} tokens, {out.finish_reason}]")
    n = sum(len(o.token_ids) for o in outs)
    info = llm.engine.info()
    print(
        f"# {n} tokens in {dt:.2f}s ({n / dt:.1f} tok/s) on {info['device']}/{info['dtype']}, "
        f"{info['architecture']}, model digest {info['model_digest'][:19]}..."
    )
    return 0
