"""Pull a model artifact by digest into a directory, verifying every byte on the way (no torch).

Used by `modeldeploy fetch oci://...` (the init-container fallback where image volumes are not
available). Order of checks, each failing with `ArtifactDigestMismatch` naming the cause:
1. the manifest's bytes hash to the URI's digest;
2. its `io.modeldeploy.model.digest` annotation, when present, is the bundle's model digest
   (a manifest pointing at another model fails before a byte of weights is downloaded);
3. each layer's bytes hash to, and are exactly as long as, its descriptor (hashed while streaming
   into tar extraction; a short blob names the byte count it stopped at);
4. the unpacked files hash to the bundle's model digest (the annotation is a claim; this is proof).
Everything is unpacked into `DIR/.modeldeploy-partial/` first and moved into DIR only after 1-4
pass, so a failure (or a kill) never leaves a directory that could pass for a complete model: the
staging directory is removed on failure, and if a kill leaves it behind the model digest over DIR
does not match (it counts those files) until the next fetch removes it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import httpx

from modeldeploy.digest import _SKIP_DIRS, manifest, manifest_digest
from modeldeploy.oci import MODEL_DIGEST_ANNOTATION, ArtifactDigestMismatch, ArtifactError, OciRef
from modeldeploy.oci.artifact import TAR_LAYER_MEDIA_TYPES
from modeldeploy.oci.registry import RegistryClient

STAGING = ".modeldeploy-partial"
MAX_LAYERS = 1000


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class _HashingReader:
    """A file-like view of a blob stream that hashes and counts every byte tarfile reads."""

    def __init__(self, chunks: Iterator[bytes], digest: str, size: int) -> None:
        self._chunks = chunks
        self._buf = bytearray()
        self._pos = 0  # bytes of _buf already read: slicing from the front would copy it per read
        self._h = hashlib.sha256()
        self.expected_digest = digest
        self.expected_size = size
        self.count = 0
        self.error: Exception | None = None

    def _more(self) -> bool:
        try:
            chunk = next(self._chunks)
        except StopIteration:
            return False
        except httpx.HTTPError as e:  # the connection ended before Content-Length: a short blob
            self.error = e
            return False
        self._h.update(chunk)
        self.count += len(chunk)
        if self.count > self.expected_size:
            raise ArtifactDigestMismatch(
                f"blob {self.expected_digest}: the registry sent more than the {self.expected_size} bytes "
                "its descriptor pins"
            )
        self._buf += chunk
        return True

    def read(self, n: int = -1) -> bytes:
        while (n < 0 or len(self._buf) - self._pos < n) and self._more():
            pass
        end = len(self._buf) if n < 0 else min(len(self._buf), self._pos + n)
        out = bytes(self._buf[self._pos : end])
        self._pos = end
        if self._pos >= 1 << 20:
            del self._buf[: self._pos]
            self._pos = 0
        return out

    def drain(self) -> None:
        while self._more():
            self._buf.clear()
            self._pos = 0

    def check(self) -> None:
        """Raise ArtifactDigestMismatch unless the whole blob arrived with its pinned digest."""
        if self.count != self.expected_size:
            why = f" ({type(self.error).__name__}: {self.error})" if self.error else ""
            raise ArtifactDigestMismatch(
                f"blob {self.expected_digest}: truncated, got {self.count} of {self.expected_size} bytes{why}"
            )
        got = "sha256:" + self._h.hexdigest()
        if got != self.expected_digest:
            raise ArtifactDigestMismatch(f"blob {self.expected_digest} got {got}: modified in the registry")


def _member_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    if PurePosixPath(member.name).name.startswith(".wh."):
        raise ArtifactError(
            f"layer has whiteout {member.name!r}: a model artifact's layers may only add files"
        )
    return tarfile.data_filter(member, dest)  # no absolute paths, no links out of DIR, no devices


def _unpack_layer(client: RegistryClient, ref: OciRef, desc: dict[str, Any], staging: Path) -> None:
    media, digest, size = desc.get("mediaType"), desc.get("digest"), desc.get("size")
    if media not in TAR_LAYER_MEDIA_TYPES:
        raise ArtifactError(
            f"layer {digest} has media type {media!r}; a model artifact's layers are tar image layers"
        )
    if not isinstance(digest, str) or not digest.startswith("sha256:") or not isinstance(size, int):
        raise ArtifactError(f"layer descriptor {desc!r} lacks a sha256 digest or a size")
    with client.open_blob(ref.repository, digest) as chunks:
        reader = _HashingReader(chunks, digest, size)
        try:
            with tarfile.open(fileobj=reader, mode=TAR_LAYER_MEDIA_TYPES[media]) as tar:  # type: ignore[call-overload]
                tar.extractall(staging, filter=_member_filter)
            reader.drain()
        except (tarfile.TarError, EOFError) as e:  # not OSError: a full disk says so itself
            reader.drain()
            reader.check()  # a short or modified blob is the cause, not the tar error it led to
            raise ArtifactError(f"layer {digest} cannot be unpacked: {type(e).__name__}: {e}") from e
        reader.check()


def _read_manifest(client: RegistryClient, ref: OciRef, model_digest: str) -> dict[str, Any]:
    raw = client.get_manifest(ref.repository, ref.digest)
    got = _sha(raw)
    if got != ref.digest:
        raise ArtifactDigestMismatch(f"manifest {ref.digest} got {got}: the registry served other bytes")
    try:
        man = json.loads(raw)
    except ValueError as e:
        raise ArtifactError(f"manifest {ref.digest} is not JSON: {e}") from e
    if not isinstance(man, dict) or "layers" not in man:
        kind = man.get("mediaType") if isinstance(man, dict) else type(man).__name__
        raise ArtifactError(
            f"{ref.uri} is {kind}, not an image manifest: pin one manifest's digest, not an index"
        )
    claimed = (man.get("annotations") or {}).get(MODEL_DIGEST_ANNOTATION)
    if claimed is not None and claimed != model_digest:
        raise ArtifactDigestMismatch(
            f"manifest {ref.digest} is model {claimed} ({MODEL_DIGEST_ANNOTATION}), "
            f"the bundle pins model {model_digest}: the URI points at a different model"
        )
    if not isinstance(man["layers"], list) or not 0 < len(man["layers"]) <= MAX_LAYERS:
        raise ArtifactError(f"manifest {ref.digest} must list 1..{MAX_LAYERS} layers")
    return man


def _verify_staged(staging: Path, ref: OciRef, model_digest: str) -> dict[str, str]:
    files = manifest(staging)
    got = manifest_digest(files)
    if got != model_digest:
        listing = ", ".join(f"{p}:{s[:12]}" for p, s in files.items())
        raise ArtifactDigestMismatch(
            f"model files of {ref.uri} have digest {got}, the bundle pins {model_digest}: "
            f"the artifact holds a different model (files: {listing})"
        )
    return files


def _files_under(root: Path) -> set[str]:
    out = set()
    for p in root.rglob("*"):
        rel = p.relative_to(root)
        if rel.parts[0] != STAGING and not any(x in _SKIP_DIRS for x in rel.parts) and p.is_file():
            out.add(rel.as_posix())
    return out


def _merge(src: Path, dst: Path) -> None:
    """Move src's entries into dst: files replace files of the same name (an interrupted move's),
    directories merge, so nothing the artifact does not name is ever deleted."""
    for entry in sorted(src.iterdir()):
        target = dst / entry.name
        if entry.is_dir() and not entry.is_symlink() and target.is_dir() and not target.is_symlink():
            _merge(entry, target)
            entry.rmdir()
            continue
        if target.is_dir() and not target.is_symlink():
            raise ArtifactError(f"{target} is a directory; the artifact has a file there")
        entry.replace(target)  # same filesystem: atomic per entry


def _move_into(staging: Path, out: Path, files: dict[str, str]) -> None:
    """Move the verified files into DIR, then refuse a DIR that also holds files the model has not."""
    _merge(staging, out)
    staging.rmdir()
    foreign = sorted(_files_under(out) - set(files))
    if foreign:
        raise ArtifactError(
            f"{out} also holds files the artifact does not: {', '.join(foreign[:10])}; remove them"
        )


def pull(
    ref: OciRef,
    out: Path,
    model_digest: str,
    insecure: bool = False,
    log: Callable[[str], None] = lambda m: None,
) -> bool:
    """Pull `ref` into `out` and verify it; False when `out` already held the verified model."""
    out.mkdir(parents=True, exist_ok=True)
    staging = out / STAGING
    if staging.exists():
        shutil.rmtree(staging)  # a killed fetch's leftovers: ours by name
    if any(out.iterdir()) and manifest_digest(manifest(out)) == model_digest:
        log(f"{out} already holds model {model_digest}")
        return False
    staging.mkdir()
    try:
        with RegistryClient(ref.registry, insecure=insecure) as client:
            client.authorize(ref.repository, "pull")
            man = _read_manifest(client, ref, model_digest)
            for i, desc in enumerate(man["layers"]):
                log(f"layer {i + 1}/{len(man['layers'])}: {desc.get('digest')} ({desc.get('size')} bytes)")
                _unpack_layer(client, ref, desc, staging)
        files = _verify_staged(staging, ref, model_digest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _move_into(staging, out, files)
    return True
