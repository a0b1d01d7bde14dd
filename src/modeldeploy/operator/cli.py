"""`modeldeploy operator`: run the kopf operator with metrics and a health endpoint."""

from __future__ import annotations

import argparse
import logging


def configure(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace", "-n", action="append", default=[], help="watch this namespace (repeatable)"
    )
    scope.add_argument(
        "--all-namespaces", "-A", action="store_true", help="watch every namespace (the default)"
    )
    parser.add_argument("--metrics-port", type=int, default=8080, help="port of /metrics (0: off)")
    parser.add_argument("--health-port", type=int, default=8081, help="port of /healthz (0: off)")
    parser.add_argument("--bind", default="0.0.0.0", help="address for metrics and health")
    parser.add_argument(
        "--peering",
        default=None,
        help="kopf peering name; required to exist (the chart installs the peering CRDs)",
    )
    parser.add_argument("--standalone", action="store_true", help="no peering: a single replica")
    parser.add_argument("--verbose", "-v", action="store_true")
    parser.epilog = (
        "env MODELDEPLOY_GATE_KEY: the operator's gate key (32+ characters), from which it derives the "
        "token its conformance and quality gates send to pods that require an API key "
        "(bundle.config.apiKeySecretRef). Unset: such ModelDeployments with a gate are refused "
        "(Degraded, NoGateKey). The Helm chart sets it from a Secret it creates."
    )


def main(args: argparse.Namespace) -> int:
    import kopf
    from prometheus_client import start_http_server

    import modeldeploy.operator.handlers  # noqa: F401  (registers the handlers)
    from modeldeploy.operator.controller.gatekey import GateKey

    try:
        gate_key = GateKey.from_env()
    except ValueError as e:
        raise SystemExit(f"modeldeploy operator: {e}") from None

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if gate_key is None:
        logging.getLogger("modeldeploy.operator").info(
            "env MODELDEPLOY_GATE_KEY is unset: ModelDeployments with an API key and a gate are refused"
        )
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.bind)
    identity = priority = None
    if args.peering and not args.standalone:  # several replicas: one active (operator/controller/peering.py)
        from modeldeploy.operator.controller import peering

        identity, priority = peering.own_identity(), peering.start_priority()
        peering.CONFIG = peering.PeeringConfig(args.peering, identity, priority, not args.namespace)
        logging.getLogger("modeldeploy.operator").info(
            "peering %s as %s, priority %d (the oldest live replica is active)",
            args.peering,
            identity,
            priority,
        )
    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        standalone=args.standalone or None,
        peering_name=args.peering,
        identity=identity,  # pyright: ignore[reportArgumentType]  # kopf.Identity: a NewType of str kopf does not export
        priority=priority,
        liveness_endpoint=f"http://{args.bind}:{args.health_port}/healthz" if args.health_port else None,
    )
    return 0
