"""`modeldeploy serve` starts with defaults. The CPU KV budget is sized from available
memory, a context the budget cannot hold is lowered (or refused when the user set it), and every flag
says what it does and its default."""

from __future__ import annotations

import argparse
import logging

import pytest

from modeldeploy.runtime import EngineConfig, SamplingParams
from modeldeploy.runtime.engine.core.kv_budget import (
    CPU_KV_CAP,
    CPU_KV_UNKNOWN,
    available_memory_bytes,
    cpu_kv_budget,
)
from modeldeploy.runtime.engine.llm_engine import LLMEngine
from modeldeploy.runtime.server.cli import configure


def serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="modeldeploy serve")
    configure(p)
    return p


def test_every_serve_flag_has_help_with_its_default():
    """A flag without help text, or whose help does not say its default, fails here (hidden test
    hooks, help=SUPPRESS, are the only exception)."""
    missing = []
    for action in serve_parser()._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        flag = action.option_strings[0]
        text = action.help or ""
        if len(text) < 10:
            missing.append(f"{flag}: no help text")
        elif not action.required and "default" not in text:
            missing.append(f"{flag}: help does not say the default: {text!r}")
    assert not missing, "\n".join(missing)


def test_the_walk_catches_a_flag_without_help():
    p = serve_parser()
    p.add_argument("--undocumented", type=int, default=3)
    bare = [a for a in p._actions if a.option_strings == ["--undocumented"]]
    assert bare and not bare[0].help  # what the walk above rejects


def test_kv_cache_cpu_bytes_is_a_serve_flag_and_validated():
    args = serve_parser().parse_args(["--model", "/m", "--kv-cache-cpu-bytes", str(512 << 20)])
    assert args.kv_cache_cpu_bytes == 512 << 20
    assert serve_parser().parse_args(["--model", "/m"]).kv_cache_cpu_bytes is None
    with pytest.raises(ValueError, match="kv_cache_cpu_bytes: must be >= 1"):
        EngineConfig(model="/m", kv_cache_cpu_bytes=0).validate()


def test_cpu_kv_budget_is_half_of_available_capped_and_split_over_ranks():
    assert cpu_kv_budget(2 << 30) == 1 << 30
    assert cpu_kv_budget(64 << 30) == CPU_KV_CAP
    assert cpu_kv_budget(64 << 30, ranks=2) == CPU_KV_CAP // 2
    assert cpu_kv_budget(None) == CPU_KV_UNKNOWN
    assert cpu_kv_budget(0) == 1


def test_available_memory_is_read_on_linux():
    avail = available_memory_bytes()
    assert avail is not None and avail > 64 << 20


def test_cgroup_limit_bounds_available_memory(monkeypatch, tmp_path):
    """In a pod the container's limit, not the node's MemAvailable, bounds what the cache may take."""
    real_open = open
    files = {
        "/proc/meminfo": "MemTotal: 100000000 kB\nMemAvailable: 90000000 kB\n",
        "/sys/fs/cgroup/memory.max": str(3 << 30),
        "/sys/fs/cgroup/memory.current": str(2 << 30),
        "/sys/fs/cgroup/memory.stat": f"anon 1\ninactive_file {512 << 20}\n",
    }

    def fake_open(path, *a, **k):
        if path in files:
            f = tmp_path / path.strip("/").replace("/", "_")
            f.write_text(files[path])
            return real_open(f, *a, **k)
        if str(path).startswith(("/proc", "/sys")):
            raise OSError(path)
        return real_open(path, *a, **k)

    monkeypatch.setattr("builtins.open", fake_open)
    assert available_memory_bytes() == (1 << 30) + (512 << 20)
    files["/sys/fs/cgroup/memory.max"] = "max"
    assert available_memory_bytes() == 90000000 * 1024


@pytest.fixture(scope="module")
def long_model(tiny_model):
    return tiny_model("llama", max_position_embeddings=4096)


def block_bytes(model_dir) -> int:
    """Bytes of one float32 KV block of the model, from its config."""
    from transformers import AutoConfig

    from modeldeploy.runtime.models.llama import ModelArgs

    a = ModelArgs.from_hf(AutoConfig.from_pretrained(model_dir))
    return 2 * a.num_layers * 16 * a.num_kv_heads * a.head_dim * 4


def test_default_budget_holds_the_models_context(long_model):
    eng = LLMEngine(EngineConfig(model=str(long_model), dtype="float32", max_num_seqs=2))
    cfg = eng.config
    assert cfg.max_model_len == 4096
    assert cfg.kv_cache_cpu_bytes == cpu_kv_budget(available_memory_bytes())  # resolved: /v1/bundle shows it
    assert cfg.num_kv_blocks == 2 * 4096 // 16  # max_num_seqs full contexts: no more is useful


def test_a_small_budget_lowers_the_default_context_with_a_log_line(long_model, caplog):
    per_block = block_bytes(long_model)
    with caplog.at_level(logging.WARNING, logger="modeldeploy.engine"):
        eng = LLMEngine(
            EngineConfig(model=str(long_model), dtype="float32", kv_cache_cpu_bytes=40 * per_block)
        )
    assert eng.config.num_kv_blocks == 40
    assert eng.config.max_model_len == eng.max_model_len == 40 * 16
    lines = [r.getMessage() for r in caplog.records if "max_model_len" in r.getMessage()]
    assert len(lines) == 1 and "lowered from 4096" in lines[0] and "640" in lines[0], lines
    # it still serves within the lowered context, and refuses past it
    eng.add_request("r", [3 + i % 400 for i in range(600)], SamplingParams(max_tokens=8, temperature=0.0))
    done = []
    for _ in range(200):
        done += [o for o in eng.step() if o.finished]
        if not eng.has_work():
            break
    assert len(done) == 1 and len(done[0].token_ids) == 8
    with pytest.raises(ValueError, match="context length"):
        eng.add_request("too-long", [3] * 700, SamplingParams(max_tokens=8))


def test_an_explicit_context_the_budget_cannot_hold_is_an_error_naming_it(long_model):
    with pytest.raises(ValueError, match=r"max_model_len: 4096 tokens need 256 KV blocks .* has 40"):
        LLMEngine(EngineConfig(model=str(long_model), dtype="float32", max_model_len=4096, num_kv_blocks=40))
