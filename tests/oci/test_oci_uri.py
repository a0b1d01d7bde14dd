"""`oci://REGISTRY/REPO@sha256:...` model URIs: the one parser the operator and `fetch` share."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from modeldeploy.oci import URI_PATTERN, OciRef, OciRefError, is_loopback, parse_oci_uri, parse_push_target

D = "sha256:" + "ab" * 32


def test_digest_pinned_uri_parses() -> None:
    ref = parse_oci_uri(f"oci://127.0.0.1:5000/models/smollm2@{D}")
    assert ref == OciRef("127.0.0.1:5000", "models/smollm2", D)
    assert ref.reference == f"127.0.0.1:5000/models/smollm2@{D}"
    assert ref.uri == f"oci://127.0.0.1:5000/models/smollm2@{D}"
    assert parse_oci_uri(f"oci://ghcr.io/org/team/model-x_1.2@{D}").repository == "org/team/model-x_1.2"


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("oci://ghcr.io/org/model:v1", ["tag 'v1'", "pinned by digest", "oci://ghcr.io/org/model@sha256"]),
        (f"oci://ghcr.io/org/model:v1@{D}", ["tag 'v1'", "drop the tag"]),
        ("oci://ghcr.io/org/model", ["no digest"]),
        ("oci://ghcr.io/org/model@sha256:abc", ["sha256:<64 lower-case hex>"]),
        (f"oci://ghcr.io/org/model@sha512:{'a' * 128}", ["sha256:<64"]),
        (f"oci://org/model@{D}", ["not a registry host", "no default registry"]),
        (f"oci://ghcr.io@{D}", ["REGISTRY/REPO"]),
        (f"oci://ghcr.io/Org/Model@{D}", ["lower-case"]),
        (f"http://ghcr.io/org/model@{D}", ["not an oci:// URI"]),
    ],
)
def test_bad_uris_are_refused_naming_the_problem(uri: str, words: list[str]) -> None:
    with pytest.raises(OciRefError) as e:
        parse_oci_uri(uri)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


GOOD = [
    f"oci://127.0.0.1:5000/models/smollm2@{D}",
    f"oci://localhost/m@{D}",
    f"oci://localhost:5000/a/b/c@{D}",
    f"oci://ghcr.io/org/team/model-x_1.2@{D}",
    f"oci://[::1]:5000/m@{D}",
    f"oci://registry.kube-system.svc.cluster.local:5000/models/x__y@{D}",
]
BAD = [
    "oci://ghcr.io/org/model:v1",
    f"oci://ghcr.io/org/model:v1@{D}",
    "oci://ghcr.io/org/model",
    "oci://ghcr.io/org/model@sha256:abc",
    f"oci://org/model@{D}",
    f"oci://ghcr.io@{D}",
    f"oci://ghcr.io/Org/Model@{D}",
    f"oci://ghcr.io/org//model@{D}",
    f"oci://ghcr.io/org/-model@{D}",
    f"oci://-bad.io/org/model@{D}",
    f"http://ghcr.io/org/model@{D}",
]


def test_api_pattern_accepts_exactly_what_the_parser_accepts() -> None:
    for uri in GOOD:
        assert parse_oci_uri(uri).uri == uri and re.match(URI_PATTERN, uri), uri
    for uri in BAD:
        with pytest.raises(OciRefError):
            parse_oci_uri(uri)
        assert not re.match(URI_PATTERN, uri), uri


def test_push_targets() -> None:
    assert parse_push_target("127.0.0.1:5000/models/tiny:v1") == ("127.0.0.1:5000", "models/tiny", "v1")
    assert parse_push_target("localhost:5000/tiny") == ("localhost:5000", "tiny", None)
    assert parse_push_target("oci://ghcr.io/org/m") == ("ghcr.io", "org/m", None)
    for bad, word in [
        ("models/tiny", "registry host"),
        (f"ghcr.io/org/m@{D}", "computed by the push"),
        ("ghcr.io/org/m:bad tag", "tag"),
        ("ghcr.io/org/M", "lower-case"),
    ]:
        with pytest.raises(OciRefError, match=word):
            parse_push_target(bad)


def test_loopback_means_plain_http() -> None:
    assert is_loopback("127.0.0.1:5000") and is_loopback("localhost:5000") and is_loopback("[::1]:5000")
    assert (
        not is_loopback("ghcr.io")
        and not is_loopback("10.0.0.1:5000")
        and not is_loopback("127.0.0.1.nip.io")
    )


def test_parser_module_stays_light() -> None:
    """The operator imports the parser: it must not pull httpx, torch or the runtime."""
    code = (
        "import sys, modeldeploy.oci\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'httpx') "
        "or m.startswith('modeldeploy.runtime')]\n"
        "print(','.join(bad)); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
