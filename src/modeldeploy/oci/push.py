"""`modeldeploy model push DIR REGISTRY/REPO[:TAG]`: a model directory as an OCI artifact (no torch).

Packs DIR reproducibly (`modeldeploy.oci.artifact`: same directory, same digest), uploads the blobs
the registry lacks, puts the manifest by digest (and the tag, if given, for people), and prints the
two lines a bundle's `model:` needs:

    uri: oci://REGISTRY/REPO@sha256:<manifest digest>
    digest: sha256:<model digest, as `modeldeploy digest DIR` prints>
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import httpx

from modeldeploy.oci import ArtifactError, OciRef, OciRefError, parse_push_target
from modeldeploy.oci.artifact import MANIFEST_MEDIA_TYPE, Artifact, pack
from modeldeploy.oci.registry import RegistryClient


def push(
    root: Path,
    registry: str,
    repo: str,
    tag: str | None,
    insecure: bool = False,
    platform: str = "linux/amd64",
) -> tuple[Artifact, OciRef, dict[str, float]]:
    """Pack and push; returns the artifact, its pinned reference and timings/sizes for the log."""
    t0 = time.monotonic()
    art = pack(root, platform)
    t1 = time.monotonic()
    sent = skipped = 0
    with RegistryClient(registry, insecure=insecure) as client:
        client.authorize(repo, "pull,push")
        for layer in art.layers:
            if client.has_blob(repo, layer.digest):
                skipped += layer.size
                continue
            client.upload_blob(repo, layer.digest, layer.size, layer.chunks)
            sent += layer.size
        if not client.has_blob(repo, art.config_digest):
            client.upload_blob(repo, art.config_digest, len(art.config), lambda: [art.config])
        for ref in [art.digest, *([tag] if tag else [])]:
            got = client.put_manifest(repo, ref, art.manifest, MANIFEST_MEDIA_TYPE)
            if got and got != art.digest:
                raise ArtifactError(f"registry {registry} stored the manifest as {got}, not {art.digest}")
    stats = {
        "pack_s": t1 - t0,
        "upload_s": time.monotonic() - t1,
        "sent_bytes": sent,
        "skipped_bytes": skipped,
    }
    return art, OciRef(registry, repo, art.digest), stats


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "dir", help="model directory (what `modeldeploy digest DIR` covers is what is pushed)"
    )
    parser.add_argument(
        "target",
        help="REGISTRY/REPO[:TAG], e.g. 127.0.0.1:5000/models/smollm2:v1; credentials, if the registry "
        "asks, from docker's config.json (`docker login`)",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="plain HTTP to a non-loopback registry (loopback registries always use HTTP)",
    )
    parser.add_argument(
        "--platform",
        default="linux/amd64",
        help="OS/ARCH recorded in the image config (default linux/amd64; it is part of the digest)",
    )
    parser.add_argument("--quiet", "-q", action="store_true", help="print only the oci:// URI")


def main(args: argparse.Namespace) -> int:
    try:
        registry, repo, tag = parse_push_target(args.target)
    except OciRefError as e:
        print(f"model push: {e}", file=sys.stderr)
        return 2
    root = Path(args.dir)
    if not root.is_dir():
        print(f"model push: DIR {args.dir!r} is not a directory", file=sys.stderr)
        return 2
    try:
        art, ref, stats = push(root, registry, repo, tag, args.insecure, args.platform)
    except ValueError as e:
        print(f"model push: {e}", file=sys.stderr)
        return 2
    except (ArtifactError, OSError, httpx.HTTPError) as e:  # refused connection, TLS to an HTTP registry
        print(f"model push: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if args.quiet:
        print(ref.uri)
        return 0
    mb = 1 << 20
    print(
        f"pushed {len(art.layers)} layers, {art.size / mb:.1f} MiB ({stats['sent_bytes'] / mb:.1f} MiB sent, "
        f"{stats['skipped_bytes'] / mb:.1f} MiB already there) in {stats['pack_s'] + stats['upload_s']:.1f}s"
        + (f"; tagged {tag}" if tag else ""),
        file=sys.stderr,
    )
    print(f"uri: {ref.uri}\ndigest: {art.model_digest}")
    return 0
