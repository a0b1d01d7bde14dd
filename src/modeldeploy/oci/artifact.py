"""Pack a model directory as an OCI image whose filesystem is the model directory. Standard library only.

Format (the one both consumers accept):
- an OCI image manifest (`application/vnd.oci.image.manifest.v1+json`) with a standard image config
  (`application/vnd.oci.image.config.v1+json`) and uncompressed tar layers
  (`application/vnd.oci.image.layer.v1.tar`). Kubernetes image volumes (KEP-4639, beta and on by
  default since v1.35) mount "the OCI object ... in a single directory by merging the manifest layers
  in the same way as for container images": containerd unpacks image layers only, so the weights must
  be a plain image, not an ORAS-style artifact with custom media types. The files therefore sit at the
  image's root (`config.json`, `model.safetensors`), and the volume's `mountPath` is the model
  directory. Any registry, `crane`, `skopeo` and `oras` handle such an image as it is.
- uncompressed layers: float weights barely compress (a few %), gzip would cost CPU on every push and
  on every node's pull, and an uncompressed layer's digest is its diff_id, so nothing else to pin.
- one layer per large file (every `*.safetensors`, and any file of 64 MiB or more) and one layer for
  all the small files (config, tokenizer, chat template): a layer is the unit a registry and a node
  store, deduplicate and pull in parallel, so a new tokenizer or template re-uploads a few MB and two
  revisions that share a weight shard share its blob on the node; the small files together are one
  round trip instead of one per file.
- reproducible: files in sorted order, mtime 0, uid/gid 0, no user names, modes 0644/0755, canonical
  JSON, no timestamps: the same directory gives the same layer, config and manifest digests.
- the config's platform is `linux/amd64` unless told otherwise (`--platform`): the bytes do not depend
  on it, but a config names one, and containerd checks it against the node's when it comes from an
  index; a single manifest (what we push) is taken as it is.
- the manifest's annotation `io.modeldeploy.model.digest` carries `modeldeploy digest DIR`.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from modeldeploy.digest import manifest, manifest_digest
from modeldeploy.oci import MODEL_DIGEST_ANNOTATION

MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
# layers a puller unpacks: ours, and those of images made by other tools
TAR_LAYER_MEDIA_TYPES = {
    LAYER_MEDIA_TYPE: "r|",
    "application/vnd.oci.image.layer.v1.tar+gzip": "r|gz",
    "application/vnd.docker.image.rootfs.diff.tar.gzip": "r|gz",
    "application/vnd.docker.image.rootfs.diff.tar": "r|",
}
LARGE_FILE_BYTES = 64 << 20
CHUNK = 1 << 20
_BLOCK = tarfile.BLOCKSIZE
_RECORD = tarfile.RECORDSIZE


def canonical_json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _header(name: str, size: int, is_dir: bool) -> bytes:
    ti = tarfile.TarInfo(name)
    ti.type = tarfile.DIRTYPE if is_dir else tarfile.REGTYPE
    ti.size = 0 if is_dir else size
    ti.mode = 0o755 if is_dir else 0o644  # readable by the runtime's non-root user
    ti.mtime = 0
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    # PAX adds an extended header only for names USTAR cannot hold: a pure function of the name
    return ti.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _pad(n: int, to: int) -> int:
    return -n % to


@dataclass
class Layer:
    """One tar layer: the files (relative POSIX paths) it holds, and its digest once hashed."""

    root: Path
    files: list[str]
    digest: str = ""
    size: int = 0
    _dirs: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        parents = {p for f in self.files for p in _parents(f)}
        self._dirs = sorted(parents)

    def _entries(self) -> list[tuple[str, Path | None]]:
        # each parent directory before the files: tar readers need no implicit mkdir
        items: list[tuple[str, Path | None]] = [(d, None) for d in self._dirs]
        items += [(f, self.root / f) for f in self.files]
        return sorted(items, key=lambda e: e[0])

    def chunks(self) -> Iterator[bytes]:
        """The layer's bytes, streamed (a weight file is never held in memory or copied to disk)."""
        total = 0
        for name, path in self._entries():
            if path is None:
                h = _header(name + "/", 0, True)
                total += len(h)
                yield h
                continue
            size = path.stat().st_size
            h = _header(name, size, False)
            total += len(h)
            yield h
            done = 0
            with open(path, "rb") as f:
                while chunk := f.read(min(CHUNK, size - done)):
                    done += len(chunk)
                    yield chunk
            if done != size:
                raise OSError(f"{path} changed size while being packed ({size} -> {done} bytes)")
            pad = _pad(size, _BLOCK)
            total += size + pad
            yield b"\0" * pad
        end = 2 * _BLOCK
        end += _pad(total + end, _RECORD)
        yield b"\0" * end

    def hash(self) -> None:
        h = hashlib.sha256()
        n = 0
        for chunk in self.chunks():
            h.update(chunk)
            n += len(chunk)
        self.digest, self.size = "sha256:" + h.hexdigest(), n

    def descriptor(self) -> dict[str, object]:
        return {"mediaType": LAYER_MEDIA_TYPE, "digest": self.digest, "size": self.size}


def _parents(rel: str) -> list[str]:
    parts = rel.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


@dataclass
class Artifact:
    """A packed model directory: layers (streamable), config and manifest bytes, and both digests."""

    layers: list[Layer]
    config: bytes
    manifest: bytes
    model_digest: str

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.manifest).hexdigest()

    @property
    def config_digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.config).hexdigest()

    @property
    def size(self) -> int:
        return sum(la.size for la in self.layers) + len(self.config) + len(self.manifest)


def plan_layers(root: Path, files: list[str]) -> list[Layer]:
    """The small files in one layer (first), then one layer per large file, in path order."""
    large = [f for f in files if f.endswith(".safetensors") or (root / f).stat().st_size >= LARGE_FILE_BYTES]
    small = [f for f in files if f not in set(large)]
    return [Layer(root, group) for group in ([small] if small else []) + [[f] for f in large]]


def pack(root: str | Path, platform: str = "linux/amd64") -> Artifact:
    """Hash a model directory into an artifact (reads every file twice: model digest, layers)."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"{root} is not a directory")
    os_, _, arch = platform.partition("/")
    if not os_ or not arch:
        raise ValueError(f"--platform {platform!r} must be OS/ARCH, e.g. linux/amd64")
    files = manifest(root)  # the same file set `modeldeploy digest` covers (no .git, .cache)
    if not files:
        raise ValueError(f"{root} holds no files to push")
    layers = plan_layers(root, sorted(files))
    for layer in layers:
        layer.hash()
    arch, _, variant = arch.partition("/")
    config_obj: dict[str, object] = {
        "architecture": arch,
        "os": os_,
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": [la.digest for la in layers]},
    }
    if variant:
        config_obj["variant"] = variant
    config = canonical_json(config_obj)
    model_digest = manifest_digest(files)
    man = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {
            "mediaType": CONFIG_MEDIA_TYPE,
            "digest": "sha256:" + hashlib.sha256(config).hexdigest(),
            "size": len(config),
        },
        "layers": [la.descriptor() for la in layers],
        "annotations": {MODEL_DIGEST_ANNOTATION: model_digest},
    }
    return Artifact(layers, config, canonical_json(man), model_digest)
