"""Bundle digests: sha256 over a sorted manifest of `path:sha256` lines.

Torch-free on purpose: the operator, the `fetch` init container and the runtime
all verify the same digest.
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

_SKIP_DIRS = {".git", ".cache", "__pycache__"}


class DigestMismatch(ValueError):
    """Raised when a directory does not match its pinned digest."""


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def manifest(root: str | Path) -> dict[str, str]:
    """Relative POSIX path -> sha256 hex of every regular file under `root`."""
    root = Path(root)
    out: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if any(part in _SKIP_DIRS for part in rel.parts) or not p.is_file():
            continue
        out[rel.as_posix()] = file_sha256(p)
    return out


def manifest_digest(files: dict[str, str]) -> str:
    text = "".join(f"{path}:{sha}\n" for path, sha in sorted(files.items()))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def dir_digest(root: str | Path) -> str:
    return manifest_digest(manifest(root))


def verify(root: str | Path, expected: str, known: dict[str, str] | None = None) -> None:
    """Raise DigestMismatch naming the file(s) that differ when `known` lists them.

    `known` is an optional expected manifest (path -> sha256); without it the error
    lists the directory's manifest so the operator can see what was actually there.
    """
    files = manifest(root)
    actual = manifest_digest(files)
    if actual == expected:
        return
    if known is not None:
        bad = sorted(p for p in set(files) | set(known) if files.get(p) != known.get(p))
        raise DigestMismatch(
            f"digest mismatch for {root}: expected {expected}, got {actual}; "
            f"differing files: {', '.join(bad)}"
        )
    listing = ", ".join(f"{p}:{s[:12]}" for p, s in files.items())
    raise DigestMismatch(f"digest mismatch for {root}: expected {expected}, got {actual}; files: {listing}")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="model or tokenizer directory")
    parser.add_argument("--manifest", action="store_true", help="also print the path:sha256 lines")


def main(args: argparse.Namespace) -> int:
    files = manifest(args.path)
    if args.manifest:
        for p, s in files.items():
            print(f"{p}:{s}")
    print(manifest_digest(files))
    return 0
