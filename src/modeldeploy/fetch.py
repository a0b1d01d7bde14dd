"""`modeldeploy fetch URL DIR --digest sha256:...`: the model init container. Torch-free.

URL is either a directory listing served as `URL/manifest.txt` (lines `path:sha256`, as
`modeldeploy digest --manifest` prints) whose files are fetched one by one, a single
tar archive (`.tar`, `.tar.gz`, `.tgz`) unpacked into DIR, or an OCI artifact
`oci://REGISTRY/REPO@sha256:...` (as `modeldeploy model push` prints) pulled by digest with every
blob verified while it streams, unpacked into a staging directory and moved into DIR only once the
files match (`modeldeploy.oci.pull`: the fallback where the cluster lacks image volumes). Either
way DIR must then match the pinned model digest, or the command fails and the pod never starts
serving unverified weights; an OCI failure names its cause (`ArtifactDigestMismatch: blob ...`).
"""

from __future__ import annotations

import argparse
import re
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

import httpx

from modeldeploy.digest import DigestMismatch, verify

TIMEOUT = httpx.Timeout(30.0, read=300.0)
MAX_FILES = 100_000
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def _safe_rel(path: str) -> Path:
    p = PurePosixPath(path)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise ValueError(f"unsafe path in manifest: {path!r}")
    return Path(*p.parts)


def _download(c: httpx.Client, url: str, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with c.stream("GET", url) as r:
        r.raise_for_status()
        with open(dest, "wb") as f:
            for chunk in r.iter_bytes(1 << 20):
                f.write(chunk)


def fetch(url: str, out: Path, digest: str) -> dict[str, str] | None:
    """Download into `out`; returns the expected manifest when one was published."""
    out.mkdir(parents=True, exist_ok=True)
    with httpx.Client(timeout=TIMEOUT, follow_redirects=True) as c:
        if url.endswith((".tar", ".tar.gz", ".tgz")):
            with tempfile.TemporaryDirectory() as tmp:
                archive = Path(tmp) / "model.tar"
                _download(c, url, archive)
                with tarfile.open(archive) as tar:
                    tar.extractall(out, filter="data")  # refuses absolute paths, links out of DIR, devices
            return None
        base = url.rstrip("/")
        r = c.get(f"{base}/manifest.txt")
        r.raise_for_status()
        known: dict[str, str] = {}
        for line in r.text.splitlines()[:MAX_FILES]:
            if line.strip() and not line.startswith("sha256:"):
                path, _, sha = line.strip().rpartition(":")
                known[path] = sha
        for path in known:
            _download(c, f"{base}/{path}", out / _safe_rel(path))
        return known


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "url",
        help="http(s) URL (a directory with manifest.txt, or a .tar/.tar.gz archive) "
        "or oci://REGISTRY/REPO@sha256:<64 hex>",
    )
    parser.add_argument("dir", help="directory to write the model into")
    parser.add_argument("--digest", required=True, help="expected sha256 manifest digest (sha256:<64 hex>)")
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="oci://: plain HTTP to a non-loopback registry (loopback registries always use HTTP)",
    )


def _fetch_oci(args: argparse.Namespace) -> int:
    # imported here: the http(s) path stays as small as it was
    from modeldeploy.oci import ArtifactError, OciRefError, parse_oci_uri
    from modeldeploy.oci.pull import pull

    try:
        ref = parse_oci_uri(args.url)
    except OciRefError as e:
        print(f"fetch: {e}", file=sys.stderr)
        return 2
    try:
        fresh = pull(ref, Path(args.dir), args.digest, args.insecure, log=lambda m: print(m, file=sys.stderr))
    except (ArtifactError, ValueError, tarfile.TarError, OSError, httpx.HTTPError) as e:
        # ArtifactDigestMismatch (a ValueError) names the blob, manifest or model that differs
        print(f"fetch: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(f"{'fetched' if fresh else 'already present:'} {ref.uri} into {args.dir}: {args.digest} verified")
    return 0


def main(args: argparse.Namespace) -> int:
    if not _DIGEST_RE.match(args.digest):
        print(f"fetch: --digest must be sha256:<64 lower-case hex>, got {args.digest!r}", file=sys.stderr)
        return 2
    if args.url.startswith("oci://"):
        return _fetch_oci(args)
    if not args.url.startswith(("http://", "https://")):
        print(f"fetch: URL must be http://, https:// or oci://, got {args.url!r}", file=sys.stderr)
        return 2
    try:
        known = fetch(args.url, Path(args.dir), args.digest)
        verify(args.dir, args.digest, known)
    except (httpx.HTTPError, ValueError, tarfile.TarError, OSError) as e:
        # DigestMismatch is a ValueError: the message names the differing files
        kind = "digest mismatch" if isinstance(e, DigestMismatch) else type(e).__name__
        print(f"fetch: {kind}: {e}", file=sys.stderr)
        return 1
    print(f"fetched {args.url} into {args.dir}: {args.digest} verified")
    return 0
