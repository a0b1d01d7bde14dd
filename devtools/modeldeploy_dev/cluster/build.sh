#!/usr/bin/env bash
# Build the local control plane from upstream Go modules at pinned versions.
#
# Why a script and not downloads: this machine reaches only the Go module proxy (no GitHub
# releases, no container registry). Every binary is compiled from its module at the version
# pinned in versions.env and cached under ~/.cache/modeldeploy/<component>-<version>/; nothing
# is vendored or committed. k8s.io/kubernetes points its k8s.io/* staging modules at
# ./staging/src/..., which does not exist in a module download, so the temp module generated
# here replaces each of them with the published k8s.io/<name> v0.<minor>.<patch>.
#
# Usage: devtools/modeldeploy_dev/cluster/build.sh [--print-dir]   (one progress line per binary)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"
CACHE="${MODELDEPLOY_CACHE:-$HOME/.cache/modeldeploy}"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
export GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local
export GOPROXY="${GOPROXY:-https://proxy.golang.org}"
# The Go compiler spends a fifth of its time collecting garbage at the default GOGC=100; 400 trades
# ~1 GB more memory per compile for ~20% less CPU (helm cold: 120 -> 99 s; bench/results/ci.md).
export GOGC="${GOGC:-400}"
NICE=(nice -n 10)

log() { printf '[cluster-build] %s\n' "$*" >&2; }

have() { [[ -x "$1" ]]; }

# build_in_module DIR OUT PKG LDFLAGS -- runs `go build` of PKG inside the temp module DIR.
build_in_module() {
  local dir=$1 out=$2 pkg=$3 ldflags=$4 t0
  t0=$(date +%s)
  (cd "$dir" && "${NICE[@]}" "$GO" build -trimpath -ldflags "-s -w $ldflags" -o "$out.tmp" "$pkg")
  mv "$out.tmp" "$out"
  log "built $(basename "$out") ($pkg) in $(( $(date +%s) - t0 ))s -> $out"
}

# --- Kubernetes: kube-apiserver, kube-controller-manager, kube-scheduler, kubectl -------------
k8s_module() {
  local dir=$1 minor_patch="${K8S_VERSION#v1.}"
  mkdir -p "$dir"
  local mod modfile
  # the go.mod of k8s.io/kubernetes, fetched through the module proxy by go itself (no curl needed)
  modfile=$(cd "$dir" && "$GO" mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  mod=$(cat "$modfile")
  {
    echo "module modeldeploy.local/k8sbuild"
    echo
    echo "go $("$GO" env GOVERSION | sed 's/^go//; s/^\([0-9]*\.[0-9]*\).*/\1/').0"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    # every `k8s.io/x => ./staging/src/k8s.io/x` becomes `k8s.io/x => k8s.io/x v0.<minor>.<patch>`
    printf '%s\n' "$mod" | sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 v0.'"$minor_patch"'#p'
    echo ")"
  } > "$dir/go.mod"
  cat > "$dir/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubectl/pkg/cmd"
)
GO
}

# build_kubernetes [BINARY...]: the control plane by default; build-node.sh asks for kubelet and
# kube-proxy, which come from the same module and share its Go build cache.
build_kubernetes() {
  local out="$CACHE/kubernetes-$K8S_VERSION" dir
  local need=() wanted=("$@")
  [[ ${#wanted[@]} -eq 0 ]] && wanted=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
  for b in "${wanted[@]}"; do
    if have "$out/$b"; then log "cached $b $K8S_VERSION"; else need+=("$b"); fi
  done
  [[ ${#need[@]} -eq 0 ]] && return 0
  mkdir -p "$out"
  dir=$(mktemp -d /tmp/modeldeploy-k8sbuild.XXXXXX)
  k8s_module "$dir"
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local v=k8s.io/component-base/version c=k8s.io/client-go/pkg/version
  local ld="" p
  for p in $v $c; do
    ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  for b in "${need[@]}"; do
    local pkg="k8s.io/kubernetes/cmd/$b"
    build_in_module "$dir" "$out/$b" "$pkg" "$ld"
  done
  rm -rf "$dir"
}

# --- etcd -------------------------------------------------------------------------------------
build_etcd() {
  local out="$CACHE/etcd-$ETCD_VERSION" dir
  if have "$out/etcd"; then log "cached etcd $ETCD_VERSION"; return 0; fi
  mkdir -p "$out"
  dir=$(mktemp -d /tmp/modeldeploy-etcdbuild.XXXXXX)
  # The etcd server module has relative replace directives, so `go install @version` refuses it;
  # a temp module that requires it builds fine.
  printf 'module modeldeploy.local/etcdbuild\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' \
    "$ETCD_VERSION" > "$dir/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > "$dir/tools.go"
  build_in_module "$dir" "$out/etcd" go.etcd.io/etcd/server/v3 \
    "-X go.etcd.io/etcd/api/v3/version.GitSHA=modeldeploy"
  rm -rf "$dir"
}

# --- kwok, kwokctl, helm, prometheus: plain `go install module/cmd/x@version` ------------------
go_install() {
  local name=$1 component=$2 version=$3 pkg=$4 ldflags=${5:-} tags=${6:-}
  local out="$CACHE/$component-$version" t0
  if have "$out/$name"; then log "cached $name $version"; return 0; fi
  mkdir -p "$out"; t0=$(date +%s)
  GOBIN="$out" "${NICE[@]}" "$GO" install -trimpath -tags "$tags" -ldflags "-s -w $ldflags" "$pkg@$version"
  log "built $name ($pkg@$version) in $(( $(date +%s) - t0 ))s -> $out/$name"
}

# Prometheus, for the tests of canary analysis through its HTTP API (operator/analysis/promql.py), and promtool.
# Module v0.3MM.P is Prometheus 3.MM.P. `remove_all_sd` leaves out the cloud service
# discovery plugins (static and file SD stay): the tests use static targets only.
build_prometheus() {
  local v="${PROMETHEUS_VERSION#v0.}" pv=github.com/prometheus/common/version
  v="$(( 10#${v%%.*} / 100 )).$(( 10#${v%%.*} % 100 )).${v#*.}"
  go_install prometheus prometheus "$PROMETHEUS_VERSION" github.com/prometheus/prometheus/cmd/prometheus \
    "-X $pv.Version=$v -X $pv.Branch=modeldeploy -X $pv.Revision=$PROMETHEUS_VERSION" remove_all_sd
  # promtool from the same module and version: `check rules` / `test rules` on the chart's alerts
  # and the dashboard's queries (tests/chart/test_alert_rules.py, tests/chart/test_dashboard.py)
  go_install promtool prometheus "$PROMETHEUS_VERSION" github.com/prometheus/prometheus/cmd/promtool \
    "-X $pv.Version=$v -X $pv.Branch=modeldeploy -X $pv.Revision=$PROMETHEUS_VERSION" remove_all_sd
}

main() {
  local t0; t0=$(date +%s)
  if [[ "${1:-}" == "--print-dir" ]]; then echo "$CACHE"; return 0; fi
  log "go: $("$GO" version); cache: $CACHE"
  local kv="-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=$K8S_VERSION"
  go_install kwokctl kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwokctl "$kv"
  go_install kwok kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok "$kv"
  build_etcd
  build_kubernetes
  go_install helm helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm \
    "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  build_prometheus
  # the custom metrics API the HPA e2e scales on (devtools/modeldeploy_dev/custom_metrics.py)
  go_install test-adapter custom-metrics-apiserver "$CUSTOM_METRICS_APISERVER_VERSION" \
    sigs.k8s.io/custom-metrics-apiserver/test-adapter
  log "all binaries present in $CACHE ($(( $(date +%s) - t0 ))s)"
}

# build-node.sh sources this file for its functions; only a direct run builds the control plane
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then main "$@"; fi
