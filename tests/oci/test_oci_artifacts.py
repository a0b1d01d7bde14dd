"""`modeldeploy model push` and `modeldeploy fetch oci://...` against a real registry (distribution v3).

The registry is the real-node lane's (`make cluster-build` builds it), started per module on
127.0.0.1:<free port> with its storage in a temp dir, so the corrupt cases can edit blobs on disk.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from modeldeploy.cli import main as cli
from modeldeploy.digest import dir_digest
from modeldeploy.oci import MODEL_DIGEST_ANNOTATION, parse_oci_uri
from modeldeploy.oci.artifact import (
    CONFIG_MEDIA_TYPE,
    LAYER_MEDIA_TYPE,
    MANIFEST_MEDIA_TYPE,
    canonical_json,
    pack,
)
from modeldeploy.oci.pull import STAGING, pull
from modeldeploy.oci.registry import RegistryClient
from modeldeploy_dev.cluster.local import cache_root, pinned_versions
from modeldeploy_dev.cluster.realnode.node import NodeBinaries
from modeldeploy_dev.cluster.realnode.registry import Registry

REGISTRY_BIN = NodeBinaries(cache_root(), pinned_versions()).registry
pytestmark = pytest.mark.skipif(
    not REGISTRY_BIN.exists(), reason=f"no registry binary at {REGISTRY_BIN}: run make real-node-build"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    root = tmp_path_factory.mktemp("registry")
    reg = Registry(REGISTRY_BIN, root / "storage", root / "run", _free_port())
    reg.up()
    try:
        yield reg
    finally:
        reg.down()


def _blob_file(reg: Registry, digest: str) -> Path:
    hexd = digest.split(":", 1)[1]
    return reg.storage / "docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"


def _push(capsys: pytest.CaptureFixture[str], src: Path, target: str) -> tuple[str, str]:
    capsys.readouterr()
    assert cli(["model", "push", str(src), target]) == 0, capsys.readouterr().err
    lines = dict(line.split(": ", 1) for line in capsys.readouterr().out.strip().splitlines())
    return lines["uri"], lines["digest"]


def _fetch(capsys: pytest.CaptureFixture[str], uri: str, out: Path, digest: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = cli(["fetch", uri, str(out), "--digest", digest])
    got = capsys.readouterr()
    return rc, got.out + got.err


def _unique_model(tmp: Path, name: str) -> Path:
    """A small model-shaped directory with its own bytes (blobs are shared across repositories)."""
    d = tmp / name
    (d / "sub").mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"name": name}))
    (d / "sub" / "tokenizer.json").write_text("{}")
    (d / "model.safetensors").write_bytes(os.urandom(300_000))
    return d


def _assert_nothing_usable(out: Path) -> None:
    files = [p for p in out.rglob("*") if p.is_file()] if out.exists() else []
    assert not files, f"a failed fetch left files behind: {files}"


def test_push_is_reproducible_and_pulls_back_identical(registry, llama_dir, tmp_path, capsys) -> None:
    uri, model_digest = _push(capsys, llama_dir, f"{registry.host}/models/tiny:v1")
    assert model_digest == dir_digest(llama_dir)
    ref = parse_oci_uri(uri)
    assert ref.registry == registry.host and ref.repository == "models/tiny"
    # the same directory again, and a copy with other mtimes and modes: the same manifest digest
    assert _push(capsys, llama_dir, f"{registry.host}/models/tiny") == (uri, model_digest)
    copy = tmp_path / "copy"
    shutil.copytree(llama_dir, copy)
    for p in copy.rglob("*"):
        os.utime(p, (1_000_000, 1_000_000))
        p.chmod(0o600 if p.is_file() else 0o700)
    assert _push(capsys, copy, f"{registry.host}/models/tiny-copy")[0].split("@")[1] == ref.digest
    assert pack(llama_dir).digest == ref.digest

    rc, err = _fetch(capsys, uri, tmp_path / "out", model_digest)
    assert rc == 0, err
    assert dir_digest(tmp_path / "out") == model_digest
    assert not (tmp_path / "out" / STAGING).exists()
    # a second fetch into the verified directory downloads nothing
    rc, said = _fetch(capsys, uri, tmp_path / "out", model_digest)
    assert rc == 0 and "already present" in said and "layer 1/" not in said


def test_layout_is_a_plain_image_one_layer_per_safetensors(registry, llama_dir) -> None:
    art = pack(llama_dir)
    with RegistryClient(registry.host) as c:
        c.upload_blob("layout/check", art.config_digest, len(art.config), lambda: [art.config])
        for la in art.layers:
            c.upload_blob("layout/check", la.digest, la.size, la.chunks)
        c.put_manifest("layout/check", art.digest, art.manifest, MANIFEST_MEDIA_TYPE)
        man = json.loads(c.get_manifest("layout/check", art.digest))
    assert man["mediaType"] == MANIFEST_MEDIA_TYPE and man["config"]["mediaType"] == CONFIG_MEDIA_TYPE
    assert man["annotations"] == {MODEL_DIGEST_ANNOTATION: dir_digest(llama_dir)}
    shards = sorted(p.name for p in llama_dir.glob("*.safetensors"))
    assert shards and len(man["layers"]) == 1 + len(shards)
    assert {la["mediaType"] for la in man["layers"]} == {LAYER_MEDIA_TYPE}
    config = json.loads(art.config)
    assert config["os"] == "linux" and config["rootfs"]["diff_ids"] == [la["digest"] for la in man["layers"]]
    # the layers are tars whose paths are the model directory's own, at the image root
    names = []
    for la in art.layers:
        blob = _blob_file(registry, la.digest)
        with tarfile.open(blob) as t:
            members = t.getmembers()
            assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 for m in members)
            names += [m.name for m in members if m.isfile()]
    assert sorted(names) == sorted(
        p.relative_to(llama_dir).as_posix() for p in llama_dir.rglob("*") if p.is_file()
    )


def test_blob_modified_in_the_registry_fails_naming_the_blob(registry, tmp_path, capsys) -> None:
    uri, model_digest = _push(capsys, _unique_model(tmp_path, "tampered"), f"{registry.host}/models/tampered")
    man = json.loads(RegistryClient(registry.host).get_manifest("models/tampered", uri.split("@")[1]))
    weights = man["layers"][-1]["digest"]
    blob = _blob_file(registry, weights)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one bit pattern changed: only the digest can tell
    blob.write_bytes(bytes(data))
    rc, err = _fetch(capsys, uri, tmp_path / "out", model_digest)
    assert rc == 1
    assert f"ArtifactDigestMismatch: blob {weights} got sha256:" in err and "modified in the registry" in err
    _assert_nothing_usable(tmp_path / "out")


def test_truncated_blob_fails_naming_the_byte_count(registry, tmp_path, capsys) -> None:
    uri, model_digest = _push(
        capsys, _unique_model(tmp_path, "truncated"), f"{registry.host}/models/truncated"
    )
    man = json.loads(RegistryClient(registry.host).get_manifest("models/truncated", uri.split("@")[1]))
    weights = man["layers"][-1]
    blob = _blob_file(registry, weights["digest"])
    with open(blob, "r+b") as f:
        f.truncate(weights["size"] // 3)
    rc, err = _fetch(capsys, uri, tmp_path / "out", model_digest)
    assert rc == 1
    assert f"ArtifactDigestMismatch: blob {weights['digest']}: truncated, got " in err
    assert f"of {weights['size']} bytes" in err
    _assert_nothing_usable(tmp_path / "out")


def test_uri_of_another_model_fails_before_downloading(registry, tmp_path, capsys) -> None:
    _, pinned = _push(capsys, _unique_model(tmp_path, "model-a"), f"{registry.host}/models/a")
    other_uri, other = _push(capsys, _unique_model(tmp_path, "model-b"), f"{registry.host}/models/b")
    rc, err = _fetch(capsys, other_uri, tmp_path / "out", pinned)
    assert rc == 1
    assert f"ArtifactDigestMismatch: manifest {other_uri.split('@')[1]} is model {other}" in err
    assert f"the bundle pins model {pinned}" in err and "layer 1/" not in err
    _assert_nothing_usable(tmp_path / "out")


def test_manifest_whose_annotation_lies_fails_on_the_files(registry, tmp_path, capsys) -> None:
    """A manifest claiming model A over model B's layers: every blob is intact, the files are not A."""
    _, pinned = _push(capsys, _unique_model(tmp_path, "real-a"), f"{registry.host}/models/liar")
    b_uri, b_digest = _push(capsys, _unique_model(tmp_path, "real-b"), f"{registry.host}/models/liar")
    with RegistryClient(registry.host) as c:
        man = json.loads(c.get_manifest("models/liar", b_uri.split("@")[1]))
        man["annotations"][MODEL_DIGEST_ANNOTATION] = pinned
        raw = canonical_json(man)
        liar = c.put_manifest("models/liar", "liar", raw, MANIFEST_MEDIA_TYPE)
    rc, err = _fetch(capsys, f"oci://{registry.host}/models/liar@{liar}", tmp_path / "out", pinned)
    assert rc == 1
    liar_uri = f"oci://{registry.host}/models/liar@{liar}"
    assert f"ArtifactDigestMismatch: model files of {liar_uri} have digest {b_digest}" in err
    assert f"the bundle pins {pinned}" in err
    _assert_nothing_usable(tmp_path / "out")


def test_leftover_staging_is_removed_and_foreign_files_are_named(registry, tmp_path, capsys) -> None:
    src = _unique_model(tmp_path, "leftover")
    uri, model_digest = _push(capsys, src, f"{registry.host}/models/leftover")
    out = tmp_path / "out"
    (out / STAGING / "sub").mkdir(parents=True)
    (out / STAGING / "sub" / "half.bin").write_bytes(b"x")  # what a killed fetch leaves
    assert pull(parse_oci_uri(uri), out, model_digest) is True
    assert dir_digest(out) == model_digest and not (out / STAGING).exists()
    assert pull(parse_oci_uri(uri), out, model_digest) is False  # verified in place: nothing pulled
    (out / "sub" / "mine.txt").write_text("not in the artifact")  # in a directory the artifact has
    (out / "config.json").write_text("stale")
    rc, err = _fetch(capsys, uri, out, model_digest)
    assert rc == 1 and "also holds files the artifact does not: sub/mine.txt" in err
    assert (out / "sub" / "mine.txt").read_text() == "not in the artifact"  # named, never deleted
    assert (out / "config.json").read_bytes() == (src / "config.json").read_bytes()
    assert dir_digest(out) != model_digest


def test_quiet_push_prints_the_uri_alone_and_platform_is_checked(registry, tmp_path, capsys) -> None:
    src = _unique_model(tmp_path, "quiet")
    assert cli(["model", "push", "-q", str(src), f"{registry.host}/models/quiet"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == parse_oci_uri(out.strip()).uri and out.count("\n") == 1
    assert cli(["model", "push", "--platform", "amd64", str(src), f"{registry.host}/models/quiet"]) == 2
    assert "--platform 'amd64' must be OS/ARCH" in capsys.readouterr().err
    assert pack(src, "linux/arm64").digest != pack(src).digest  # the platform is in the config


def test_bad_arguments_are_refused(registry, llama_dir, tmp_path, capsys) -> None:
    d = "sha256:" + "0" * 64
    assert cli(["fetch", f"oci://{registry.host}/models/tiny:v1", str(tmp_path / "o"), "--digest", d]) == 2
    assert "pinned by digest" in capsys.readouterr().err
    assert (
        cli(["fetch", f"oci://{registry.host}/models/tiny@{d}", str(tmp_path / "o"), "--digest", "abc"]) == 2
    )
    assert "--digest" in capsys.readouterr().err
    assert cli(["model", "push", str(llama_dir), "models/tiny"]) == 2
    assert "not a registry host" in capsys.readouterr().err
    assert cli(["model", "push", str(tmp_path / "nope"), f"{registry.host}/models/x"]) == 2
    assert "not a directory" in capsys.readouterr().err
    rc, err = _fetch(capsys, f"oci://{registry.host}/models/tiny@{d}", tmp_path / "o2", d)
    assert rc == 1 and "no manifest" in err and "404" in err


@pytest.mark.slow
def test_real_model_round_trip(registry, real_model_dir, tmp_path, capsys) -> None:
    uri, model_digest = _push(capsys, real_model_dir, f"{registry.host}/models/smollm2:135m")
    assert model_digest == dir_digest(real_model_dir)
    rc, err = _fetch(capsys, uri, tmp_path / "out", model_digest)
    assert rc == 0, err
    assert dir_digest(tmp_path / "out") == model_digest


def _put_image(reg: Registry, repo: str, layers: list[tuple[str, bytes]], annotations: dict | None) -> str:
    """An image built by hand, as another tool would: (media type, blob) layers, a minimal config."""

    def sha(b: bytes) -> str:
        return "sha256:" + hashlib.sha256(b).hexdigest()

    config = canonical_json(
        {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}
    )
    man: dict = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": sha(config), "size": len(config)},
        "layers": [{"mediaType": m, "digest": sha(b), "size": len(b)} for m, b in layers],
    }
    if annotations:
        man["annotations"] = annotations
    with RegistryClient(reg.host) as c:
        for blob in [config, *(b for _, b in layers)]:
            c.upload_blob(repo, sha(blob), len(blob), lambda b=blob: [b])
        return c.put_manifest(repo, sha(canonical_json(man)), canonical_json(man), MANIFEST_MEDIA_TYPE)


def _tar(files: dict[str, bytes], gz: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w") as t:
        for name, data in files.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def test_gzip_image_from_another_tool_pulls_and_verifies_without_annotation(
    registry, tmp_path, capsys
) -> None:
    src = _unique_model(tmp_path, "foreign")
    files = {p.relative_to(src).as_posix(): p.read_bytes() for p in src.rglob("*") if p.is_file()}
    layers = [
        ("application/vnd.oci.image.layer.v1.tar+gzip", _tar({"config.json": files["config.json"]}, gz=True)),
        (
            "application/vnd.oci.image.layer.v1.tar",
            _tar({k: v for k, v in files.items() if k != "config.json"}),
        ),
    ]
    digest = _put_image(registry, "models/foreign", layers, None)
    rc, said = _fetch(
        capsys, f"oci://{registry.host}/models/foreign@{digest}", tmp_path / "out", dir_digest(src)
    )
    assert rc == 0, said
    assert dir_digest(tmp_path / "out") == dir_digest(src)


def test_layers_that_delete_or_are_not_tar_are_refused(registry, tmp_path, capsys) -> None:
    digest = _put_image(
        registry, "models/whiteout", [(LAYER_MEDIA_TYPE, _tar({"sub/.wh.config.json": b""}))], None
    )
    rc, said = _fetch(
        capsys, f"oci://{registry.host}/models/whiteout@{digest}", tmp_path / "o1", "sha256:" + "1" * 64
    )
    assert rc == 1 and "whiteout 'sub/.wh.config.json'" in said
    _assert_nothing_usable(tmp_path / "o1")
    digest = _put_image(registry, "models/blobs", [("application/vnd.example.weights", b"raw weights")], None)
    rc, said = _fetch(
        capsys, f"oci://{registry.host}/models/blobs@{digest}", tmp_path / "o2", "sha256:" + "1" * 64
    )
    assert rc == 1 and "media type 'application/vnd.example.weights'" in said


def test_a_stream_of_unknown_digest_uploads_hashed_on_the_way(registry) -> None:
    """upload_stream (what the real-node tests push docker save's layers with): chunks of a size
    no one knew in advance, committed under the digest computed while sending; the registry
    stores exactly those bytes, and blob_size and has_blob see them."""
    data = [os.urandom(1 << 20), os.urandom(12345), b"", os.urandom(3)]
    whole = b"".join(data)
    with RegistryClient(registry.host) as rc:
        rc.authorize("streams/one", "pull,push")
        digest, size = rc.upload_stream("streams/one", iter(data))
        assert (digest, size) == ("sha256:" + hashlib.sha256(whole).hexdigest(), len(whole))
        assert rc.blob_size("streams/one", digest) == len(whole) and rc.has_blob("streams/one", digest)
        with rc.open_blob("streams/one", digest) as chunks:
            assert b"".join(chunks) == whole
        assert rc.blob_size("streams/one", "sha256:" + "2" * 64) is None
    assert _blob_file(registry, digest).read_bytes() == whole


def test_plain_http_only_for_loopback_or_insecure() -> None:
    assert RegistryClient("127.0.0.1:5000").base == "http://127.0.0.1:5000"
    assert RegistryClient("registry.example:5000").base == "https://registry.example:5000"
    assert RegistryClient("registry.example:5000", insecure=True).base == "http://registry.example:5000"


# --- a registry behind token auth: distribution's `auth.token` with a token server of our own that
# --- checks docker-style Basic credentials and signs RS256 JWTs with openssl (as docker's auth does)

USER, PASSWORD = "alice", "s3cret"


def _b64url(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


class _TokenServer:
    def __init__(self, key: Path, cert_der: bytes, service: str) -> None:
        self.scopes: list[tuple[str | None, str]] = []
        parent = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def do_GET(self) -> None:
                q = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                auth = self.headers.get("Authorization")
                good = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
                parent.scopes.append((auth and auth.split()[0], q.get("scope", [""])[0]))
                if auth != good:
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                access = []
                for sc in q.get("scope", []):
                    typ, name, actions = sc.split(":")
                    access.append({"type": typ, "name": name, "actions": actions.split(",")})
                body = json.dumps({"token": parent.sign(access, q["service"][0])}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.key, self.cert_der, self.service = key, cert_der, service
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.realm = f"http://127.0.0.1:{self.srv.server_address[1]}/token"

    def sign(self, access: list[dict], aud: str) -> str:
        now = int(time.time())
        header = {"alg": "RS256", "typ": "JWT", "x5c": [base64.b64encode(self.cert_der).decode()]}
        claims = {"iss": "modeldeploy-test", "sub": USER, "aud": aud, "exp": now + 300, "nbf": now - 10}
        claims |= {"iat": now, "jti": os.urandom(8).hex(), "access": access}
        msg = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        sig = subprocess.run(
            ["openssl", "dgst", "-sha256", "-sign", str(self.key)],
            input=msg.encode(),
            capture_output=True,
            check=True,
        ).stdout
        return f"{msg}.{_b64url(sig)}"


class _AuthRegistry(Registry):
    def __init__(self, *a, tokens: _TokenServer, cert: Path, **k) -> None:
        super().__init__(*a, **k)
        self.tokens, self.cert = tokens, cert

    def config(self) -> str:
        return super().config() + (
            f"auth:\n  token:\n    realm: {self.tokens.realm}\n    service: {self.tokens.service}\n"
            f"    issuer: modeldeploy-test\n    rootcertbundle: {self.cert}\n"
        )

    def healthy(self) -> bool:
        try:
            return httpx.get(f"http://{self.host}/v2/", timeout=2).status_code == 401  # up, and asking
        except httpx.HTTPError:
            return False


@pytest.fixture(scope="module")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_AuthRegistry]:
    if not shutil.which("openssl"):
        pytest.skip("openssl is needed to sign the test token server's JWTs")
    root = tmp_path_factory.mktemp("auth-registry")
    key, cert = root / "key.pem", root / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert)]
        + ["-days", "2", "-subj", "/CN=modeldeploy-test"],
        check=True,
        capture_output=True,
    )
    der = subprocess.run(
        ["openssl", "x509", "-in", str(cert), "-outform", "DER"], check=True, capture_output=True
    ).stdout
    tokens = _TokenServer(key, der, "modeldeploy-test-registry")
    reg = _AuthRegistry(REGISTRY_BIN, root / "storage", root / "run", _free_port(), tokens=tokens, cert=cert)
    reg.up()
    try:
        yield reg
    finally:
        reg.down()
        tokens.srv.shutdown()


def _docker_config(tmp: Path, host: str, password: str) -> Path:
    d = tmp / "docker"
    d.mkdir(exist_ok=True)
    auth = base64.b64encode(f"{USER}:{password}".encode()).decode()
    (d / "config.json").write_text(json.dumps({"auths": {host: {"auth": auth}}}))
    return d


def test_push_and_fetch_with_docker_config_credentials(auth_registry, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(_docker_config(tmp_path, auth_registry.host, PASSWORD)))
    src = _unique_model(tmp_path, "authed")
    uri, model_digest = _push(capsys, src, f"{auth_registry.host}/models/authed:v1")
    rc, said = _fetch(capsys, uri, tmp_path / "out", model_digest)
    assert rc == 0, said
    assert dir_digest(tmp_path / "out") == model_digest
    seen = set(auth_registry.tokens.scopes)
    assert ("Basic", "repository:models/authed:pull,push") in seen and (
        "Basic",
        "repository:models/authed:pull",
    ) in seen


def test_missing_or_wrong_credentials_are_named(auth_registry, tmp_path, capsys, monkeypatch) -> None:
    src = _unique_model(tmp_path, "denied")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "nowhere"))
    assert cli(["model", "push", str(src), f"{auth_registry.host}/models/denied"]) == 1
    err = capsys.readouterr().err
    assert "HTTP 401, refused anonymously" in err and f"no `auths` entry for {auth_registry.host}" in err
    monkeypatch.setenv("DOCKER_CONFIG", str(_docker_config(tmp_path, auth_registry.host, "wrong")))
    assert cli(["model", "push", str(src), f"{auth_registry.host}/models/denied"]) == 1
    err = capsys.readouterr().err
    assert "HTTP 401, refused with the credentials from" in err and str(tmp_path / "docker") in err


def test_an_expired_token_is_renewed_and_the_request_resent(auth_registry, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(_docker_config(tmp_path, auth_registry.host, PASSWORD)))
    blob = b"resent after a 401"
    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    with RegistryClient(auth_registry.host) as c:
        c._auth = "Bearer expired"  # what a long upload's token looks like once it lapsed
        c.upload_blob("models/renew", digest, len(blob), lambda: [blob])
        assert c._auth != "Bearer expired" and c.has_blob("models/renew", digest)
