"""The `modeldeploy` command line.

Each subcommand lives in its own module and is imported only when it runs, so
`modeldeploy operator` never pulls in torch and `modeldeploy --help` is instant.
A subcommand module defines `configure(parser)` and `main(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "tiny-model": ("modeldeploy.runtime.tiny_model", "write a small random-weight HF model + tokenizer"),
    "generate": ("modeldeploy.runtime.generate_cli", "generate offline from a model directory"),
    "digest": ("modeldeploy.digest", "print the sha256 manifest digest of a model directory"),
    "operator": (
        "modeldeploy.operator.cli",
        "run the ModelDeployment operator (kopf) against the current kubeconfig",
    ),
    "crd": ("modeldeploy.operator.crd", "generate the ModelDeployment CRD from the API types"),
    "fetch": ("modeldeploy.fetch", "download a model over http(s) and verify its digest (init container)"),
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
    "cluster": (
        "modeldeploy.e2e.cluster.cli",
        "local Kubernetes for tests/demo: up|down|status|kubeconfig|build",
    ),
    "demo": (
        "modeldeploy.demo_cli",
        "the rollout story on a local cluster: good bundle promoted, slow one rolled back",
    ),
}


def _top_parser() -> argparse.ArgumentParser:
    width = max(len(n) for n in COMMANDS)
    listing = "\n".join(f"  {n.ljust(width)}  {h}" for n, (_, h) in COMMANDS.items())
    return argparse.ArgumentParser(
        prog="modeldeploy",
        description="Pinned LLM serving bundles on Kubernetes.",
        epilog=f"commands:\n{listing}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    top = _top_parser()
    top.add_argument("command", nargs="?", help="one of the commands below")
    if not argv or argv[0] in ("-h", "--help"):
        top.print_help()
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        top.error(f"unknown command {name!r}; choose from: {', '.join(COMMANDS)}")
    module = importlib.import_module(COMMANDS[name][0])
    parser = argparse.ArgumentParser(prog=f"modeldeploy {name}", description=COMMANDS[name][1])
    module.configure(parser)
    args = parser.parse_args(rest)
    return int(module.main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
