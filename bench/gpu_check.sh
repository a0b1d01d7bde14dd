#!/usr/bin/env bash
# GPU check in one command: bench/gpu_check.sh OUTDIR  (the same as `make gpu-check OUT=...`).
#
# Needs only what a GPU machine has (python3 with torch, cupy, transformers; no network, no
# virtualenv, nothing installed): runs bench/gpu_check.py from the working tree with
# PYTHONPATH=src:devtools. PYTHON=... picks the interpreter (default: .venv/bin/python if
# present, else python3); GPU_CHECK_BUDGET_S caps the stages (default 480 s).
set -euo pipefail
OUT=${1:?usage: bench/gpu_check.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
if [[ -z ${PYTHON:-} ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
PYTHONPATH="src:devtools${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" bench/gpu_check.py "$OUT"
