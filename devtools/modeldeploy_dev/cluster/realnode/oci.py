"""Push an OCI image layout tar (build-node.sh's, or `docker save`'s) to a registry over the
distribution HTTP API, and return the reference by digest that a pod spec pins.

Monolithic blob uploads (POST, then PUT ?digest=) and a manifest PUT by digest: the smallest
part of the API every registry implements. Blobs the registry already has are skipped.
"""

from __future__ import annotations

import json
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import IO


def _member(t: tarfile.TarFile, name: str) -> IO[bytes]:
    for candidate in (name, f"./{name}"):
        try:
            f = t.extractfile(candidate)
        except KeyError:
            continue
        if f is not None:
            return f
    raise ValueError(f"{t.name}: no {name} (not an OCI image layout tar)")


def _request(
    method: str,
    url: str,
    data: bytes | IO[bytes] | None = None,
    headers: dict | None = None,
    length: int | None = None,
) -> tuple[int, dict[str, str]]:
    h = dict(headers or {})
    if length is not None:
        h["Content-Length"] = str(length)
    req = urllib.request.Request(url, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, dict(r.headers)
    except urllib.error.HTTPError as e:
        if method == "HEAD" and e.code == 404:
            return 404, {}
        raise RuntimeError(f"registry {method} {url}: HTTP {e.code} {e.read()[:300]!r}") from e


def push_layout(tar_path: Path, host: str, repo: str, tag: str | None = None) -> str:
    """Push the first manifest of the layout's index.json to http://host/repo; returns
    `host/repo@sha256:...`. `tag`, when given, is also pointed at it (for people, not pods)."""
    base = f"http://{host}/v2/{repo}"
    with tarfile.open(tar_path) as t:
        index = json.load(_member(t, "index.json"))
        desc = index["manifests"][0]
        digest = desc["digest"]
        raw = _member(t, f"blobs/sha256/{digest.split(':', 1)[1]}").read()
        manifest = json.loads(raw)
        media = manifest.get("mediaType") or desc["mediaType"]
        if "layers" not in manifest:
            raise ValueError(f"{tar_path}: {digest} is {media}, not a single-platform image manifest")
        for blob in [manifest["config"], *manifest["layers"]]:
            d = blob["digest"]
            if _request("HEAD", f"{base}/blobs/{d}")[0] == 200:
                continue
            _, hdr = _request("POST", f"{base}/blobs/uploads/", b"", length=0)
            loc = urllib.parse.urljoin(f"http://{host}/", hdr["Location"])
            sep = "&" if "?" in loc else "?"
            body = _member(t, f"blobs/sha256/{d.split(':', 1)[1]}")
            _request(
                "PUT",
                f"{loc}{sep}digest={d}",
                body,
                {"Content-Type": "application/octet-stream"},
                length=blob["size"],
            )
        for ref in [digest, *([tag] if tag else [])]:
            _request("PUT", f"{base}/manifests/{ref}", raw, {"Content-Type": media}, length=len(raw))
    return f"{host}/{repo}@{digest}"
