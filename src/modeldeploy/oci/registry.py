"""The few calls of the OCI distribution API that push and pull a model artifact (httpx, no torch).

Push: HEAD a blob (skip it when the registry has it), POST an upload session, PUT the blob
monolithically with `?digest=` (streamed from disk, never held in memory), PUT the manifest by
digest (and by tag, for people). Pull: GET the manifest by digest, GET each blob as a stream.
Plain HTTP for loopback registries (as docker and containerd assume) or with `insecure=True`;
HTTPS otherwise. Registry credentials (docker config.json, bearer tokens) are not supported yet:
a 401 says so.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from urllib.parse import urljoin

import httpx

from modeldeploy.oci import ArtifactError, is_loopback

TIMEOUT = httpx.Timeout(30.0, read=300.0, write=300.0)
MANIFEST_ACCEPT = ", ".join(
    [
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.index.v1+json",
    ]
)
MAX_MANIFEST_BYTES = 4 << 20


class RegistryClient:
    """One registry host; `repo` is passed per call."""

    def __init__(self, registry: str, insecure: bool = False, timeout: httpx.Timeout = TIMEOUT) -> None:
        scheme = "http" if insecure or is_loopback(registry) else "https"
        self.registry = registry
        self.base = f"{scheme}://{registry}"
        self.client = httpx.Client(timeout=timeout, follow_redirects=True)

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def _url(self, repo: str, kind: str, ref: str) -> str:
        return f"{self.base}/v2/{repo}/{kind}/{ref}"

    def _check(self, r: httpx.Response, what: str) -> None:
        if r.status_code < 400:
            return
        if r.status_code == 401:
            raise ArtifactError(
                f"registry {self.registry}: {what} needs credentials (HTTP 401); "
                "registry authentication is not supported yet: use a registry that allows this anonymously"
            )
        body = r.read()[:300].decode(errors="replace")
        raise ArtifactError(f"registry {self.registry}: {what}: HTTP {r.status_code} {body}".rstrip())

    def has_blob(self, repo: str, digest: str) -> bool:
        r = self.client.head(self._url(repo, "blobs", digest))
        if r.status_code == 404:
            return False
        self._check(r, f"HEAD blob {digest}")
        return True

    def upload_blob(self, repo: str, digest: str, size: int, chunks: Iterable[bytes]) -> None:
        """Monolithic upload: POST a session, then PUT all `size` bytes with the digest."""
        r = self.client.post(f"{self.base}/v2/{repo}/blobs/uploads/", headers={"Content-Length": "0"})
        self._check(r, f"start upload of {digest}")
        location = r.headers.get("Location")
        if not location:
            raise ArtifactError(f"registry {self.registry}: upload of {digest} gave no Location header")
        url = urljoin(f"{self.base}/", location)
        # the session's own query (`_state`) stays: httpx's params= would replace it
        url += ("&" if "?" in url else "?") + f"digest={digest}"
        r = self.client.put(
            url,
            content=iter(chunks),
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
        )
        self._check(r, f"PUT blob {digest} ({size} bytes)")

    def put_manifest(self, repo: str, ref: str, body: bytes, media_type: str) -> str:
        r = self.client.put(
            self._url(repo, "manifests", ref), content=body, headers={"Content-Type": media_type}
        )
        self._check(r, f"PUT manifest {ref}")
        return r.headers.get("Docker-Content-Digest", "")

    def get_manifest(self, repo: str, digest: str) -> bytes:
        with self.client.stream(
            "GET", self._url(repo, "manifests", digest), headers={"Accept": MANIFEST_ACCEPT}
        ) as r:
            if r.status_code == 404:
                raise ArtifactError(f"registry {self.registry}: no manifest {repo}@{digest} (HTTP 404)")
            self._check(r, f"GET manifest {digest}")
            body = b""
            for chunk in r.iter_raw():
                body += chunk
                if len(body) > MAX_MANIFEST_BYTES:
                    raise ArtifactError(f"manifest {digest} is larger than {MAX_MANIFEST_BYTES} bytes")
            return body

    @contextlib.contextmanager
    def open_blob(self, repo: str, digest: str) -> Iterator[Iterator[bytes]]:
        """The blob's raw bytes as they arrive (no content decoding: they are what the digest covers)."""
        with self.client.stream("GET", self._url(repo, "blobs", digest)) as r:
            if r.status_code == 404:
                raise ArtifactError(
                    f"registry {self.registry}: blob {digest} of {repo} is missing (HTTP 404)"
                )
            self._check(r, f"GET blob {digest}")
            yield r.iter_raw(1 << 20)
