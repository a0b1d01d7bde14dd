#!/usr/bin/env bash
# `make test`: every test, in two tiers so that the Go builds and the tests that need none of their
# binaries share the wall clock (on a cold machine the builds take ~15 min of it).
#   tier 1: tests/ not marked cluster_bins, on both cores (pytest-xdist, one file per worker at a
#           time), while `make $BUILD` compiles (output to a log);
#   tier 2: the cluster_bins tests in tests/ and all of e2e/, in two lanes, once tier 1 and the first
#           build target (the cluster) are done; the node_bins tests (the real node, the registry)
#           wait for the rest.
# Everything is bounded, so that a hang ends as a failure that says where it was, well inside CI's
# 90 minutes, and never as a silent timeout (as stop 44's CI did, after lane 1 passed): a test
# fails after pytest-timeout's limit (pyproject), each pytest run gets SIGINT when it outlives its
# budget below (pytest then prints where it was and its summary, and tears its clusters down), and
# the waits for a build give up at theirs. Lane 2's output is shown live once lane 1 is done.
# usage: test_tiers.sh PYTHON "MAKE TARGETS" [pytest args...]
set -uo pipefail
py=$1
build=$2
shift 2
log=$(mktemp)
marks=$(mktemp -d)
# Budgets in seconds. On the 2-core AMD EPYC (AVX2) machines of 2026-12-07 (bench/results/ci.md):
# tier 1 33 min on one core, lane 1 over 40, lane 2 24 + 27. Whatever the parts' budgets, no part
# runs past TIERS_S after the start (CI stops at 90 minutes; setup and lint take ~5 before this).
TIERS_S=${TIERS_S:-4800}
TIER1_S=${TIER1_S:-2400}
LANE_S=${LANE_S:-3000}
NODE_S=${NODE_S:-2400}
LATE_S=${LATE_S:-1200}
SERIAL_S=${SERIAL_S:-900}
# Tier 1 on both cores: its tests run one at a time and leave a core idle (a warm run's tier 1 was
# 52 % busy), and they share no state a file of another worker touches (caches are written by
# rename); the tests marked `serial` run after, alone. TIER1_WORKERS=0 runs it in one process.
TIER1_WORKERS=${TIER1_WORKERS:-2}
xdist=()
(( TIER1_WORKERS > 0 )) && xdist=(-n "$TIER1_WORKERS" --dist loadfile)
t0=$(date +%s)
# bounded SECONDS CMD...: CMD, sent SIGINT after SECONDS (or when TIERS_S is up, if sooner) and
# SIGKILL 120 s later (rc 124 or 137).
bounded() {
  local budget=$1 left=$(( TIERS_S - ($(date +%s) - t0) ))
  shift
  (( left < budget )) && budget=$(( left > 60 ? left : 60 ))
  timeout --signal=INT --kill-after=120 "$budget" "$@"
  local rc=$?
  [[ $rc -eq 124 || $rc -eq 137 ]] && echo "test_tiers: over its ${budget} s budget, interrupted: $*"
  return $rc
}
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
# built TARGET: wait for TARGET's mark; 1 when the build failed first, or is not done by TIERS_S.
built() {
  until [[ -e "$marks/$1" ]]; do
    [[ -e "$marks/failed" ]] && return 1
    if (( $(date +%s) - t0 > TIERS_S )); then
      echo "test_tiers: make $1 not done ${TIERS_S} s after the start; giving up on it" >&2
      return 1
    fi
    sleep 2
  done
}
first=${build%% *}
start=$(date +%s)
bounded "$TIER1_S" "$py" -m pytest -q -ra "${xdist[@]}" -m "not cluster_bins and not serial" "$@" tests
tier1=$?
# the `serial` tests (tests/conftest.py) alone, on an otherwise quiet tier
bounded "$SERIAL_S" "$py" -m pytest -q -ra -m "serial and not cluster_bins" "$@" tests || tier1=1
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
# every build target is done; lane 1 the rest of e2e/ on the default cluster, the GitOps e2e last
# when argocd-build is a target (its binaries come last). Lane 2's output follows lane 1's.
lane2_e2e=(e2e/test_rollout_quality.py e2e/test_rollout_lora.py)
lane2_node=(e2e/test_real_node.py e2e/test_real_node_oci.py)
lane1_late=(e2e/test_gitops.py)
lane1_skip=()
for f in "${lane2_e2e[@]}" "${lane2_node[@]}" "${lane1_late[@]}"; do lane1_skip+=(--ignore "$f"); done
lane2_log=$(mktemp)
start=$(date +%s)
(
  export MODELDEPLOY_CLUSTER_NAME=modeldeploy-lane2 MODELDEPLOY_CLUSTER_BRIDGE=mdbr2 \
    MODELDEPLOY_CLUSTER_POD_CIDR=10.244.2.0/24
  bounded "$LANE_S" "$py" -m pytest -q -ra -m "cluster_bins and not node_bins" "$@" tests "${lane2_e2e[@]}"
  rc=$?
  for t in $build; do built "$t" || { echo "test_tiers: make $t failed (see the build log below)"; exit 1; }; done
  bounded "$NODE_S" "$py" -m pytest -q -ra -m node_bins "$@" tests "${lane2_node[@]}"
  node_rc=$?
  exit $(( rc != 0 || node_rc != 0 ))
) >"$lane2_log" 2>&1 &
lane2=$!
trap 'kill "$builder" "$lane2" 2>/dev/null || true' EXIT
bounded "$LANE_S" "$py" -m pytest -q -ra -m "cluster_bins and not node_bins" "$@" "${lane1_skip[@]}" e2e
lane1_rc=$?
# The GitOps e2e only when Argo CD is among the build targets: not yet in CI's `make test`, whose
# 90 minutes it does not fit on the AVX2 machines (bench/results/ci.md, issue 55).
if [[ " $build " == *" argocd-build "* ]]; then
  if built argocd-build; then
    bounded "$LATE_S" "$py" -m pytest -q -ra -m "cluster_bins and not node_bins" "$@" "${lane1_late[@]}" \
      || lane1_rc=1
  else
    echo "test_tiers: make argocd-build failed (see the build log below)"
    lane1_rc=1
  fi
fi
echo "test_tiers: tier 2 lane 1 (e2e on the default cluster) rc=$lane1_rc in $(( $(date +%s) - start )) s"
echo "test_tiers: tier 2 lane 2 (tests/ cluster_bins, ${lane2_e2e[*]}, then ${lane2_node[*]}), so far and live:"
# From its first line, and on as it goes until lane 2 ends (lane 2's own budgets bound that).
tail -n +1 --pid="$lane2" -f "$lane2_log"
wait "$lane2"
lane2_rc=$?
# Lane 2 waited for every target's mark, so the builder is done unless a target failed or stuck.
build_rc=0
for t in $build; do [[ -e "$marks/$t" ]] || build_rc=1; done
kill "$builder" 2>/dev/null
wait "$builder" 2>/dev/null
trap - EXIT
echo "test_tiers: tier 2 lane 2 rc=$lane2_rc; tier 2 done in $(( $(date +%s) - start )) s"
grep -h "^\[.*-build\] built" "$log" || true
if [[ $build_rc -ne 0 ]]; then
  tail -n 200 "$log" >&2
  echo "test_tiers: make $build failed (above)" >&2
fi
rm -rf "$lane2_log" "$log" "$marks"
[[ $tier1 -eq 0 && $lane1_rc -eq 0 && $lane2_rc -eq 0 && $build_rc -eq 0 ]]
