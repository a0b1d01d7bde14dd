#!/usr/bin/env bash
# Build Argo CD from its Go module at the pinned version, cached like the control plane in
# ~/.cache/modeldeploy/argocd-<version>/ (see build.sh, versions.env).
#
#   argocd        github.com/argoproj/argo-cd/v3/cmd: one binary that is the application controller,
#                 the repo server, the API server or the CLI by the name it runs under
#                 (ARGOCD_BINARY_NAME), as Argo CD's own images and its local dev setup run it
#   crds/         the Application, ApplicationSet and AppProject CRDs from the module's manifests/crds
#
# Argo CD's go.mod pins k8s.io/* and a few others by `replace`, which Go ignores in a dependency, so
# the temp module here carries the same replace block (all module versions, no local paths).
# redis-server and git are Debian packages (.ci/run installs them); the repo server renders Helm
# charts with the helm that build.sh compiles.
#
# Usage: devtools/modeldeploy_dev/cluster/build-argocd.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=build.sh
source "$HERE/build.sh"

build_argocd() {
  local out="$CACHE/argocd-$ARGOCD_VERSION" mod=github.com/argoproj/argo-cd/v3 dir modfile
  if have "$out/argocd" && [[ -s "$out/crds/applicationset-crd.yaml" ]]; then
    log "cached argocd $ARGOCD_VERSION"
    return 0
  fi
  mkdir -p "$out/crds"
  dir=$(mktemp -d /tmp/modeldeploy-argocdbuild.XXXXXX)
  modfile=$(cd "$dir" && "$GO" mod download -json "$mod@$ARGOCD_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  {
    echo "module modeldeploy.local/argocdbuild"
    echo
    echo "go $("$GO" env GOVERSION | sed 's/^go//; s/^\([0-9]*\.[0-9]*\).*/\1/').0"
    echo
    echo "require $mod $ARGOCD_VERSION"
    echo
    sed -n '/^replace (/,/^)/p' "$modfile"
  } > "$dir/go.mod"
  if grep -q '=> \.' "$dir/go.mod"; then
    log "argocd $ARGOCD_VERSION replaces a module by a local path; this script cannot build it"
    return 1
  fi
  printf '//go:build tools\n\npackage tools\n\nimport _ "%s/cmd"\n' "$mod" > "$dir/tools.go"
  (cd "$dir" && "$GO" mod tidy >/dev/null 2>&1 || "$GO" mod download)
  local pkg="$mod/common" ld
  ld="-X $pkg.version=${ARGOCD_VERSION#v} -X $pkg.gitTag=$ARGOCD_VERSION -X $pkg.gitCommit=modeldeploy"
  ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  build_in_module "$dir" "$out/argocd" "$mod/cmd" "$ld"
  local src
  src=$(cd "$dir" && "$GO" list -m -f '{{.Dir}}' "$mod")
  for f in application-crd.yaml applicationset-crd.yaml appproject-crd.yaml; do
    install -m 0644 "$src/manifests/crds/$f" "$out/crds/$f"
  done
  rm -rf "$dir"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  log "go: $("$GO" version); cache: $CACHE"
  build_argocd
fi
