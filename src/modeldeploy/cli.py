"""The `modeldeploy` command line.

Each subcommand lives in its own module and is imported only when it runs, so
`modeldeploy operator` never pulls in torch and `modeldeploy --help` is instant.
A subcommand module defines `configure(parser)` and `main(args) -> int`.

Development commands (`cluster`, `demo`) are not part of the product: the separate
`modeldeploy-dev` distribution (devtools/) registers them in the `modeldeploy.commands`
entry-point group, so they exist where it is installed (`make setup`) and nowhere else (the
images), and the product never names the test infrastructure.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib.metadata import entry_points

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "tiny-model": ("modeldeploy.runtime.tiny_model", "write a small random-weight HF model + tokenizer"),
    "generate": ("modeldeploy.runtime.generate_cli", "generate offline from a model directory"),
    "model": (
        "modeldeploy.runtime.model_cli",
        "model directories: import-gguf FILE.gguf OUT_DIR | push DIR REGISTRY/REPO",
    ),
    "digest": ("modeldeploy.digest", "print the sha256 manifest digest of a model directory"),
    "operator": (
        "modeldeploy.operator.cli",
        "run the ModelDeployment operator (kopf) against the current kubeconfig",
    ),
    "crd": ("modeldeploy.operator.api.crd", "generate the ModelDeployment CRD from the API types"),
    "fetch": (
        "modeldeploy.fetch",
        "download a model over http(s) or oci:// and verify its digest (init container)",
    ),
    "serve": ("modeldeploy.runtime.server.cli", "serve a model over the OpenAI-compatible HTTP API"),
    "conformance": ("modeldeploy.conformance.cli", "run the serving-contract suite against a server URL"),
    "bench": (
        "modeldeploy.conformance.bench.cli",
        "open-loop goodput at SLO for OpenAI-compatible URLs; 2+ URLs: compare",
    ),
    "rollout": (
        "modeldeploy.operator.rollout_cli",
        "rollout controls: status|promote|abort|rollback NAME [-n NS] [--to BUNDLE]",
    ),
}


ENTRY_POINT_GROUP = "modeldeploy.commands"


def commands() -> dict[str, tuple[str, str]]:
    """The product's commands plus those registered by installed plugins (never overriding ours)."""
    found = dict(COMMANDS)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, (ep.value, f"development tool from {ep.dist.name if ep.dist else '?'}"))
    return found


def _top_parser(cmds: dict[str, tuple[str, str]]) -> argparse.ArgumentParser:
    width = max(len(n) for n in cmds)
    listing = "\n".join(f"  {n.ljust(width)}  {h}" for n, (_, h) in cmds.items())
    return argparse.ArgumentParser(
        prog="modeldeploy",
        description="Pinned LLM serving bundles on Kubernetes.",
        epilog=f"commands:\n{listing}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cmds = commands()
    top = _top_parser(cmds)
    top.add_argument("command", nargs="?", help="one of the commands below")
    if not argv or argv[0] in ("-h", "--help"):
        top.print_help()
        return 0
    name, rest = argv[0], argv[1:]
    if name not in cmds:
        top.error(f"unknown command {name!r}; choose from: {', '.join(cmds)}")
    module = importlib.import_module(cmds[name][0])
    description = cmds[name][1] if name in COMMANDS else (module.__doc__ or "").strip()
    parser = argparse.ArgumentParser(prog=f"modeldeploy {name}", description=description)
    module.configure(parser)
    args = parser.parse_args(rest)
    return int(module.main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
