"""`modeldeploy model push` and `modeldeploy fetch oci://...` against a real registry (distribution v3).

The registry is the real-node lane's (`make cluster-build` builds it), started per module on
127.0.0.1:<free port> with its storage in a temp dir, so the corrupt cases can edit blobs on disk.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import socket
import tarfile
from collections.abc import Iterator
from pathlib import Path

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
    not REGISTRY_BIN.exists(), reason=f"no registry binary at {REGISTRY_BIN}: run make cluster-build"
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
        c.upload_blob("layout/check", art.config_digest, len(art.config), [art.config])
        for la in art.layers:
            c.upload_blob("layout/check", la.digest, la.size, la.chunks())
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
    (out / "stray.txt").write_text("not in the artifact")
    rc, err = _fetch(capsys, uri, out, model_digest)
    assert rc == 1 and "also holds files the artifact does not: stray.txt" in err


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
            c.upload_blob(repo, sha(blob), len(blob), [blob])
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


def test_plain_http_only_for_loopback_or_insecure() -> None:
    assert RegistryClient("127.0.0.1:5000").base == "http://127.0.0.1:5000"
    assert RegistryClient("registry.example:5000").base == "https://registry.example:5000"
    assert RegistryClient("registry.example:5000", insecure=True).base == "http://registry.example:5000"
