"""The few calls of the OCI distribution API that push and pull a model artifact (httpx, no torch).

Push: HEAD a blob (skip it when the registry has it), POST an upload session, PUT the blob
monolithically with `?digest=` (streamed from disk, never held in memory), PUT the manifest by
digest (and by tag, for people). Bytes whose digest is not known up front (a piped tar) go as one
streamed PATCH, hashed on the way, and a PUT with the digest computed. Pull: GET the manifest by
digest, GET each blob as a stream.
Plain HTTP for loopback registries (as docker and containerd assume) or with `insecure=True`;
HTTPS otherwise.

Credentials: the registry's challenge (`WWW-Authenticate` on `GET /v2/`) is answered up front, so
streamed requests carry them: `Basic` with the user and password, `Bearer` with a token from the
challenge's realm for `repository:REPO:pull[,push]` (anonymous when no credentials are found,
as public registries hand out pull tokens). The user and password come from docker's config.json
(`$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`; what `docker login` and a
`kubernetes.io/dockerconfigjson` Secret hold), `auths` entries only: credential helpers
(`credsStore`, `credHelpers`) are not run.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
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


def docker_config_path() -> Path:
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"


def docker_credentials(registry: str, path: Path | None = None) -> tuple[str, str] | None:
    """(user, password) for `registry` from docker's config.json `auths`, or None when it has none."""
    path = path or docker_config_path()
    if not path.is_file():
        return None
    try:
        auths = json.loads(path.read_text()).get("auths") or {}
    except (OSError, ValueError, AttributeError) as e:
        raise ArtifactError(f"{path}: not a docker config.json ({e})") from e
    for key in (registry, f"https://{registry}", f"http://{registry}", f"https://{registry}/v2/"):
        entry = auths.get(key)
        if not isinstance(entry, dict):
            continue
        if entry.get("auth"):
            try:
                user, sep, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except ValueError as e:
                raise ArtifactError(f"{path}: auths[{key!r}].auth is not base64 of user:password") from e
            if sep:
                return user, password
        if entry.get("username"):
            return str(entry["username"]), str(entry.get("password", ""))
    return None


def _with_digest(url: str, digest: str) -> str:
    """An upload session URL with `digest=` added (its own `_state` query stays: httpx's params=
    would replace it)."""
    return url + ("&" if "?" in url else "?") + f"digest={digest}"


class RegistryClient:
    """One registry host; `repo` is passed per call."""

    def __init__(
        self,
        registry: str,
        insecure: bool = False,
        timeout: httpx.Timeout = TIMEOUT,
        credentials: tuple[str, str] | None = None,
    ) -> None:
        scheme = "http" if insecure or is_loopback(registry) else "https"
        self.registry = registry
        self.base = f"{scheme}://{registry}"
        self.client = httpx.Client(timeout=timeout, follow_redirects=True)  # drops Authorization off-host
        self._credentials = credentials
        self._auth: str | None = None  # the Authorization header value, once a challenge is answered

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def _url(self, repo: str, kind: str, ref: str) -> str:
        return f"{self.base}/v2/{repo}/{kind}/{ref}"

    def _check(self, r: httpx.Response, what: str) -> None:
        if r.status_code < 400:
            return
        if r.status_code in (401, 403):
            who = (
                "with the credentials from " + str(docker_config_path())
                if self._creds()
                else f"anonymously (no `auths` entry for {self.registry} in {docker_config_path()})"
            )
            raise ArtifactError(f"registry {self.registry}: {what}: HTTP {r.status_code}, refused {who}")
        body = r.read()[:300].decode(errors="replace")
        raise ArtifactError(f"registry {self.registry}: {what}: HTTP {r.status_code} {body}".rstrip())

    def _creds(self) -> tuple[str, str] | None:
        if self._credentials is None:
            self._credentials = docker_credentials(self.registry) or ("", "")
        return self._credentials if self._credentials[0] else None

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {**(extra or {}), **({"Authorization": self._auth} if self._auth else {})}

    def authorize(self, repo: str, actions: str) -> None:
        """Answer the registry's challenge before any streamed request (a stream cannot be resent)."""
        r = self.client.get(f"{self.base}/v2/", headers=self._headers())
        if r.status_code == 401:
            self._answer(r, repo, actions)
        elif r.status_code >= 400:
            self._check(r, "GET /v2/")

    def _answer(self, r: httpx.Response, repo: str, actions: str) -> None:
        scheme, _, rest = r.headers.get("WWW-Authenticate", "").partition(" ")
        params = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        creds = self._creds()
        if scheme.lower() == "basic":
            if not creds:
                self._check(r, "authenticate")
            user, password = creds or ("", "")
            self._auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
            return
        if scheme.lower() != "bearer" or "realm" not in params:
            raise ArtifactError(f"registry {self.registry}: unsupported challenge {scheme} {rest!r}")
        query = {"scope": f"repository:{repo}:{actions}"}
        if "service" in params:
            query["service"] = params["service"]
        tr = self.client.get(params["realm"], params=query, auth=creds)
        self._check(tr, f"token for {query['scope']} from {params['realm']}")
        try:
            body = tr.json()
            token = body.get("token") or body.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not token:
            raise ArtifactError(f"registry {self.registry}: token server {params['realm']} gave no token")
        self._auth = f"Bearer {token}"

    def _request(
        self,
        method: str,
        url: str,
        repo: str,
        actions: str,
        content: bytes | Callable[[], Iterable[bytes]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        """Send; on a 401 (no token yet, or one that expired) answer the challenge and resend once."""
        r = None
        for attempt in range(2):
            body = iter(content()) if callable(content) else content
            r = self.client.request(method, url, content=body, headers=self._headers(headers))
            if r.status_code != 401 or attempt:
                break
            self._answer(r, repo, actions)
        assert r is not None
        return r

    def has_blob(self, repo: str, digest: str) -> bool:
        return self.blob_size(repo, digest) is not None

    def blob_size(self, repo: str, digest: str) -> int | None:
        """The blob's size in bytes, or None when `repo` has no such blob."""
        r = self._request("HEAD", self._url(repo, "blobs", digest), repo, "pull,push")
        if r.status_code == 404:
            return None
        self._check(r, f"HEAD blob {digest}")
        return int(r.headers.get("Content-Length", "0"))

    def upload_blob(self, repo: str, digest: str, size: int, chunks: Callable[[], Iterable[bytes]]) -> None:
        """Monolithic upload: POST a session, then PUT all `size` bytes with the digest.

        `chunks` makes the byte stream (called again if the PUT must be resent after a 401)."""
        url = _with_digest(self._start_upload(repo, f"upload of {digest}"), digest)
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        r = self._request("PUT", url, repo, "pull,push", chunks, headers)
        self._check(r, f"PUT blob {digest} ({size} bytes)")

    def upload_stream(self, repo: str, chunks: Iterable[bytes]) -> tuple[str, int]:
        """Upload bytes whose digest is not known before they are read (a tar piped from another
        program): one PATCH streams them, hashed on the way, and the PUT commits that digest,
        which the registry checks against what it stored. Returns (digest, size). Call
        `authorize` first: a stream cannot be resent after a 401."""
        url = self._start_upload(repo, "streamed upload")
        h, size = hashlib.sha256(), 0

        def hashed() -> Iterator[bytes]:
            nonlocal size
            for chunk in chunks:
                h.update(chunk)
                size += len(chunk)
                yield chunk

        headers = self._headers({"Content-Type": "application/octet-stream"})
        r = self.client.patch(url, content=hashed(), headers=headers)
        self._check(r, f"PATCH streamed upload ({size} bytes)")
        digest = "sha256:" + h.hexdigest()
        url = self._location(r, f"streamed upload of {digest}")
        r = self.client.put(_with_digest(url, digest), headers=self._headers())
        self._check(r, f"PUT blob {digest} ({size} bytes)")
        return digest, size

    def _start_upload(self, repo: str, what: str) -> str:
        """POST an upload session; its URL."""
        r = self._request("POST", f"{self.base}/v2/{repo}/blobs/uploads/", repo, "pull,push", b"")
        self._check(r, f"start {what}")
        return self._location(r, what)

    def _location(self, r: httpx.Response, what: str) -> str:
        location = r.headers.get("Location")
        if not location:
            raise ArtifactError(f"registry {self.registry}: {what} gave no Location header")
        return urljoin(f"{self.base}/", location)

    def put_manifest(self, repo: str, ref: str, body: bytes, media_type: str) -> str:
        url = self._url(repo, "manifests", ref)
        r = self._request("PUT", url, repo, "pull,push", body, {"Content-Type": media_type})
        self._check(r, f"PUT manifest {ref}")
        return r.headers.get("Docker-Content-Digest", "")

    def get_manifest(self, repo: str, digest: str) -> bytes:
        with self.client.stream(
            "GET", self._url(repo, "manifests", digest), headers=self._headers({"Accept": MANIFEST_ACCEPT})
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
        with self.client.stream("GET", self._url(repo, "blobs", digest), headers=self._headers()) as r:
            if r.status_code == 404:
                raise ArtifactError(
                    f"registry {self.registry}: blob {digest} of {repo} is missing (HTTP 404)"
                )
            self._check(r, f"GET blob {digest}")
            yield r.iter_raw(1 << 20)
