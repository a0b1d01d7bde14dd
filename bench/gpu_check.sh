#!/usr/bin/env bash
# GPU check (issue 4) in one command:  bench/gpu_check.sh OUTDIR
#
# Needs only what the GPU machine has (python3 with torch, cupy, transformers; no network).
# Runs each stage of bench/gpu_check.py in its own process under a timeout, inside an overall
# budget (GPU_CHECK_BUDGET_S, default 450 s: under 8 minutes with start-up), so one failing or
# hanging stage cannot take the others with it. Writes OUTDIR/gpu_check.json (all figures,
# errors included) and OUTDIR/gpu_check.log; prints the summary table last.
set -uo pipefail
OUT=${1:?usage: bench/gpu_check.sh OUTDIR}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
BUDGET=${GPU_CHECK_BUDGET_S:-450}
WORK=$(mktemp -d)
LOG="$OUT/gpu_check.log"
export PYTHONUNBUFFERED=1
export GPU_CHECK_GIT_REV=${GPU_CHECK_GIT_REV:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
: >"$LOG"

stage() {  # stage CAP_S NAME [ARG]: run one stage, capped by what is left of the budget
  local cap=$1; shift
  local left=$((BUDGET - SECONDS - 20))          # keep 20 s for the report
  ((left < cap)) && cap=$left
  if ((cap < 10)); then
    echo "[$*] skipped: time budget spent" | tee -a "$LOG"
    return
  fi
  timeout -k 5 "$cap" "$PY" bench/gpu_check.py "$WORK" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "[$*] exit $rc after ${SECONDS}s total" | tee -a "$LOG"
}

stage 40 env
for k in $("$PY" bench/gpu_check.py "$WORK" list-kernels); do
  case $k in paged_attention_*) stage 90 kernels "$k" ;; *) stage 45 kernels "$k" ;; esac
done
stage 75 greedy
stage 90 graphs
stage 90 lora
stage 200 decode
stage 70 kernel_bench
stage 45 grammar_mask
stage 120 tp
stage 75 serve
"$PY" bench/gpu_check.py "$WORK" report "$OUT" 2>>"$LOG"
rm -rf "$WORK"
