#!/usr/bin/env bash
# `make test`: every test, in two tiers so that the Go builds and the tests that need none of their
# binaries share the wall clock (on a cold machine the builds take ~15 min of it).
#   tier 1: tests/ not marked cluster_bins, while `make $BUILD` compiles (output to a log);
#   tier 2: the cluster_bins tests in tests/ and all of e2e/, in two lanes, once tier 1 and the first
#           build target (the cluster) are done; the node_bins tests (the real node, the registry)
#           wait for the rest.
# usage: test_tiers.sh PYTHON "MAKE TARGETS" [pytest args...]
set -uo pipefail
py=$1
build=$2
shift 2
log=$(mktemp)
marks=$(mktemp -d)
# The build targets in order, a mark after each: lane 1 needs only the first (the local cluster), and
# lane 2 needs the rest (the real node) only for its last modules, so neither waits for more.
(
  for t in $build; do
    make --no-print-directory "$t" || { touch "$marks/failed"; exit 1; }
    touch "$marks/$t"
  done
) >"$log" 2>&1 &
builder=$!
trap 'kill "$builder" 2>/dev/null || true' EXIT
# built TARGET: wait for TARGET's mark; 1 when the build failed first.
built() {
  until [[ -e "$marks/$1" ]]; do
    [[ -e "$marks/failed" ]] && return 1
    sleep 2
  done
}
first=${build%% *}
start=$(date +%s)
"$py" -m pytest -q -ra -m "not cluster_bins" "$@" tests
tier1=$?
echo "test_tiers: tier 1 (no built binaries) rc=$tier1 in $(( $(date +%s) - start )) s"
if ! built "$first"; then
  tail -n 200 "$log" >&2
  echo "test_tiers: make $first failed (above)" >&2
  exit 1
fi
echo "test_tiers: make $first done $(( $(date +%s) - start )) s after tier 1 started"
# Tier 2 in two lanes at once, each with its own local cluster (conftest: $MODELDEPLOY_CLUSTER_*):
# an e2e lane waits on rollout steps, analysis windows and pod starts, which leaves about a quarter
# of the two cores idle (bench/results/ci.md), and the second lane fills it. Lane 2 takes the
# cluster_bins tests in tests/ and the e2e modules below, then the node_bins tests (what `make
# real-node-build` compiles: the real node, which has its own cluster anyway, and the registry) once
# every build target is done; lane 1 the rest of e2e/ on the default cluster. Lane 2's output
# follows lane 1's.
lane2_e2e=(e2e/test_rollout_quality.py e2e/test_rollout_lora.py)
lane2_node=(e2e/test_real_node.py e2e/test_real_node_oci.py)
lane1_skip=()
for f in "${lane2_e2e[@]}" "${lane2_node[@]}"; do lane1_skip+=(--ignore "$f"); done
lane2_log=$(mktemp)
start=$(date +%s)
(
  export MODELDEPLOY_CLUSTER_NAME=modeldeploy-lane2 MODELDEPLOY_CLUSTER_BRIDGE=mdbr2 \
    MODELDEPLOY_CLUSTER_POD_CIDR=10.244.2.0/24
  "$py" -m pytest -q -ra -m "cluster_bins and not node_bins" "$@" tests "${lane2_e2e[@]}"
  rc=$?
  for t in $build; do built "$t" || { echo "test_tiers: make $t failed (see the build log below)"; exit 1; }; done
  "$py" -m pytest -q -ra -m node_bins "$@" tests "${lane2_node[@]}"
  node_rc=$?
  exit $(( rc != 0 || node_rc != 0 ))
) >"$lane2_log" 2>&1 &
lane2=$!
trap 'kill "$builder" "$lane2" 2>/dev/null || true' EXIT
"$py" -m pytest -q -ra -m "cluster_bins and not node_bins" "$@" "${lane1_skip[@]}" e2e
lane1_rc=$?
echo "test_tiers: tier 2 lane 1 (e2e on the default cluster) rc=$lane1_rc in $(( $(date +%s) - start )) s"
wait "$lane2"
lane2_rc=$?
wait "$builder"
build_rc=$?
trap - EXIT
echo "test_tiers: tier 2 lane 2 (tests/ cluster_bins, ${lane2_e2e[*]}, then ${lane2_node[*]}) output:"
cat "$lane2_log"
echo "test_tiers: tier 2 lane 2 rc=$lane2_rc; tier 2 done in $(( $(date +%s) - start )) s"
grep -h "^\[.*-build\] built" "$log" || true
if [[ $build_rc -ne 0 ]]; then
  tail -n 200 "$log" >&2
  echo "test_tiers: make $build failed (above)" >&2
fi
rm -rf "$lane2_log" "$log" "$marks"
[[ $tier1 -eq 0 && $lane1_rc -eq 0 && $lane2_rc -eq 0 && $build_rc -eq 0 ]]
