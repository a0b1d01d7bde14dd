# ruff: noqa: F811  (pytest fixtures imported from test_operator are parameters here)
"""Rollout faults on the local cluster: the operator killed in every
phase resumes to the same end state, and a bundle that breaks the serving contract is
rolled back by the conformance gate before it gets any traffic.

Phases such as Promoting and RollingBack last a single reconcile, too short to hit with a
signal from outside, so the operator runs with `MODELDEPLOY_FAILPOINT=kill-after-status:<Phase>`:
it SIGKILLs itself right after persisting that phase. The test checks that the persisted
phase is the one named, restarts the operator (with the next failpoint, or none) and checks
the end state, the Events (each decision exactly once) and the load the stable bundle saw.
"""

from __future__ import annotations

import shutil
import signal
from collections import Counter
from pathlib import Path
from typing import Any

from modeldeploy.digest import dir_digest
from modeldeploy_dev.argocd import checked
from modeldeploy_dev.load import Load

from .conftest import E2ECluster
from .test_operator import (  # noqa: F401  (fixtures)
    Operator,
    condition,
    crd_installed,
    get_md,
    operator,
)
from .test_rollout import (
    change_bundle,
    events,
    pod_ips,
    rolled_back,
    serve_tiny,
    stable_errors,
    wait_md,
    wait_phase,
)


def restart(op: Operator, failpoint: str | None = None) -> None:
    op.kill()
    op.start({"MODELDEPLOY_FAILPOINT": f"kill-after-status:{failpoint}"} if failpoint else None)


def killed_in(
    cluster: E2ECluster, ns: str, name: str, op: Operator, phase: str, timeout: float
) -> dict[str, Any]:
    """Wait for the failpoint to kill the operator; the persisted status must be in `phase`."""
    cluster.wait(
        lambda: op.proc is not None and op.proc.poll() is not None,
        timeout,
        f"operator killed right after persisting phase {phase}",
    )
    assert op.proc is not None and op.proc.returncode == -signal.SIGKILL, op.proc.returncode
    md = get_md(cluster, ns, name)
    assert md["status"]["phase"] == phase, md["status"]
    return md


def nochat_model(tmp: Path) -> tuple[str, str]:
    """A revision of the tiny model whose tokenizer lost its chat template: it loads and answers
    /v1/completions, but /v1/chat/completions fails (400), which the contract forbids."""
    src, dst = tmp / "models" / "tiny-llama", tmp / "models" / "tiny-llama-nochat"
    shutil.copytree(src, dst)
    (dst / "chat_template.jinja").unlink()
    return "pvc://models/tiny-llama-nochat", dir_digest(dst)


def test_operator_killed_in_every_phase_resumes_then_broken_contract_rolls_back_before_traffic(
    cluster: E2ECluster, namespace: str, operator: Operator, tmp_path: Path
) -> None:
    ns, name = namespace, "crash"
    _, old = serve_tiny(cluster, ns, tmp_path, name)
    old_ips = pod_ips(cluster, ns, old)
    with Load(cluster.api, ns, name) as load:
        restart(operator, "Deploying")
        change_bundle(cluster, ns, name, lambda b: b["config"].update(maxNumSeqs=6))
        new = killed_in(cluster, ns, name, operator, "Deploying", 60)["status"]["canary"]["bundle"]
        # Canary and RollingBack come after a whole conformance gate run (restarted operator): as
        # long as Verifying's wait, since the gate's duration depends on the machine's load.
        for phase, timeout in (("Verifying", 240), ("Canary", 240), ("Promoting", 240)):
            restart(operator, phase)  # resumes from the persisted phase, dies in the next
            md = killed_in(cluster, ns, name, operator, phase, timeout)
            st = md["status"]
            assert st["canary"]["bundle"] == new and st["stable"]["bundle"] == old, st
            checked(md, "Progressing", f"progressing-{phase.lower()}-operator-down")
        restart(operator)
        st = wait_phase(cluster, ns, name, ("Stable",), 180)["status"]
        assert (
            st["stable"]["bundle"] == new
            and st["history"][-1]["bundle"] == old
            and not st.get("failedBundles")
        ), st
        reasons = Counter(r for r, _ in events(cluster, ns, name))
        for r in ("NewBundle", "CanaryReady", "ConformancePassed", "Promoted"):
            assert reasons[r] == 1, (r, reasons)  # resumed, never redone
        deps = cluster.apps.list_namespaced_deployment(
            ns, label_selector=f"app.kubernetes.io/instance={name}"
        ).items
        assert sorted(d.metadata.labels["modeldeploy.dev/bundle"] for d in deps) == sorted(
            [old, new]
        )  # no duplicates
        new_ips = pod_ips(cluster, ns, new)

        # broken contract: killed right after deciding to roll back, then resumed
        uri, digest = nochat_model(tmp_path)
        restart(operator, "RollingBack")
        change_bundle(
            cluster,
            ns,
            name,
            lambda b: (
                b["model"].update(uri=uri, revision="seed0-nochat", digest=digest),
                b["tokenizer"].update(revision="seed0-nochat", digest=digest),
            ),
        )
        verifying = wait_phase(cluster, ns, name, ("Verifying", "RollingBack"), 240)
        broken = verifying["status"]["canary"]["bundle"]
        broken_ips = pod_ips(cluster, ns, broken)
        md = killed_in(cluster, ns, name, operator, "RollingBack", 240)
        checked(md, "Progressing", "progressing-rollingback-operator-down")
        st = md["status"]
        assert (
            st["rollout"]["reason"] == "ConformanceFailed" and "normal_response" in st["rollout"]["message"]
        ), st
        assert st.get("canaryWeight", 0) == 0
        restart(operator)
        done = wait_md(cluster, ns, name, rolled_back, 120, "broken bundle rolled back")
    st = done["status"]
    assert st["stable"]["bundle"] == new and st["failedBundles"] == [broken], st
    deg = condition(done, "Degraded")
    assert deg["status"] == "True" and deg["reason"] == "ConformanceFailed" and "chat" in deg["message"], deg
    checked(done, "Degraded", "degraded-conformance-failed")
    assert Counter(r for r, _ in events(cluster, ns, name))["RolledBack"] == 1
    seen = load.by_ip()
    print(f"load by pod ip: {seen}; old {old_ips}, new {new_ips}, broken {broken_ips}")
    assert broken_ips and not broken_ips & set(seen), "the broken bundle got traffic before its gate"
    assert not stable_errors(load, old_ips | new_ips), (seen, load.transport_errors)
    assert sum(seen.get(ip, Counter())[200] for ip in new_ips) > 0
    cluster.wait(
        lambda: (
            not cluster.apps.list_namespaced_deployment(
                ns, label_selector=f"modeldeploy.dev/bundle={broken}"
            ).items
        ),
        60,
        "broken canary Deployment removed",
    )
