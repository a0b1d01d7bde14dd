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
    parser.add_argument(
        "--chat", action="store_true", help="each prompt is a user message in the model's chat template"
    )
    parser.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE",
        help="with --chat: a Jinja chat template file used instead of the tokenizer's (as serve's)",
    )
    parser.add_argument(
        "--max-model-len", type=int, default=None, help="context length (default: the model's own)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object per prompt")


def _chat_ids(tokenizer, prompt: str, template: str | None = None) -> list[int]:
    """The prompt as one user turn through the chat template (`template`, else the tokenizer's), as
    token ids (the template writes its own special tokens, so none are added again)."""
    if template is None and not getattr(tokenizer, "chat_template", None):
        raise ValueError("--chat: the model's tokenizer has no chat template")
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}],
        tokenize=False,
        add_generation_prompt=True,
        chat_template=template,
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def main(args: argparse.Namespace) -> int:
    from modeldeploy.runtime import LLM, SamplingParams
    from modeldeploy.runtime.chat_template import load_chat_template

    try:
        template = None
        if args.chat_template is not None:
            if not args.chat:
                raise ValueError("--chat-template: only with --chat")
            template = load_chat_template(args.chat_template).text  # checked before the weights load
        llm = LLM(
            args.model,
            dtype=args.dtype,
            device=args.device,
            model_digest=args.model_digest,
            max_model_len=args.max_model_len,
        )
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
        prompts = [_chat_ids(llm.tokenizer, p, template) for p in args.prompt] if args.chat else args.prompt
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params)
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
