#!/usr/bin/env bash
# Build llama.cpp's llama-server and llama-quantize (CPU only) from the llama.cpp source that
# llama-cpp-python's PyPI sdist vendors (vendor/llama.cpp), for the side-by-side serving bench of
# issue 38 (bench/serving_real_cpu.py llama). Nothing in CI or `make` runs this: it is a bench tool.
#
# Why the sdist: PyPI is the one registry this project reaches, and the sdist pins a llama.cpp
# commit (its CHANGELOG names it), so the baseline is reproducible without a GitHub checkout.
#
#   bench/llama_cpp_build.sh [--out DIR] [--version V] [--jobs N]
#
# --out      build here (default $MODELDEPLOY_CACHE/llama.cpp-<version>, the cache defaulting to
#            ~/.cache/modeldeploy); the sdist is downloaded into DIR/src once
# --version  llama-cpp-python version (default 0.3.36, which vendors ggml-org/llama.cpp@0c1e57098)
# --jobs     parallel compile jobs (default 2); run the whole script under `nice -n 19` on a shared machine
#
# Prints the paths of llama-server and llama-quantize last, one a line; DIR/build-info.txt records
# the version, the vendored commit, the compiler and the CMake flags.
set -euo pipefail

VERSION=0.3.36
OUT=""
JOBS=2
usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT="${2:?--out needs a directory}"; shift 2 ;;
    --version) VERSION="${2:?--version needs a version}"; shift 2 ;;
    --jobs) JOBS="${2:?--jobs needs a number}"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "llama_cpp_build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$JOBS" =~ ^[1-9][0-9]*$ ]] || { echo "llama_cpp_build.sh: --jobs must be a positive integer, got $JOBS" >&2; exit 2; }
OUT="${OUT:-${MODELDEPLOY_CACHE:-$HOME/.cache/modeldeploy}/llama.cpp-$VERSION}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
[[ -x "$PY" ]] || PY=python3

mkdir -p "$OUT/src"
SDIST="$OUT/src/llama_cpp_python-$VERSION.tar.gz"
if [[ ! -f "$SDIST" ]]; then
  "$PY" -m pip download --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$OUT/src"
fi
SRC="$OUT/src/llama_cpp_python-$VERSION"
[[ -d "$SRC/vendor/llama.cpp" ]] || tar -xzf "$SDIST" -C "$OUT/src"
LLAMA="$SRC/vendor/llama.cpp"
# the sdist has no .git: the vendored commit is the one its CHANGELOG names for this version
COMMIT="$(awk -v v="## [$VERSION]" '$0 == v {f = 1; next} f && /^## \[/ {exit} f && /llama\.cpp@/ {
  sub(/.*llama\.cpp@/, ""); sub(/[^0-9a-f].*/, ""); print; exit}' "$SRC/CHANGELOG.md")"
COMMIT="${COMMIT:-unknown}"

GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
FLAGS=(
  -DCMAKE_BUILD_TYPE=Release
  -DGGML_NATIVE=ON          # this machine's ISA (AVX2/FMA/F16C here); the bench runs where it was built
  -DGGML_CUDA=OFF
  -DBUILD_SHARED_LIBS=OFF   # self-contained binaries
  -DLLAMA_BUILD_SERVER=ON
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_UI=OFF          # no npm
  -DLLAMA_USE_PREBUILT_UI=OFF   # no download of the web UI from a Hugging Face bucket at build time
  -DLLAMA_OPENSSL=OFF           # the server listens on loopback HTTP; no model download from a hub
  "-DLLAMA_BUILD_COMMIT=$COMMIT"
)
BUILD="$OUT/build"
cmake -S "$LLAMA" -B "$BUILD" "${GEN[@]}" "${FLAGS[@]}" >"$OUT/cmake-configure.log" 2>&1 \
  || { tail -30 "$OUT/cmake-configure.log" >&2; exit 1; }
cmake --build "$BUILD" --target llama-server llama-quantize -j "$JOBS" >"$OUT/cmake-build.log" 2>&1 \
  || { tail -30 "$OUT/cmake-build.log" >&2; exit 1; }

SERVER="$BUILD/bin/llama-server"
QUANTIZE="$BUILD/bin/llama-quantize"
{
  echo "llama-cpp-python sdist: $VERSION (PyPI)"
  echo "vendored llama.cpp: ggml-org/llama.cpp@$COMMIT"
  echo "compiler: $(${CXX:-c++} --version | head -1)"
  echo "cmake: $(cmake --version | head -1) ${GEN[*]}"
  echo "cmake flags: ${FLAGS[*]}"
  echo "targets: llama-server llama-quantize, -j $JOBS"
  echo "llama-server --version: $("$SERVER" --version 2>&1 | tr '\n' ' ')"
  echo "llama-server: $SERVER"
  echo "llama-quantize: $QUANTIZE"
} >"$OUT/build-info.txt"
cat "$OUT/build-info.txt" >&2
echo "$SERVER"
echo "$QUANTIZE"
