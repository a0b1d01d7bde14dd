"""`modeldeploy rollout status|promote|abort|rollback NAME`: manual controls of a ModelDeployment rollout.

The commands only set annotations (a metadata merge patch; never spec, which GitOps owns);
the operator reads them on its next reconcile and acts through the state machine:
`modeldeploy.dev/promote=<time>`, `modeldeploy.dev/abort=<time>`,
`modeldeploy.dev/rollback-to=<bundle id>`. The time makes a repeated command a change the
watch sees. Pure parts (patch body, rollback target, status rendering) are functions here.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from types import MappingProxyType
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from modeldeploy.operator.api.v1alpha1.modeldeployment import GROUP, PLURAL, VERSION
from modeldeploy.operator.api.v1alpha1.rollout import Prefetch
from modeldeploy.operator.rollout.commands import ABORT, ANNOTATIONS, PROMOTE, ROLLBACK_TO
from modeldeploy.operator.rollout.prefetch import PULL_REASONS
from modeldeploy.operator.rollout.progression import epoch, now_iso

ACTIONS = ("status", "promote", "abort", "rollback")


class RolloutError(Exception):
    """A problem the user must fix; the message names it."""


def annotation_patch(action: str, stamp: str, bundle: str | None = None) -> dict[str, Any]:
    """The metadata-only merge patch for a manual command."""
    if action == "promote":
        return {"metadata": {"annotations": {PROMOTE: stamp}}}
    if action == "abort":
        return {"metadata": {"annotations": {ABORT: stamp}}}
    if action == "rollback":
        if not bundle:
            raise RolloutError("rollback needs a bundle id (--to BUNDLE)")
        return {"metadata": {"annotations": {ROLLBACK_TO: bundle}}}
    raise RolloutError(f"unknown action {action!r}; choose from {', '.join(ACTIONS[1:])}")


def _history(status: dict[str, Any]) -> list[dict[str, Any]]:
    return [h for h in status.get("history") or [] if isinstance(h, dict) and h.get("bundle")]


def rollback_target(status: dict[str, Any], to: str | None) -> tuple[str, str]:
    """(bundle id, what was chosen and why). Without --to: the newest history entry."""
    history = _history(status)
    listing = ", ".join(f"{h['bundle']} ({h.get('revision') or 'no revision'})" for h in history)
    if not history:
        raise RolloutError("status.history is empty: no prior bundle to roll back to")
    if to is None:
        h = history[-1]
        return h["bundle"], (
            f"--to not given: rolling back to the newest history entry {h['bundle']} "
            f"(revision {h.get('revision') or 'n/a'}, replaced {h.get('replacedAt') or 'n/a'})"
        )
    if to not in {h["bundle"] for h in history}:
        raise RolloutError(f"--to {to}: not in status.history; choose one of: {listing}")
    return to, f"rolling back to {to}"


# ---- status rendering (pure: status dict as the API server returns it, camelCase) ----

VERDICT_STYLE = MappingProxyType({"Pass": "green", "Fail": "bold red", "Inconclusive": "yellow"})


def num_text(x: Any) -> str:
    if x is None:
        return "-"
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def analysis_table(title: Text, a: dict) -> Table:
    """Each metric's stable/canary/threshold/samples/verdict: `rollout status` and the demo's live
    view show the same table."""
    t = Table(title=title, box=box.SIMPLE, title_justify="left")
    for col in ("metric", "stable", "canary", "threshold", "samples", "verdict"):
        t.add_column(col, justify="left" if col in ("metric", "verdict") else "right")
    for m in a.get("metrics") or []:
        mv = m.get("verdict", "?")
        t.add_row(
            m.get("metric", "?"),
            num_text(m.get("stable")),
            num_text(m.get("canary")),
            num_text(m.get("threshold")),
            num_text(m.get("samples")),
            Text(mv, style=VERDICT_STYLE.get(mv, "")),
        )
    return t


def quality_view(q: dict[str, Any] | None) -> list[RenderableType]:
    """The quality gate's last verdict: accuracy, greedy agreement and mean log-probability per cohort,
    with the thresholds, the evaluation set and its digest, and the verdict in words."""
    if not q:
        return []
    v = q.get("verdict", "?")
    where = f" step {q['step'] + 1}" if q.get("step") is not None else " (Verifying)"
    pair = f"{q.get('canary') or '?'} vs {q.get('stable') or '?'}"
    title = Text.assemble(
        f"quality gate{where} {pair} at {q.get('time') or '?'}: ",
        (v, VERDICT_STYLE.get(v, "")),
        f" ({q.get('reason') or '-'})",
    )
    seconds = q.get("seconds")
    about = f"eval set {q.get('evalSet') or '-'} {q.get('digest') or ''}, {q.get('items', 0)} items" + (
        f", {seconds:.1f}s" if isinstance(seconds, int | float) else ""
    )
    out: list[RenderableType] = [analysis_table(title, q), Text(about)]
    if q.get("message"):
        out.append(Text(q["message"], style="" if v == "Pass" else "red"))
    out += [Text(divergent_line(d)) for d in q.get("divergent") or []]
    return out


def divergent_line(d: dict[str, Any]) -> str:
    """One item the canary diverged on: where the greedy answers part, or how far the scores moved."""
    head = f"  item {d.get('index')} {d.get('prompt', '')[:60]!r}: "
    if d.get("aligned") is False:
        return head + "the canary tokenized stable's answer differently"
    if d.get("at") is not None:
        stable, canary = d.get("stable", ""), d.get("canary", "")
        return head + f"answers part at token {d['at']}: stable {stable!r} | canary {canary!r}"
    return head + f"same answer, |delta logprob| {d.get('logprobDelta')} KL {d.get('kl')}"


def cohort_text(c: dict[str, Any] | None) -> str:
    if not c:
        return "-"
    rev = f" rev {c['revision']}" if c.get("revision") else ""
    load = c.get("loadProgress")
    load_s = f", load {load:.0%}" if isinstance(load, int | float) and load < 1 else ""
    return f"{c.get('bundle', '?')}{rev}  ready {c.get('readyReplicas', 0)}/{c.get('replicas', 0)}{load_s}"


def prefetch_text(spec: dict[str, Any], rollout: dict[str, Any], now: float) -> str | None:
    """'images pulled on 1/3 nodes, 42s of prefetch.timeoutSeconds 900' while Prefetching, else None."""
    if rollout.get("prefetchNodes") is None:
        return None
    timeout = ((spec.get("rollout") or {}).get("prefetch") or {}).get("timeoutSeconds")
    timeout = timeout if timeout is not None else Prefetch.model_fields["timeout_seconds"].default
    since = epoch(rollout.get("phaseSince"))
    spent = f"{max(0.0, now - since):.0f}s" if since is not None else "?"
    pulled = f"images pulled on {rollout.get('prefetchedNodes', 0)}/{rollout['prefetchNodes']} nodes"
    return f"{pulled}, {spent} of prefetch.timeoutSeconds {timeout}"


def prefetch_view(rollout: dict[str, Any]) -> list[RenderableType]:
    """Each pre-pull pod not Ready yet: its node and what it waits on, a failed pull in red with the
    kubelet's message (e.g. a blob whose bytes do not match its digest)."""
    waits = rollout.get("prefetchWaiting") or []
    if not waits:
        return []
    t = Table(title="pre-pull pods not Ready", box=box.SIMPLE, title_justify="left")
    for col in ("node", "waiting on", "message"):
        t.add_column(col)
    for w in waits:
        reason = w.get("reason", "?")
        style = "red" if reason in PULL_REASONS else ""
        t.add_row(w.get("node") or "(unscheduled)", Text(reason, style=style), w.get("message") or "-")
    return [t]


def render_status(md: dict[str, Any], now: float | None = None) -> list[RenderableType]:
    """Rich tables for one ModelDeployment: summary, conditions, pre-pull progress, last analysis, history,
    failed bundles. `now` (epoch seconds, default the clock) measures the time a pre-pull has taken."""
    meta, spec, st = md.get("metadata") or {}, md.get("spec") or {}, md.get("status") or {}
    rollout = st.get("rollout") or {}
    steps = ((spec.get("rollout") or {}).get("steps")) or []
    out: list[RenderableType] = []
    summary = Table(
        title=f"ModelDeployment {meta.get('namespace', '?')}/{meta.get('name', '?')}",
        show_header=False,
        box=box.SIMPLE,
        title_justify="left",
    )
    summary.add_column("field", style="bold")
    summary.add_column("value")
    gen, seen = meta.get("generation"), st.get("observedGeneration")
    stale = " (status not yet updated for this generation)" if gen is not None and gen != seen else ""
    summary.add_row("phase", Text(str(st.get("phase") or "Unknown"), style="bold"))
    summary.add_row("generation", f"{num_text(gen)} observed {num_text(seen)}{stale}")
    summary.add_row("stable", cohort_text(st.get("stable")))
    summary.add_row("canary", cohort_text(st.get("canary")))
    summary.add_row("canary weight", f"{st.get('canaryWeight', 0)}%")
    pulling = prefetch_text(spec, rollout, time.time() if now is None else now)
    if pulling is not None:
        summary.add_row("prefetch", pulling)
    step = st.get("currentStep")
    if step is not None:
        total = len(steps) or "?"
        summary.add_row(
            "step",
            f"{step + 1}/{total}" + (f" (weight {steps[step]['weight']}%)" if step < len(steps) else ""),
        )
    pending = {k: v for k, v in (meta.get("annotations") or {}).items() if k in ANNOTATIONS}
    for k, v in pending.items():
        summary.add_row("pending command", f"{k}={v}")
    out.append(summary)

    if st.get("conditions"):
        t = Table(title="conditions", box=box.SIMPLE, title_justify="left")
        for col in ("type", "status", "reason", "message", "since"):
            t.add_column(col)
        for c in st["conditions"]:
            t.add_row(
                c.get("type", ""),
                c.get("status", ""),
                c.get("reason", ""),
                c.get("message", ""),
                c.get("lastTransitionTime") or "-",
            )
        out.append(t)

    out += prefetch_view(rollout)

    a = st.get("lastAnalysis")
    if a:
        v = a.get("verdict", "?")
        step_s = f" step {a['step'] + 1}" if a.get("step") is not None else ""
        t = analysis_table(
            Text.assemble(
                "last analysis", step_s, f" at {a.get('time') or '?'}: ", (v, VERDICT_STYLE.get(v, ""))
            ),
            a,
        )
        out.append(t)
        if a.get("message"):
            out.append(Text(f"analysis could not read: {a['message']}", style="yellow"))

    out += quality_view(st.get("lastQuality"))

    history = _history(st)
    if history:
        t = Table(
            title="history (newest last; rollback target without --to: the last)",
            box=box.SIMPLE,
            title_justify="left",
        )
        for col in ("bundle", "revision", "promoted", "replaced"):
            t.add_column(col)
        for h in history:
            t.add_row(
                h["bundle"], h.get("revision") or "-", h.get("promotedAt") or "-", h.get("replacedAt") or "-"
            )
        out.append(t)
    if st.get("failedBundles"):
        out.append(
            Text(
                "failed bundles (not retried until spec.bundle changes): " + ", ".join(st["failedBundles"]),
                style="red",
            )
        )
    if not st:
        out.append(Text("no status yet: the operator has not reconciled this object", style="yellow"))
    return out


def render_text(md: dict[str, Any], width: int = 120, now: float | None = None) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False)
    console.print(Group(*render_status(md, now)))
    return buf.getvalue()


# ---- I/O ----


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=ACTIONS, help="status, or a command the operator acts on")
    p.add_argument("name", help="ModelDeployment name")
    p.add_argument("-n", "--namespace", default=None, help="namespace (default: the kubeconfig context's)")
    p.add_argument(
        "--to", default=None, help="rollback: bundle id from status.history (default: newest entry)"
    )
    p.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: $KUBECONFIG or in-cluster)")


def _connect(kubeconfig: str | None, namespace: str | None) -> tuple[Any, str]:
    from kubernetes import client, config

    try:
        if kubeconfig is None and _in_cluster():
            config.load_incluster_config()
            ns = namespace or open("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read().strip()
        else:
            config.load_kube_config(config_file=kubeconfig)
            _, active = config.list_kube_config_contexts(config_file=kubeconfig)
            ns = namespace or (active.get("context") or {}).get("namespace") or "default"
    except (config.ConfigException, OSError) as e:
        where = kubeconfig or "in-cluster / $KUBECONFIG / ~/.kube/config"
        raise RolloutError(f"no Kubernetes configuration from {where} (set --kubeconfig): {e}") from e
    return client.CustomObjectsApi(), ns


def _in_cluster() -> bool:
    import os

    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and not os.environ.get("KUBECONFIG")


def _get(api: Any, ns: str, name: str) -> dict[str, Any]:
    from kubernetes.client.exceptions import ApiException

    try:
        return api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    except ApiException as e:
        if e.status == 404:
            raise RolloutError(f"ModelDeployment {ns}/{name} not found (check NAME and -n NAMESPACE)") from e
        raise RolloutError(f"reading ModelDeployment {ns}/{name}: HTTP {e.status} {e.reason}") from e


def main(args: argparse.Namespace) -> int:
    from kubernetes.client.exceptions import ApiException

    try:
        if args.to is not None and args.action != "rollback":
            raise RolloutError(f"--to applies to rollback only, not {args.action}")
        api, ns = _connect(args.kubeconfig, args.namespace)
        md = _get(api, ns, args.name)
        if args.action == "status":
            Console().print(Group(*render_status(md)))
            return 0
        note = ""
        bundle = None
        if args.action == "rollback":
            bundle, note = rollback_target(md.get("status") or {}, args.to)
        body = annotation_patch(args.action, now_iso(), bundle)
        try:
            api.patch_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, args.name, body, _content_type="application/merge-patch+json"
            )
        except ApiException as e:
            raise RolloutError(
                f"annotating ModelDeployment {ns}/{args.name}: HTTP {e.status} {e.reason}"
            ) from e
    except RolloutError as e:
        print(f"modeldeploy rollout: error: {e}", file=sys.stderr)
        return 1
    if note:
        print(note)
    ((key, value),) = body["metadata"]["annotations"].items()
    print(
        f"annotated {ns}/{args.name} {key}={value}; the operator acts on its next reconcile "
        f"(watch: modeldeploy rollout status {args.name} -n {ns})"
    )
    return 0
