"""`modeldeploy serve`'s engine flags come from EngineConfig's fields: same defaults, help on each,
the established flag names kept."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from modeldeploy.runtime.config import EngineConfig
from modeldeploy.runtime.server import cli


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    cli.configure(p)
    return p


def test_defaults_are_engine_config_defaults():
    cfg = cli.build_config(_parser().parse_args(["--model", "/m"]))
    assert dataclasses.asdict(cfg.engine) == dataclasses.asdict(EngineConfig(model="/m"))


def test_every_engine_flag_has_help_and_its_established_name():
    fields = {f.name: f for f in dataclasses.fields(EngineConfig)}
    for name in cli.ENGINE_FLAGS:
        assert fields[name].metadata.get("help"), name
    flags = {cli.engine_flag(n) for n in cli.ENGINE_FLAGS}
    assert {"--tp-timeout", "--no-prefix-caching", "--no-chunked-prefill", "--max-num-seqs"} <= flags


def test_flags_set_their_fields():
    args = _parser().parse_args(
        ["--model", "/m", "--no-prefix-caching", "--no-chunked-prefill", "--tp-timeout", "5"]
        + ["--max-num-seqs", "3", "--kv-cache-fraction", "0.5", "--dtype", "float32", "--cuda-graphs"]
        + ["--device", "cuda", "--bundle-id", "b"]
    )
    e = cli.build_config(args).engine
    assert (e.enable_prefix_caching, e.enable_chunked_prefill, e.tp_timeout_s) == (False, False, 5.0)
    assert (e.max_num_seqs, e.kv_cache_fraction, e.dtype, e.cuda_graphs) == (3, 0.5, "float32", True)
    assert (e.device, e.bundle_id) == ("cuda", "b")


def test_choices_and_checks_name_the_flag():
    with pytest.raises(SystemExit):
        _parser().parse_args(["--model", "/m", "--dtype", "float64"])
    with pytest.raises(ValueError, match="--max-num-seqs must be >= 1"):
        cli.build_config(_parser().parse_args(["--model", "/m", "--max-num-seqs", "0"]))
    with pytest.raises(ValueError, match="--tp-timeout must be > 0"):
        cli.build_config(_parser().parse_args(["--model", "/m", "--tp-timeout", "0"]))
