#!/usr/bin/env bash
# Build the real worker node and the local registry from pinned upstream sources, cached like the
# control plane in ~/.cache/modeldeploy/<component>-<version>/ (see build.sh, versions.env).
#
#   kubelet, kube-proxy   the temp module of build.sh (same k8s.io/kubernetes, same Go build cache)
#   containerd, containerd-shim-runc-v2, ctr   github.com/containerd/containerd/v2, CGO off, no btrfs/devmapper
#   registry              github.com/distribution/distribution/v3/cmd/registry (loopback OCI registry)
#   pause.tar             realnode/pause.c compiled static, packed as a one-layer OCI image layout tar
#
# runc and the CNI plugins are Debian packages (runc, containernetworking-plugins): .ci/run installs them.
# Opt-in (`modeldeploy cluster up --real-node`, `make real-node-build`) because a cold build adds minutes.
#
# Usage: e2e/cluster/build-node.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=build.sh
source "$HERE/build.sh"

build_containerd() {
  local pkg=github.com/containerd/containerd/v2 ld
  ld="-X $pkg/version.Version=$CONTAINERD_VERSION -X $pkg/version.Revision=modeldeploy"
  local b
  for b in containerd containerd-shim-runc-v2 ctr; do
    go_install "$b" containerd "$CONTAINERD_VERSION" "$pkg/cmd/$b" "$ld" "no_btrfs no_devmapper"
  done
}

build_registry() {
  go_install registry distribution "$DISTRIBUTION_VERSION" github.com/distribution/distribution/v3/cmd/registry \
    "-X github.com/distribution/distribution/v3/version.version=$DISTRIBUTION_VERSION"
}

# pause.tar: an OCI image layout (oci-layout, index.json, blobs/sha256/*) holding one gzip layer
# with /pause. Byte-for-byte reproducible: sorted tar entries, mtime 0, uid/gid 0, gzip -n.
build_pause() {
  local out="$CACHE/pause-$PAUSE_VERSION" tmp cc="${CC:-cc}"
  if [[ -s "$out/pause.tar" ]]; then log "cached pause $PAUSE_VERSION"; return 0; fi
  command -v "$cc" >/dev/null || { log "no C compiler ($cc) for pause.c: apt-get install gcc libc6-dev"; return 1; }
  mkdir -p "$out"; tmp=$(mktemp -d /tmp/modeldeploy-pause.XXXXXX)
  mkdir -p "$tmp/rootfs" "$tmp/oci/blobs/sha256"
  "$cc" -Os -static -Wall -Werror -DPAUSE_VERSION="\"$PAUSE_VERSION\"" -o "$tmp/rootfs/pause" "$HERE/realnode/pause.c"
  strip "$tmp/rootfs/pause" 2>/dev/null || true
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$tmp/rootfs" -cf "$tmp/layer.tar" pause
  local diffid layer config manifest lsize csize msize
  diffid=$(sha256sum "$tmp/layer.tar" | cut -d' ' -f1)
  gzip -n -9 -c "$tmp/layer.tar" > "$tmp/layer.tgz"
  layer=$(sha256sum "$tmp/layer.tgz" | cut -d' ' -f1); lsize=$(stat -c %s "$tmp/layer.tgz")
  mv "$tmp/layer.tgz" "$tmp/oci/blobs/sha256/$layer"
  printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/pause"],"User":"65535:65535"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created_by":"modeldeploy build-node.sh: pause.c, static"}]}' \
    "$diffid" > "$tmp/config.json"
  config=$(sha256sum "$tmp/config.json" | cut -d' ' -f1); csize=$(stat -c %s "$tmp/config.json")
  mv "$tmp/config.json" "$tmp/oci/blobs/sha256/$config"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
    "$config" "$csize" "$layer" "$lsize" > "$tmp/manifest.json"
  manifest=$(sha256sum "$tmp/manifest.json" | cut -d' ' -f1); msize=$(stat -c %s "$tmp/manifest.json")
  mv "$tmp/manifest.json" "$tmp/oci/blobs/sha256/$manifest"
  printf '{"imageLayoutVersion":"1.0.0"}' > "$tmp/oci/oci-layout"
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"modeldeploy.local/pause:%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$manifest" "$msize" "$PAUSE_VERSION" "$PAUSE_VERSION" > "$tmp/oci/index.json"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$tmp/oci" -cf "$out/pause.tar.tmp" .
  mv "$out/pause.tar.tmp" "$out/pause.tar"
  rm -rf "$tmp"
  log "built pause.tar (modeldeploy.local/pause:$PAUSE_VERSION, manifest sha256:$manifest) -> $out/pause.tar"
}

node_main() {
  local t0; t0=$(date +%s)
  log "go: $("$GO" version); cache: $CACHE"
  local missing=()
  for tool in runc iptables-restore; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local ]] || missing+=(containernetworking-plugins)
  if [[ ${#missing[@]} -gt 0 ]]; then
    log "missing: ${missing[*]} (apt-get install runc containernetworking-plugins iptables; .ci/run does)"
  fi
  build_pause
  build_kubernetes kubelet kube-proxy
  build_containerd
  build_registry
  log "real node binaries present in $CACHE ($(( $(date +%s) - t0 ))s)"
}

node_main "$@"
