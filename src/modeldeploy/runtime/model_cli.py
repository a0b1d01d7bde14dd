"""`modeldeploy model`: make model directories the runtime serves.

`modeldeploy model import-gguf FILE.gguf OUT_DIR` de-quantizes a llama.cpp GGUF file into a
byte-reproducible directory (safetensors, config, tokenizer, chat template) whose digest a bundle
pins. `modeldeploy model push DIR REGISTRY/REPO[:TAG]` packs a model directory as an OCI image
(one layer per safetensors file) and prints the `oci://REGISTRY/REPO@sha256:...` URI and model
digest a bundle pins (`modeldeploy.oci.push`, torch-free). Each subcommand's module is imported
only when it runs (torch and transformers are heavy).
"""

from __future__ import annotations

import argparse
import importlib

# name -> (module with configure(parser) and main(args), one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "import-gguf": (
        "modeldeploy.runtime.gguf_import",
        "de-quantize a GGUF file into a pinned model directory (safetensors, config, tokenizer)",
    ),
    "push": (
        "modeldeploy.oci.push",
        "push a model directory to a registry as an OCI artifact; prints its oci://...@sha256 URI",
    ),
}


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="model_command", metavar="SUBCOMMAND", required=True)
    for name, (module, help_) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(_module=module)
        importlib.import_module(module).configure(p)


def main(args: argparse.Namespace) -> int:
    return int(importlib.import_module(args._module).main(args) or 0)
