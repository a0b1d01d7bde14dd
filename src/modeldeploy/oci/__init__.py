"""Model weights as OCI artifacts: `oci://REGISTRY/REPO@sha256:<64 hex>` URIs.

This module is the one parser of those URIs and imports only the standard library (and the
torch-free `modeldeploy.digest`): the operator calls `parse_oci_uri` at apply time to refuse a
tag, and turns `OciRef.reference` into an image volume's `reference`. The packing
(`modeldeploy.oci.artifact`), the registry client (`modeldeploy.oci.registry`, httpx) and the
push command (`modeldeploy.oci.push`) live in submodules the operator never needs to import.

Two digests, two things:
- the registry digest (in the URI) is sha256 over the artifact's manifest JSON, which names its
  config and layer blobs by their own sha256: it pins the bytes a registry serves;
- the model digest (`bundle.model.digest`, `modeldeploy digest DIR`) is sha256 over the sorted
  `path:sha256` lines of the files: it pins what the runtime loads, however they were shipped.
`modeldeploy model push` records the model digest in the manifest annotation
`io.modeldeploy.model.digest`, so the registry digest pins the model digest too; a puller still
verifies the unpacked files against the bundle's model digest, since an annotation is a claim.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from modeldeploy.digest import DigestMismatch

SCHEME = "oci://"
MODEL_DIGEST_ANNOTATION = "io.modeldeploy.model.digest"

# distribution's reference grammar (github.com/distribution/reference), lower-case repositories only
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_HOST = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:]+\])"
_REGISTRY_RE = re.compile(rf"^{_HOST}(?::[0-9]{{1,5}})?$")
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPO_RE = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_PORT = r"(?::[0-9]{1,5})?"
_NAMED_HOST = rf"(?:{_LABEL}(?:\.{_LABEL})+{_PORT}|{_LABEL}:[0-9]{{1,5}}|localhost|\[[0-9A-Fa-f:]+\]{_PORT})"
# The same acceptance as parse_oci_uri, as one RE2-compatible pattern (no lookaround): for an API
# field's `pattern` or a CEL `matches()` rule, so apply refuses what the parser would.
URI_PATTERN = rf"^oci://{_NAMED_HOST}/{_COMPONENT}(?:/{_COMPONENT})*@sha256:[0-9a-f]{{64}}$"


class OciRefError(ValueError):
    """An `oci://` URI or push target that is malformed or not pinned by digest."""


class ArtifactError(RuntimeError):
    """A registry or artifact problem that is not about digests (missing blob, bad media type)."""


class ArtifactDigestMismatch(DigestMismatch):
    """Bytes from the registry, or the files they unpack to, differ from what was pinned."""


@dataclass(frozen=True)
class OciRef:
    """A model artifact pinned by its manifest digest."""

    registry: str  # host[:port]
    repository: str
    digest: str  # sha256:<64 hex>, the manifest's

    @property
    def reference(self) -> str:
        """`REGISTRY/REPO@sha256:...`: what a pod's `volumes[].image.reference` takes."""
        return f"{self.registry}/{self.repository}@{self.digest}"

    @property
    def uri(self) -> str:
        return f"{SCHEME}{self.reference}"


def _split_registry(rest: str, what: str) -> tuple[str, str]:
    registry, sep, path = rest.partition("/")
    if not sep or not path:
        raise OciRefError(f"{what} {rest!r} must be REGISTRY/REPO (e.g. 127.0.0.1:5000/models/smollm2)")
    looks_like_host = "." in registry or ":" in registry or registry == "localhost"
    if not looks_like_host or not _REGISTRY_RE.match(registry):
        raise OciRefError(
            f"{what} {rest!r}: {registry!r} is not a registry host (host[:port], e.g. ghcr.io or "
            "127.0.0.1:5000); there is no default registry"
        )
    return registry, path


def _check_repo(repo: str, what: str) -> None:
    if not _REPO_RE.match(repo) or len(repo) > 255:
        raise OciRefError(
            f"{what}: repository {repo!r} must be lower-case path components [a-z0-9] joined by . _ - /"
        )


def parse_oci_uri(uri: str) -> OciRef:
    """`oci://REGISTRY/REPO@sha256:<64 hex>` -> OciRef; a tag (`:v1`) is refused, as it can move.

    The operator calls this for `bundle.model.uri` / adapter URIs; the message names the problem.
    """
    if not uri.startswith(SCHEME):
        raise OciRefError(f"{uri!r} is not an oci:// URI (oci://REGISTRY/REPO@sha256:<64 hex>)")
    named, at, digest = uri[len(SCHEME) :].partition("@")
    registry, name = _split_registry(named, "oci:// URI")
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        tag = last.split(":", 1)[1]
        hint = "drop the tag" if at else "pin the digest `modeldeploy model push` printed"
        raise OciRefError(
            f"oci:// URI {uri!r} names tag {tag!r}: a model must be pinned by digest, "
            f"oci://{registry}/{name.rsplit(':', 1)[0]}@sha256:<64 hex> ({hint}; a tag can move)"
        )
    if not at:
        raise OciRefError(
            f"oci:// URI {uri!r} has no digest: a model must be pinned as oci://REGISTRY/REPO@sha256:<64 hex>"
        )
    _check_repo(name, f"oci:// URI {uri!r}")
    if not _DIGEST_RE.match(digest):
        raise OciRefError(f"oci:// URI {uri!r}: digest {digest!r} must be sha256:<64 lower-case hex>")
    return OciRef(registry, name, digest)


def parse_push_target(target: str) -> tuple[str, str, str | None]:
    """`REGISTRY/REPO[:TAG]` -> (registry, repository, tag or None) for `modeldeploy model push`."""
    if target.startswith(SCHEME):
        target = target[len(SCHEME) :]
    if "@" in target:
        raise OciRefError(
            f"push target {target!r}: the digest is computed by the push; give REGISTRY/REPO[:TAG]"
        )
    registry, path = _split_registry(target, "push target")
    tag: str | None = None
    head, _, last = path.rpartition("/")
    if ":" in last:
        last, tag = last.split(":", 1)
        if not _TAG_RE.match(tag):
            raise OciRefError(
                f"push target {target!r}: tag {tag!r} must match [A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}"
            )
    repo = f"{head}/{last}" if head else last
    _check_repo(repo, f"push target {target!r}")
    return registry, repo, tag


def is_loopback(registry: str) -> bool:
    """Loopback registries speak plain HTTP (as docker and containerd assume); others need --insecure."""
    host = registry.split("]")[0].lstrip("[") if registry.startswith("[") else registry.rsplit(":", 1)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback  # `127.evil.example` is a name, not loopback
    except ValueError:
        return False
