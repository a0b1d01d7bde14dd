#!/usr/bin/env python3
"""GPU check: the GPU correctness tests (tests/gpu) and the GPU timings (bench/gpu/*.py) in one
command, each test file and each timing script in its own process under a timeout, inside an
overall budget, so one that fails, hangs or kills its CUDA context cannot take the others with it.

    PYTHONPATH=src:devtools python3 bench/gpu_check.py OUTDIR     # or: make gpu-check [PY=python3]

Writes OUTDIR/gpu_check.json (every figure and error), OUTDIR/gpu_check.log (every process's
output), OUTDIR/tests-<name>.xml (JUnit) and OUTDIR/gpu_check.md, and prints that table last.
When a CUDA device ran every stage, the table is also written to bench/results/gpu_check.md. Without a
CUDA device the tests show as skipped, no timing runs, and bench/results is left alone.

Environment: GPU_CHECK_BUDGET_S (default 480 s of stages), GPU_CHECK_GIT_REV (else git's).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "gpu_check.md"

# (name, cap in seconds): correctness first, so a short budget still gets the verdicts
TESTS = [
    ("kernels", 150),
    ("greedy", 75),
    ("graphs", 60),
    ("lora", 75),
    ("grammar_mask", 45),
    ("tp", 60),
    ("serve", 75),
    ("quantized", 120),  # GGUF Q4/Q8 kept quantized: the CuPy int4/int8 kernels vs float64 and the twin
]
TIMINGS = [
    ("env", 40),
    ("decode", 200),
    ("kernels", 70),
    ("graphs", 75),
    ("lora", 90),
    ("grammar_mask", 30),
    ("tp", 120),
    ("serve", 90),
    ("quant", 90),
]
REPORT_RESERVE_S = 10


def preflight(py: str) -> tuple[str | None, str | None]:
    """(why the stages cannot run at all, why CUDA is missing): checked in a child of `py`."""
    code = "import modeldeploy.runtime, modeldeploy_dev.gpu_bench as g; r = g.cuda_missing(); print(r or '')"
    r = subprocess.run([py, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        return (
            f"{py} cannot import modeldeploy and modeldeploy_dev ({last}); "
            "run from the repository root with PYTHONPATH=src:devtools, or install both",
            None,
        )
    return None, r.stdout.strip() or None


class Stages:
    """Runs commands in their own process group, capped by what is left of the budget."""

    def __init__(self, out: Path, budget_s: float) -> None:
        self.out, self.deadline = out, time.monotonic() + budget_s
        self.log = open(out / "gpu_check.log", "a")  # noqa: SIM115 - closed in close()

    def run(self, label: str, cmd: list[str], cap: float) -> dict:
        cap = min(cap, self.deadline - REPORT_RESERVE_S - time.monotonic())
        if cap < 10:
            self.note(f"[{label}] skipped: time budget spent")
            return {"status": "not run", "reason": "time budget spent"}
        self.log.write(f"\n===== [{label}] {' '.join(cmd)}\n")
        self.log.flush()
        t0 = time.monotonic()
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=cap)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
        took = time.monotonic() - t0
        self.note(
            f"[{label}] " + (f"exit {rc}" if rc is not None else f"TIMEOUT {cap:.0f}s") + f" {took:.0f}s"
        )
        return {"rc": rc, "wall_s": round(took, 1)}

    def note(self, line: str) -> None:
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def close(self) -> None:
        self.log.close()


def junit(path: Path, module: str | None = None) -> dict:
    """passed/failed/skipped counts and the failures' and skips' first lines, from pytest's JUnit
    XML (only the cases of test module `module`, if given)."""
    if not path.is_file():
        return {"error": "no JUnit report (timeout or crash before the end)"}
    counts, failures, skips = {"passed": 0, "failed": 0, "skipped": 0}, [], set()
    for case in ET.parse(path).getroot().iter("testcase"):
        if module and (case.get("classname") or "").split(".")[-1] != module:
            continue
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        skip = case.find("skipped")
        if bad is not None:
            counts["failed"] += 1
            failures.append(f"{case.get('name')}: {(bad.get('message') or '').splitlines()[0][:160]}")
        elif skip is not None:
            counts["skipped"] += 1
            skips.add((skip.get("message") or "").removeprefix("Skipped: ")[:120])
        else:
            counts["passed"] += 1
    return counts | {"failures": failures, "skip_reasons": sorted(skips)}


def run_tests(stages: Stages, py: str, names: list[str], one_process: bool) -> dict:
    """Each test file in its own process; or all in one (`one_process`: where they all skip)."""
    results = {}
    if one_process:
        xml = stages.out / "tests-gpu.xml"
        xml.unlink(missing_ok=True)
        files = [f"tests/gpu/test_gpu_{name}.py" for name, _ in TESTS if name in names]
        cmd = [py, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *files, f"--junitxml={xml}"]
        ran = stages.run("tests", cmd, 300)
        for name, _ in TESTS:
            if name in names:
                results[name] = ran | (junit(xml, f"test_gpu_{name}") if "rc" in ran else {})
        return results
    for name, cap in TESTS:
        if name not in names:
            continue
        xml = stages.out / f"tests-{name}.xml"
        xml.unlink(missing_ok=True)
        cmd = [py, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", f"tests/gpu/test_gpu_{name}.py"]
        ran = stages.run(f"test {name}", [*cmd, f"--junitxml={xml}"], cap)
        results[name] = ran | (junit(xml) if "rc" in ran else {})
    return results


def run_timings(stages: Stages, py: str, names: list[str]) -> dict:
    results = {}
    for name, cap in TIMINGS:
        if name not in names:
            continue
        out = stages.out / f"timing-{name}.json"
        out.unlink(missing_ok=True)
        ran = stages.run(f"timing {name}", [py, f"bench/gpu/{name}.py", str(out)], cap)
        data = json.loads(out.read_text()) if out.is_file() else {"error": "no output (timeout or crash)"}
        results[name] = ran | data
    return results


# ---- report -------------------------------------------------------------------------------------
def test_line(name: str, r: dict) -> str:
    if "rc" not in r:
        return f"  {name:14s} NOT RUN ({r.get('reason', '?')})"
    if "error" in r:
        return f"  {name:14s} ERROR {r['error']}" + ("" if r["rc"] is not None else " (timeout)")
    verdict = "FAIL" if r["failed"] or r["rc"] not in (0, 5) else "PASS" if r["passed"] else "SKIP"
    text = f"  {name:14s} {verdict:4s}  {r['passed']} passed, {r['failed']} failed, {r['skipped']} skipped"
    extra = r["failures"][:3] + [f"skipped: {s}" for s in r["skip_reasons"][:2]]
    return "\n".join([text, *(f"      {x}" for x in extra)])


def _fail(r: dict) -> str | None:
    if "skipped" in r:
        return f"SKIP ({r['skipped']})"
    if "error" in r:
        return f"ERROR {r['error'][:100]}"
    return None


def env_lines(r: dict) -> list[str]:
    if (bad := _fail(r)) is not None:
        return [f"env: {bad}"]
    return [
        f"device {r['device']} x{r['devices']}  copy {r['copy_bytes_per_s'] / 1e12:.2f} TB/s"
        f"  torch {r['torch']} (CUDA {r['cuda']})  cupy {r['cupy']}  transformers {r['transformers']}"
    ]


def decode_lines(r: dict) -> list[str]:
    head = "8B bf16 decode, ctx ~1k   batch  ours tok/s  roofline  transformers tok/s  speedup"
    if (bad := _fail(r)) is not None:
        return [head, f"  {bad}"]
    lines = [head]
    hf = {x["batch"]: x["tokens_per_s"] for x in r.get("transformers", [])}
    for x in r.get("ours", []):
        h = hf.get(x["batch"])
        speedup = x["tokens_per_s"] / h if h else float("nan")
        lines.append(
            f"  {'':24s}{x['batch']:5d}  {x['tokens_per_s']:10.1f}  {x['roofline']:8.1%}  "
            f"{h or float('nan'):18.1f}  {speedup:6.1f}x"
        )
    lines += [f"  {k}: {r[k][:100]}" for k in ("ours_error", "transformers_error") if k in r]
    return lines


def kernel_lines(r: dict) -> list[str]:
    head = "kernel roofline (bf16)                                   GB/s   roofline  vs twin"
    if (bad := _fail(r)) is not None:
        return [head, f"  {bad}"]
    lines = [head]
    for x in r.get("rows", []):
        name = f"  {x['kernel']:24s} {x['label'][:28]:28s}"
        if "error" in x:
            lines.append(f"{name} ERROR {x['error'][:40]}")
        else:
            gbs = x["bytes_per_s"] / 1e9
            lines.append(f"{name} {gbs:6.0f}  {x['roofline']:8.1%}  {x['speedup_vs_twin']:6.1f}x")
    return lines


def graphs_line(r: dict) -> str:
    if (bad := _fail(r)) is not None:
        return f"cuda graphs: {bad}"
    steps = ", ".join(
        f"b{x['batch']} {x['step_ms']:.2f} ms ({x['speedup']:.2f}x)" for x in r["rows"] if x["graphs"]
    )
    return f"cuda graphs: decode step with graphs (vs eager): {steps}"


def lora_line(r: dict) -> str:
    if (bad := _fail(r)) is not None:
        return f"LoRA: {bad}"
    return (
        f"LoRA: {r['shape']}: step mixed {r['mixed_step_s'] * 1e3:.2f} ms vs base-only "
        f"{r['base_step_s'] * 1e3:.2f} ms ({r['ratio']:.2f}x); slot {r['slot_bytes'] / 2**20:.1f} MiB"
    )


def grammar_line(r: dict) -> str:
    if (bad := _fail(r)) is not None:
        return f"grammar mask: {bad}"
    return (
        f"grammar mask: batch {r['batch']} vocab {r['vocab']}: apply {r['cuda_apply_ms']:.3f} ms "
        f"({r['cuda_apply_incl_h2d_ms']:.3f} ms with the host bitmask copy; twin "
        f"{r['cuda_torch_twin_ms']:.3f} ms; CPU {r['cpu_apply_ms']:.2f} ms)"
    )


def tp_line(r: dict) -> str:
    if (bad := _fail(r)) is not None:
        return f"tensor parallel: {bad}"
    return (
        f"tensor parallel: 8B bf16 decode step batch 32: TP=1 {r['tp1_decode_step_s'] * 1e3:.2f} ms, "
        f"TP=2 {r['tp2_decode_step_s'] * 1e3:.2f} ms"
    )


def serve_line(r: dict) -> str:
    if (bad := _fail(r)) is not None:
        return f"engine core process: {bad}"
    return (
        f"engine core process: 32 streams tok/s: engine {r['engine_tok_s']:.0f}, server-process "
        f"{r['server_process_tok_s']:.0f} ({r['server_process_vs_engine']:.2f}x), server-thread "
        f"{r['server_thread_tok_s']:.0f} ({r['server_thread_vs_engine']:.2f}x)"
    )


def quant_lines(r: dict) -> list[str]:
    head = "int4/int8 GEMM, 8B layers, bf16 x   batch  gemv us  roofline  deq+gemm us  twin us  dense us"
    if (bad := _fail(r)) is not None:
        return [head, f"  {bad}"]
    lines = [head]
    for x in r.get("rows", []):
        name = f"  {x['fmt']} {x['layer']:8s} {x['n']:5d}x{x['k']:<5d}     {x['batch']:5d}"
        if "error" in x:
            lines.append(f"{name}  ERROR {x['error'][:60]}")
        else:
            lines.append(
                f"{name}  {x['gemv_us']:7.1f}  {x['gemv_roofline']:8.1%}  {x['dequant_gemm_us']:11.1f}  "
                f"{x['twin_us']:7.1f}  {x['dense_us']:8.1f}"
            )
    return lines


def table(merged: dict) -> list[str]:
    tests, timings = merged["tests"], merged["timings"]
    lines = [f"gpu_check {merged['date']} rev {merged['git_rev']}"]
    if merged.get("cuda_missing"):
        lines.append(f"NOT MEASURED: {merged['cuda_missing']}")
    lines += ["", "correctness (tests/gpu)"]
    lines += [test_line(name, r) for name, r in tests.items()]
    t = {name: timings.get(name, {"skipped": "not run"}) for name, _ in TIMINGS}
    lines += ["", "timings (bench/gpu)", *env_lines(t["env"]), "", *decode_lines(t["decode"])]
    lines += ["", *kernel_lines(t["kernels"]), ""]
    lines += [graphs_line(t["graphs"]), lora_line(t["lora"]), grammar_line(t["grammar_mask"])]
    lines += [tp_line(t["tp"]), serve_line(t["serve"]), "", *quant_lines(t["quant"])]
    return lines


def git_rev() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return os.environ.get("GPU_CHECK_GIT_REV") or (r.stdout.strip() if r.returncode == 0 else "unknown")


def markdown(merged: dict, command: str) -> str:
    return (
        f"# GPU check ({merged['date']}, rev {merged['git_rev']})\n\n"
        "Written by `bench/gpu_check.py` (`make gpu-check`); the recorded runs and their reading are\n"
        "in `bench/results/gpu_h200.md`.\n\n"
        f"    {command}\n\n```\n" + "\n".join(merged["table"]) + "\n```\n"
    )


def main() -> int:
    names = sorted({n for n, _ in TESTS} | {n for n, _ in TIMINGS})
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--only", nargs="+", choices=names, default=names, help="stages to run (default: all)")
    ap.add_argument("--no-tests", action="store_true", help="timings only")
    ap.add_argument("--no-timings", action="store_true", help="correctness tests only")
    ap.add_argument("--budget", type=float, default=float(os.environ.get("GPU_CHECK_BUDGET_S", 480)))
    a = ap.parse_args()
    out = a.outdir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.log").write_text("")
    py = sys.executable
    broken, missing = preflight(py)
    if broken:
        print(f"gpu-check: {broken}", file=sys.stderr)
        return 2
    if missing:
        print(
            f"gpu-check: {missing}: the GPU tests run and skip, no timing runs, bench/results is left alone"
        )
    stages = Stages(out, a.budget)
    try:
        tests = {} if a.no_tests else run_tests(stages, py, a.only, one_process=bool(missing))
        if missing:
            timings = {name: {"skipped": missing} for name, _ in TIMINGS}
        else:
            timings = {} if a.no_timings else run_timings(stages, py, a.only)
    finally:
        stages.close()
    merged = {
        "git_rev": git_rev(),
        "date": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()),
        "cuda_missing": missing,
        "tests": tests,
        "timings": timings,
    }
    merged["table"] = table(merged)
    (out / "gpu_check.json").write_text(json.dumps(merged, indent=1, default=str))
    command = " ".join([Path(py).name, "bench/gpu_check.py", *sys.argv[1:]])
    md = markdown(merged, command)
    (out / "gpu_check.md").write_text(md)
    full = not (missing or a.no_tests or a.no_timings or set(a.only) != set(names))
    if full:  # a partial or CPU-only run never replaces the recorded table
        RESULTS.write_text(md)
    print("\n".join(merged["table"]))
    print(f"\nwritten: {out}/gpu_check.md, gpu_check.json, gpu_check.log" + (f", {RESULTS}" if full else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
