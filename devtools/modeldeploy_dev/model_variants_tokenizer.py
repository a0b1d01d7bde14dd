"""Tokenizer revisions for the quality gate (modeldeploy_dev.model_variants): the same weights, a
tokenizer directory that renders or splits text differently. Each writer copies `src` whole and
rewrites one file; deterministic (same input, same bytes)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path


def edit_template(src: Path, out: Path, edit: Callable[[str], str]) -> Path:
    """`src` copied to `out` with its chat template passed through `edit`: chat_template.jinja where
    there is one (transformers reads that file before tokenizer_config.json's chat_template), else
    tokenizer_config.json's."""
    shutil.copytree(src, out, dirs_exist_ok=True)
    jinja = out / "chat_template.jinja"
    if jinja.is_file():
        jinja.write_text(edit(jinja.read_text()))
        return out
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    if not isinstance(cfg.get("chat_template"), str):
        raise SystemExit(f"{src}: no chat template (chat_template.jinja or tokenizer_config.json)")
    cfg["chat_template"] = edit(cfg["chat_template"])
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return out


# Prepended to the template: the system turn is filtered out before the template sees it. Subtle on
# purpose: every request still renders and answers, the conformance gate passes, and a template with
# a default system prompt (SmolLM2's) silently swaps the user's instructions for its own.
DROP_SYSTEM = "{%- set messages = messages | rejectattr('role', 'equalto', 'system') | list -%}\n"

# Prepended to the template: a top-level `set` shadows the caller's add_generation_prompt, so the
# prompt ends after the user turn, without the assistant header; the model then continues the user's
# text or opens a turn of its own choosing.
NO_GENERATION_PROMPT = "{%- set add_generation_prompt = false -%}\n"


def drop_system_turn(src: Path, out: Path) -> Path:
    """A tokenizer revision whose chat template ignores system messages."""
    return edit_template(src, out, lambda t: DROP_SYSTEM + t)


def no_generation_prompt(src: Path, out: Path) -> Path:
    """A tokenizer revision whose chat template emits nothing for add_generation_prompt."""
    return edit_template(src, out, lambda t: NO_GENERATION_PROMPT + t)


def partial_tokenizer(src: Path, out: Path, every: int) -> Path:
    """A tokenizer revision whose tokenizer.json lacks every `every`-th BPE merge (ranks every-1,
    2*every-1, ...): the tokens those merges made (and the later merges built on them) are no longer
    reached, so words using them split into other, more pieces; the vocabulary, the special tokens and
    the chat template stay, and text built from the kept merges tokenizes as before. On SmolLM2-135M
    every=50 (978 of 48,900 merges) changes the tokens of half the built-in evaluation set's prompts."""
    if every < 2:
        raise SystemExit(f"--every: must be >= 2 (1 removes every merge), got {every}")
    path = src / "tokenizer.json"
    if not path.is_file():
        raise SystemExit(f"{src}: no tokenizer.json")
    tok = json.loads(path.read_text(encoding="utf-8"))
    model = tok.get("model") or {}
    if model.get("type") != "BPE" or not model.get("merges"):
        raise SystemExit(f"{path}: not a BPE tokenizer with merges (model.type {model.get('type')!r})")
    if model.get("ignore_merges"):
        # whole words found in the vocabulary would skip the merges: fewer words would change
        raise SystemExit(f"{path}: ignore_merges is set; removing merges changes few words")
    model["merges"] = [m for i, m in enumerate(model["merges"]) if i % every != every - 1]
    shutil.copytree(src, out, dirs_exist_ok=True)
    (out / "tokenizer.json").write_text(
        json.dumps(tok, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return out
