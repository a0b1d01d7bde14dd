"""bench/serving_real_cpu.py's `llama` mode without llama.cpp: which files each server serves, the
command lines both servers and the bench get (the same slots, context and threads; the issue's SLO
as mean ITL), and the verdict lines read from a bench record (capacities, ratios, half capacity)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("serving_real_cpu", ROOT / "bench/serving_real_cpu.py")
assert _spec and _spec.loader
src = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(src)


def test_models_per_format_one_gguf_each(tmp_path):
    hf = tmp_path / "hf"
    for fmt in ("f32", "q4_1"):
        (tmp_path / fmt).mkdir()
        (tmp_path / fmt / f"m-{fmt}.gguf").write_bytes(b"GGUF")
    # float32: llama.cpp gets the F32 GGUF, ours the HF float32 directory it was converted from
    assert src.llama_models("f32", tmp_path, hf) == (tmp_path / "f32" / "m-f32.gguf", hf)
    # quantized: both serve the same file, ours as the directory that holds only it
    assert src.llama_models("q4_1", tmp_path, hf) == (tmp_path / "q4_1" / "m-q4_1.gguf", tmp_path / "q4_1")
    (tmp_path / "q4_1" / "other.gguf").write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="exactly one .gguf, found 2"):
        src.llama_models("q4_1", tmp_path, hf)
    with pytest.raises(ValueError, match="found 0"):
        src.llama_models("q8_0", tmp_path, hf)
    with pytest.raises(ValueError, match="--format"):
        src.llama_models("q5_k", tmp_path, hf)


def test_both_servers_get_the_same_slots_context_and_threads():
    cmd = src.llama_server_cmd(Path("/b/llama-server"), Path("/m/x.gguf"), 9000, 32, 2, 2048)
    flag = {cmd[i]: cmd[i + 1] for i in range(1, len(cmd) - 1) if cmd[i].startswith("-")}
    # -c is the total context, split over -np slots: 2048 tokens a slot like our --max-model-len
    assert (flag["-np"], flag["-c"], flag["-t"], flag["-tb"]) == ("32", "65536", "2", "2")
    assert "--cont-batching" in cmd and flag["--host"] == "127.0.0.1" and flag["--port"] == "9000"
    ours = src.ours_serve_cmd(Path("/m/dir"), 9001, 32, 2048)
    assert ours[ours.index("--max-num-seqs") + 1] == "32"
    assert ours[ours.index("--max-model-len") + 1] == "2048"


def _args(**kw) -> argparse.Namespace:
    base = dict(
        duration=60.0,
        drain_timeout=60.0,
        tokenizer="/tok",
        rates=None,
        start_rate=0.25,
        max_rate=8.0,
        search_steps=2,
    )
    return argparse.Namespace(**{**base, **kw})


def test_bench_command_uses_the_issue_slo_as_mean_itl_and_same_work():
    cmd = src.bench_cmd(["http://a", "http://b"], ["modeldeploy", "llama.cpp"], _args(), Path("/o.json"))
    assert cmd[cmd.index("--slo") + 1] == "ttft=1.5,tpot=0.15"  # tpot: a request's mean gap
    assert "--ignore-eos" in cmd and cmd[cmd.index("--temperature") + 1] == "0"
    assert cmd[cmd.index("--start-rate") + 1] == "0.25" and "--find-capacity" in cmd and "--rates" not in cmd
    assert [cmd[i + 1] for i, c in enumerate(cmd) if c == "--name"] == ["modeldeploy", "llama.cpp"]
    sweep = src.bench_cmd(["http://a", "http://b"], ["a", "b"], _args(rates=[0.25, 0.5]), Path("/o.json"))
    assert sweep[sweep.index("--rates") + 1] == "0.25,0.5" and "--find-capacity" not in sweep


def _run(target: str, rate: float, goodput: float, itl_p50: float) -> dict:
    dist = {"p50": 0.5, "p99": 1.0, "mean": 0.1}
    # one request whose chunks came 3 at once (2 of its 4 gaps under 2 ms), one still streaming
    reqs = [{"outcome": "completed", "itl": [0.05, 0.0001, 0.0003, 0.05]}, {"outcome": "error", "itl": [0.0]}]
    return {
        "target": target,
        "rate": rate,
        "requests": reqs,
        "summary": {
            "requests": 10,
            "outcomes": {"completed": 10},
            "good_share": goodput / rate,
            "goodput_rps": goodput,
            "ttft": dist,
            "itl": {**dist, "p50": itl_p50},
            "tpot": dist,
            "output_tok_s": 50.0,
            "output_tokens_mean": 96.0,
            "prompt_tokens_mean": 200.0,
        },
    }


def test_verdict_reads_capacities_ratios_and_half_capacity():
    rec = {
        "runs": [
            _run("modeldeploy", 0.5, 0.48, 0.05),
            _run("llama.cpp", 0.5, 0.47, 0.04),
            _run("modeldeploy", 1.0, 0.95, 0.07),
            _run("llama.cpp", 1.0, 0.5, 0.09),
        ]
    }
    res = {"benches": [{"record": rec}], "capacity": {"modeldeploy": 1.0, "llama.cpp": 0.5}}
    res["half_capacity_rate"] = 0.25
    lines = src.llama_verdict(res)
    assert "capacity ratio ours / llama.cpp: 2.00x" in "\n".join(lines)
    assert "goodput-at-capacity ratio: 2.02x" in "\n".join(lines)  # 0.95 at ours, 0.47 at llama.cpp's
    assert not any("ITL p50 at" in x for x in lines)  # 0.25 was not run by both: no claim
    res["half_capacity_rate"] = 0.5
    half = [x for x in src.llama_verdict(res) if "half llama.cpp's capacity" in x]
    assert len(half) == 1 and "ours 0.050 s vs llama.cpp 0.040 s" in half[0]
    assert "client gaps under 2 ms: ours 50 %" in half[0]  # the error request's gap is not counted
    table = src.llama_markdown(res)
    assert (
        table.index("| 0.5 | modeldeploy")
        < table.index("| 0.5 | llama.cpp")
        < table.index("| 1 | modeldeploy")
    )
