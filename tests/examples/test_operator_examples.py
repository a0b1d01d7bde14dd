"""The examples pin the digest of `make example-model`'s output (SmolLM2-135M-Instruct imported from
its pinned wheel, modeldeploy_dev.real_model); keep them in step. That the import reproduces the
digest is tests/runtime/models/test_gguf_import.py's job (it needs the model)."""

from __future__ import annotations

from pathlib import Path

import yaml

from modeldeploy_dev.real_model import MODEL_DIGEST, NAME, REVISION

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_URI = f"file:///var/lib/modeldeploy/models/{NAME}"  # the Makefile's EXAMPLE_MODEL_DIR


def example_bundles() -> list[tuple[str, dict]]:
    out = []
    for path in sorted((ROOT / "examples").glob("modeldeployment-*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "ModelDeployment":
                out.append((path.name, doc["spec"]["bundle"]))
    return out


def test_examples_pin_the_real_model() -> None:
    pinned = [(name, b) for name, b in example_bundles() if b["model"]["uri"] == EXAMPLE_URI]
    assert {"modeldeployment-tiny.yaml", "modeldeployment-quality.yaml"} <= {n for n, _ in pinned}
    for name, b in pinned:
        for part in ("model", "tokenizer"):
            assert b[part]["digest"] == MODEL_DIGEST, f"{name}: {part} digest; run make example-model"
            assert b[part]["revision"] == REVISION, f"{name}: {part} revision"


def test_no_example_serves_a_local_model_it_does_not_pin() -> None:
    for name, b in example_bundles():
        uri = b["model"]["uri"]
        assert not uri.startswith("file://") or uri == EXAMPLE_URI, (
            f"{name}: {uri} is not what make example-model writes"
        )
