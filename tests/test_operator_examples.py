"""examples/modeldeployment-tiny.yaml pins the digest of `make example-model`'s output; keep them in step."""

from __future__ import annotations

from pathlib import Path

import yaml

from modeldeploy.cli import main as cli
from modeldeploy.digest import dir_digest

ROOT = Path(__file__).resolve().parents[1]


def test_tiny_example_pins_the_generated_model(tmp_path: Path) -> None:
    # the same command `make example-model` runs (seeded, so the files and digest are fixed)
    assert cli(["tiny-model", str(tmp_path / "tiny-llama"), "--arch", "llama", "--seed", "0"]) == 0
    spec = yaml.safe_load((ROOT / "examples" / "modeldeployment-tiny.yaml").read_text())["spec"]
    digest = dir_digest(tmp_path / "tiny-llama")
    assert spec["bundle"]["model"]["digest"] == digest, (
        "regenerate: make example-model, then update the example's digests"
    )
    assert spec["bundle"]["tokenizer"]["digest"] == digest
