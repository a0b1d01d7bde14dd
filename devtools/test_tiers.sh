#!/usr/bin/env bash
# `make test`: every test, in two tiers so that the Go builds and the tests that need none of their
# binaries share the wall clock (on a cold machine the builds take ~15 min of it).
#   tier 1: tests/ not marked cluster_bins, while `make $BUILD` compiles (output to a log);
#   tier 2: the cluster_bins tests in tests/ and all of e2e/, once the build is done.
# usage: test_tiers.sh PYTHON "MAKE TARGETS" [pytest args...]
set -uo pipefail
py=$1
build=$2
shift 2
log=$(mktemp)
make --no-print-directory $build >"$log" 2>&1 &
builder=$!
trap 'kill "$builder" 2>/dev/null || true' EXIT
start=$(date +%s)
"$py" -m pytest -q -ra -m "not cluster_bins" "$@" tests
tier1=$?
echo "test_tiers: tier 1 (no built binaries) rc=$tier1 in $(( $(date +%s) - start )) s"
if ! wait "$builder"; then
  tail -n 200 "$log" >&2
  echo "test_tiers: make $build failed (above)" >&2
  exit 1
fi
trap - EXIT
grep -h "^\[.*-build\] built" "$log" || true
echo "test_tiers: make $build done $(( $(date +%s) - start )) s after tier 1 started"
start=$(date +%s)
"$py" -m pytest -q -ra -m cluster_bins "$@" tests e2e
tier2=$?
echo "test_tiers: tier 2 (cluster_bins + e2e) rc=$tier2 in $(( $(date +%s) - start )) s"
rm -f "$log"
[[ $tier1 -eq 0 && $tier2 -eq 0 ]]
