#!/usr/bin/env bash
# Build the real worker node and the local registry from pinned upstream sources, cached like the
# control plane in ~/.cache/modeldeploy/<component>-<version>/ (see build.sh, versions.env).
#
#   kubelet, kube-proxy   the temp module of build.sh (same k8s.io/kubernetes, same Go build cache)
#   containerd, containerd-shim-runc-v2, ctr   github.com/containerd/containerd/v2, CGO off, no btrfs/devmapper
#   registry              github.com/distribution/distribution/v3/cmd/registry (loopback OCI registry)
#   pause.tar             realnode/pause.c compiled static, packed as a one-layer OCI image layout tar
#   probe.tar             realnode/probe/main.go (the node tests' HTTP server/client), packed the same way
#
# runc and the CNI plugins are Debian packages (runc, containernetworking-plugins): .ci/run installs them.
# Opt-in (`modeldeploy cluster up --real-node`, `make real-node-build`) because a cold build adds minutes.
#
# Usage: devtools/modeldeploy_dev/cluster/build-node.sh
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

# oci_tar NAME TAG ROOTFS ENTRYPOINT_JSON USER OUT: pack ROOTFS as a one-layer OCI image layout tar
# (oci-layout, index.json, blobs/sha256/*) named modeldeploy.local/NAME:TAG. Byte-for-byte
# reproducible: sorted tar entries, mtime 0, uid/gid 0, gzip -n. `ctr images import` and
# realnode/oci.py (push to the loopback registry) both read it.
oci_tar() {
  local name=$1 tag=$2 rootfs=$3 entrypoint=$4 user=$5 out=$6 tmp
  tmp=$(mktemp -d /tmp/modeldeploy-oci.XXXXXX); mkdir -p "$tmp/oci/blobs/sha256"
  chmod 0755 "$rootfs"  # the image root: mktemp made it 0700, which a non-root container cannot enter
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$rootfs" -cf "$tmp/layer.tar" .
  local diffid layer config manifest lsize csize msize
  diffid=$(sha256sum "$tmp/layer.tar" | cut -d' ' -f1)
  gzip -n -9 -c "$tmp/layer.tar" > "$tmp/layer.tgz"
  layer=$(sha256sum "$tmp/layer.tgz" | cut -d' ' -f1); lsize=$(stat -c %s "$tmp/layer.tgz")
  mv "$tmp/layer.tgz" "$tmp/oci/blobs/sha256/$layer"
  printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":%s,"User":"%s"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created_by":"modeldeploy build-node.sh: %s"}]}' \
    "$entrypoint" "$user" "$diffid" "$name" > "$tmp/config.json"
  config=$(sha256sum "$tmp/config.json" | cut -d' ' -f1); csize=$(stat -c %s "$tmp/config.json")
  mv "$tmp/config.json" "$tmp/oci/blobs/sha256/$config"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
    "$config" "$csize" "$layer" "$lsize" > "$tmp/manifest.json"
  manifest=$(sha256sum "$tmp/manifest.json" | cut -d' ' -f1); msize=$(stat -c %s "$tmp/manifest.json")
  mv "$tmp/manifest.json" "$tmp/oci/blobs/sha256/$manifest"
  printf '{"imageLayoutVersion":"1.0.0"}' > "$tmp/oci/oci-layout"
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"modeldeploy.local/%s:%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$manifest" "$msize" "$name" "$tag" "$tag" > "$tmp/oci/index.json"
  mkdir -p "$(dirname "$out")"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$tmp/oci" -cf "$out.tmp" .
  mv "$out.tmp" "$out"
  rm -rf "$tmp"
  log "packed modeldeploy.local/$name:$tag (manifest sha256:$manifest) -> $out"
}

# pause.tar: the sandbox image, pause.c compiled static (no libc in the image)
build_pause() {
  local out="$CACHE/pause-$PAUSE_VERSION" tmp cc="${CC:-cc}"
  if [[ -s "$out/pause.tar" ]]; then log "cached pause $PAUSE_VERSION"; return 0; fi
  command -v "$cc" >/dev/null || { log "no C compiler ($cc) for pause.c: apt-get install gcc libc6-dev"; return 1; }
  tmp=$(mktemp -d /tmp/modeldeploy-pause.XXXXXX)
  "$cc" -Os -static -Wall -Werror -DPAUSE_VERSION="\"$PAUSE_VERSION\"" -o "$tmp/pause" "$HERE/realnode/pause.c"
  strip "$tmp/pause" 2>/dev/null || true
  oci_tar pause "$PAUSE_VERSION" "$tmp" '["/pause"]' "65535:65535" "$out/pause.tar"
  rm -rf "$tmp"
}

# probe.tar: the node tests' workload (realnode/probe/main.go, stdlib only), cached by content hash
build_probe() {
  local src="$HERE/realnode/probe/main.go" sum out tmp
  sum=$(sha256sum "$src" | cut -c1-12); out="$CACHE/probe-$sum"
  if [[ -s "$out/probe.tar" ]]; then log "cached probe $sum"; return 0; fi
  tmp=$(mktemp -d /tmp/modeldeploy-probe.XXXXXX); mkdir -p "$tmp/src" "$tmp/rootfs"
  cp "$src" "$tmp/src/"
  printf 'module modeldeploy.local/probe\n\ngo 1.26.0\n' > "$tmp/src/go.mod"
  (cd "$tmp/src" && "${NICE[@]}" "$GO" build -trimpath -ldflags "-s -w" -o "$tmp/rootfs/probe" .)
  oci_tar probe "$sum" "$tmp/rootfs" '["/probe"]' "65532:65532" "$out/probe.tar"
  rm -rf "$tmp"
}

node_main() {
  local t0; t0=$(date +%s)
  log "go: $("$GO" version); cache: $CACHE"
  local missing=()
  for tool in runc iptables-restore; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] || missing+=(containernetworking-plugins)
  if [[ ${#missing[@]} -gt 0 ]]; then
    log "missing: ${missing[*]} (apt-get install runc containernetworking-plugins iptables; .ci/run does)"
  fi
  build_pause
  build_probe
  build_kubernetes kubelet kube-proxy
  build_containerd
  build_registry
  log "real node binaries present in $CACHE ($(( $(date +%s) - t0 ))s)"
}

node_main "$@"
