"""`modeldeploy demo`: the command around `demo.run_story` — its own local cluster, the CRD, a
restricted namespace, the live view (a line per phase change off a terminal), summary, teardown."""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from modeldeploy_dev import kubeobj as K
from modeldeploy_dev.crd_install import apply_crd
from modeldeploy_dev.demo import (
    DEMO_LABEL,
    NAME,
    DemoFailed,
    Outcome,
    Snapshot,
    diagnostics,
    phase_line,
    remove_volume,
    run_story,
    summary,
    view,
)
from modeldeploy_dev.wait import wait_until


def install_crd(api: Any) -> None:
    """Create or replace the ModelDeployment CRD (generated from the API types); wait until Established."""
    from kubernetes import client

    try:
        apply_crd(client.ApiextensionsV1Api(api), 60)
    except TimeoutError as e:
        raise DemoFailed(str(e)) from None


def create_namespace(api: Any, ns: str) -> None:
    """A fresh restricted namespace; one left by an earlier demo (labelled) is deleted first."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    delete_namespace(api, ns, wait=True)
    core.create_namespace(
        K.body(
            {
                "metadata": {
                    "name": ns,
                    "labels": {
                        "pod-security.kubernetes.io/enforce": "restricted",
                        "pod-security.kubernetes.io/enforce-version": "latest",
                        DEMO_LABEL: "true",
                    },
                }
            }
        )
    )
    _until(
        lambda: any(K.name(a) == "default" for a in core.list_namespaced_service_account(ns).items),
        30,
        f"default ServiceAccount in {ns}",
    )


def delete_namespace(api: Any, ns: str, wait: bool = False) -> None:
    """Delete the demo's namespace (never one the demo did not label) and its model PV."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    try:
        if (K.meta(core.read_namespace(ns)).labels or {}).get(DEMO_LABEL) != "true":
            raise DemoFailed(
                f"namespace {ns} exists and was not made by the demo: choose another --namespace"
            )
        core.delete_namespace(ns)
    except client.ApiException as e:
        if e.status != 404:
            raise
    if wait:
        _until(
            lambda: ns not in {K.name(n) for n in core.list_namespace().items},
            180,
            f"namespace {ns} gone",
        )
    remove_volume(api, ns)


def _until(fn: Callable[[], bool], timeout: float, what: str) -> None:
    try:
        wait_until(fn, timeout, 0.5, what)
    except TimeoutError as e:
        raise DemoFailed(str(e)) from None


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--keep", action="store_true", help="leave the cluster and the demo namespace running")
    p.add_argument("--workdir", default="out/demo", help="tiny model and operator log (default out/demo)")
    p.add_argument(
        "--kubeconfig",
        default=None,
        help="use this cluster (needs a process node) instead of a "
        "demo cluster; only the demo namespace and the operator are removed afterwards",
    )
    p.add_argument("--namespace", default="demo", help="namespace of the story (default demo)")


def main(args: argparse.Namespace) -> int:
    from kubernetes import config
    from rich.live import Live

    from modeldeploy_dev.cluster.local import LocalCluster, Settings

    console, t0, workdir, ns, env = (
        Console(),
        time.monotonic(),
        Path(args.workdir).resolve(),
        args.namespace,
        os.environ,
    )
    cluster = (
        None
        if args.kubeconfig
        else LocalCluster(
            Settings(
                name=env.get("MODELDEPLOY_CLUSTER_NAME", "demo"),
                bridge=env.get("MODELDEPLOY_CLUSTER_BRIDGE", "mdbr9"),
                pod_cidr=env.get("MODELDEPLOY_CLUSTER_POD_CIDR", "10.244.9.0/24"),
            )
        )
    )
    # a cluster that ran before the demo and is not the demo's own (e.g. the tests') is never taken down
    own = cluster is not None and (cluster.s.name == "demo" or not cluster.cluster_running())
    outcome, api, live = Outcome(failure="did not start"), None, None
    seen: list[Any] = [None]

    def show(s: Snapshot) -> None:
        if (key := (s.status.get("phase"), s.stage)) != seen[0]:
            seen[0] = key
            console.print(phase_line(s), highlight=False, soft_wrap=True)
        if live is not None:
            live.update(view(s))

    try:
        if cluster is not None:
            cluster.up(log=lambda m: console.print(m, markup=False, highlight=False, soft_wrap=True))
        kubeconfig = args.kubeconfig if cluster is None else str(cluster.kubeconfig)  # one or the other
        api = config.new_client_from_config(config_file=kubeconfig)
        install_crd(api)
        create_namespace(api, ns)
        console.print(
            f"namespace {ns}, ModelDeployment {NAME}, operator log {workdir / 'operator.log'}",
            soft_wrap=True,
            highlight=False,
        )
        with (
            Live(console=console, refresh_per_second=2)
            if console.is_terminal
            else contextlib.nullcontext() as live
        ):
            outcome = run_story(kubeconfig, ns, workdir, show)
    except Exception as e:
        outcome.failure = f"{type(e).__name__}: {e}"
    finally:
        outcome.seconds["demo (cluster up to summary)"] = time.monotonic() - t0
        console.rule("summary")
        console.print("\n".join(summary(outcome)), highlight=False, soft_wrap=True, markup=False)
        if not outcome.ok and api is not None:
            console.print(diagnostics(api, ns, workdir), highlight=False, soft_wrap=True, markup=False)
        if args.keep:
            console.print(
                f"--keep: namespace {ns} and the cluster left running; see `modeldeploy rollout status "
                f"{NAME} -n {ns}`" + (f" with KUBECONFIG={cluster.kubeconfig}" if cluster else "")
            )
        elif cluster is not None and own:
            cluster.down(log=lambda m: console.print(m, markup=False, highlight=False, soft_wrap=True))
        elif api is not None:
            delete_namespace(api, ns)
    console.print(f"demo finished in {time.monotonic() - t0:.1f}s: {'PASS' if outcome.ok else 'FAIL'}")
    return 0 if outcome.ok else 1
