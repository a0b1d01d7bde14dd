"""`modeldeploy fetch` (the model init container) against a real local HTTP server."""

from __future__ import annotations

import functools
import http.server
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from modeldeploy.cli import main as cli
from modeldeploy.digest import dir_digest, manifest


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path, str]]:
    src = tmp_path / "www" / "model"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text('{"a": 1}')
    (src / "sub" / "weights.bin").write_bytes(bytes(range(256)) * 64)
    digest = dir_digest(src)
    (src.parent / "model.tar.gz").touch()
    with tarfile.open(src.parent / "model.tar.gz", "w:gz") as t:
        for p in sorted(src.rglob("*")):
            if p.is_file():
                t.add(p, arcname=p.relative_to(src).as_posix())
    (src / "manifest.txt").write_text("".join(f"{p}:{s}\n" for p, s in manifest(src).items()))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(src.parent))
    handler.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", tmp_path, digest
    finally:
        srv.shutdown()
        srv.server_close()


def test_fetch_manifest_directory_verifies_digest(served, capsys) -> None:
    base, tmp, digest = served
    assert cli(["fetch", f"{base}/model", str(tmp / "out"), "--digest", digest]) == 0
    assert (tmp / "out" / "sub" / "weights.bin").read_bytes() == bytes(range(256)) * 64
    assert "verified" in capsys.readouterr().out


def test_fetch_tarball(served) -> None:
    base, tmp, digest = served
    assert cli(["fetch", f"{base}/model.tar.gz", str(tmp / "out2"), "--digest", digest]) == 0
    assert dir_digest(tmp / "out2") == digest


def test_fetch_wrong_digest_fails_naming_mismatch(served, capsys) -> None:
    base, tmp, _ = served
    wrong = "sha256:" + "0" * 64
    assert cli(["fetch", f"{base}/model.tar.gz", str(tmp / "out3"), "--digest", wrong]) == 1
    assert "digest mismatch" in capsys.readouterr().err


def test_fetch_missing_url_fails(served, capsys) -> None:
    base, tmp, digest = served
    assert cli(["fetch", f"{base}/nope", str(tmp / "out4"), "--digest", digest]) == 1
    assert "404" in capsys.readouterr().err


def test_fetch_rejects_non_http(tmp_path, capsys) -> None:
    assert cli(["fetch", "file:///etc", str(tmp_path / "o"), "--digest", "sha256:" + "0" * 64]) == 2
    assert "http" in capsys.readouterr().err
