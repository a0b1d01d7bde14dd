"""The operator's gate credential (operator/controller/gatekey.py) and the runtime's check of it."""

from __future__ import annotations

import hashlib

import pytest

from modeldeploy.operator.controller.gatekey import ENV, GateKey


def test_tokens_are_per_object_and_the_digest_is_their_sha256() -> None:
    k = GateKey(b"k" * 32)
    a = k.token("ns", "chat", "uid-1")
    assert a == k.token("ns", "chat", "uid-1") and len(a) == 64
    # another object, the same name recreated (new uid), another namespace, another operator key
    others = {
        k.token("ns", "other", "uid-1"),
        k.token("ns", "chat", "uid-2"),
        k.token("ns2", "chat", "uid-1"),
    }
    others.add(GateKey(b"j" * 32).token("ns", "chat", "uid-1"))
    assert a not in others and len(others) == 4
    assert k.digest("ns", "chat", "uid-1") == hashlib.sha256(a.encode()).hexdigest() != a


def test_from_env_unset_short_and_set() -> None:
    assert GateKey.from_env({}) is None and GateKey.from_env({ENV: "  "}) is None
    with pytest.raises(ValueError, match=f"env {ENV}: at least 32 characters, got 5"):
        GateKey.from_env({ENV: "short"})
    assert GateKey.from_env({ENV: "x" * 40}) == GateKey(b"x" * 40)


def test_operator_cli_refuses_a_short_gate_key_naming_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from modeldeploy.cli import main

    monkeypatch.setenv(ENV, "too-short")
    with pytest.raises(SystemExit, match=f"modeldeploy operator: env {ENV}: at least 32 characters"):
        main(["operator", "--standalone"])
