"""`modeldeploy fetch URL DIR --digest sha256:...`: the model init container. Torch-free.

URL is either a directory listing served as `URL/manifest.txt` (lines `path:sha256`, as
`modeldeploy digest --manifest` prints) whose files are fetched one by one, or a single
tar archive (`.tar`, `.tar.gz`, `.tgz`) unpacked into DIR. Either way DIR must then match
the pinned digest, or the command fails and the pod never starts serving unverified weights.
"""

from __future__ import annotations

import argparse
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

import httpx

from modeldeploy.digest import DigestMismatch, verify

TIMEOUT = httpx.Timeout(30.0, read=300.0)
MAX_FILES = 100_000


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
    parser.add_argument("url", help="http(s) URL: a directory with manifest.txt, or a .tar/.tar.gz archive")
    parser.add_argument("dir", help="directory to write the model into")
    parser.add_argument("--digest", required=True, help="expected sha256 manifest digest (sha256:<64 hex>)")


def main(args: argparse.Namespace) -> int:
    if not args.url.startswith(("http://", "https://")):
        print(f"fetch: URL must be http:// or https://, got {args.url!r}", file=sys.stderr)
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
