"""Fuzz the ModelDeployment CRD against a real API server and a real operator (issue 39, item 3).

  .venv/bin/python bench/crd_fuzz.py --examples 10000

Specs come from the CRD's own openAPIV3Schema (`modeldeploy crd`, generated from the pydantic types), walked
by a hypothesis strategy (`strategy`: hypothesis-jsonschema 0.23 does not run on hypothesis 6.170). The
schema is read as the API server reads it, so what is drawn is mostly valid: types, bounds, lengths, enums,
`pattern`s and string rules written as CEL (`self.matches('...')`: the digests and URIs), int-or-string
fields an integer, a quantity or a string, and objects close (unknown fields are the API server's business,
tested by the mutations). Cross-field CEL rules are left to chance. A share of the specs is then pushed
OUTSIDE the schema by one mutation (a wrong type, a number past its bound, a bad enum value, an unknown field,
a required field dropped, a string past maxLength, a CEL-violating combination) so both outcomes are hit.

Each spec is created, with `fieldValidation=Strict` as `kubectl apply` sends it, in a namespace of a bare
control plane (etcd + kube-apiserver only, `modeldeploy_dev.control_plane`), where the real operator
(`modeldeploy operator --standalone`, a subprocess) reconciles it. The outcome of each is one of:

- refused with a field path: the status names `spec.<...>` (a cause's `field`, or the message);
- refused WITHOUT a field path, or answered 5xx: a finding;
- accepted and reconciled: within --settle-timeout the object has a status written for its generation (a
  phase, and an InvalidSpec condition where the API types refuse what the schema let through), and the
  operator logged nothing about it at WARNING or above;
- accepted with an operator error: no status in time, or a reconcile warning/traceback naming it.

The operator must never exit (a crash): it is checked after every batch. Accepted objects are reconciled and
then deleted in batches (--batch), with their children (no controller manager runs to collect them), so the
operator's caches stay small. Prints a markdown block for bench/results/crd_fuzz.md.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from modeldeploy.operator.api.crd import crd
from modeldeploy.operator.api.v1alpha1.modeldeployment import GROUP, KIND, PLURAL, VERSION

ROOT = Path(__file__).resolve().parents[1]
NS = "crd-fuzz"
MATCHES = re.compile(r"^self\.matches\('((?:[^'\\]|\\.)*)'\)$")
KEYS_MATCH = re.compile(r"^self\.all\(k, size\(k\) <= (\d+) && k\.matches\('((?:[^'\\]|\\.)*)'\)\)$")
MUTATIONS = (
    "wrong_type",
    "out_of_range",
    "bad_enum",
    "unknown_field",
    "drop_required",
    "too_long",
    "cel_combo",
)
# spec-level CEL combinations the schema alone cannot express (the spec's x-kubernetes-validations)
CEL_COMBOS: tuple[Callable[[dict[str, Any]], None], ...] = (
    lambda s: s.setdefault("topology", {}).update(tensorParallel=2, gpusPerReplica=3),
    lambda s: s["bundle"].setdefault("config", {}).update(device="cpu", cudaGraphs=True),
    lambda s: (
        s.setdefault("topology", {}).update(tensorParallel=2, gpusPerReplica=2),
        s["bundle"].update(adapters=[{"name": "a", "uri": "file:///a", "digest": "sha256:" + "1" * 64}]),
    ),
    lambda s: s["bundle"]["tokenizer"].update(uri="file:///elsewhere"),
)


def _cel_string(rule: str) -> str:
    """A CEL single-quoted string literal's value ('\\\\' is one backslash)."""
    return re.sub(r"\\(.)", r"\1", rule)


def _anchor(pattern: str) -> str:
    """Python's `$` also matches before a final newline; RE2's (CEL's, Go's) does not: draw with `\\Z`."""
    return pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith(r"\$") else pattern


def _patterns(node: dict[str, Any]) -> list[str]:
    """A string's patterns: its own `pattern` and its CEL `self.matches('...')` rules (digests, URIs)."""
    out = [node["pattern"]] if "pattern" in node else []
    for v in node.get("x-kubernetes-validations", []):
        if m := MATCHES.match(v["rule"]):
            out.append(_cel_string(m.group(1)))
    return out


TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
JSON_LEAF = (
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)  # JSON has neither
    | TEXT
)
JSON = st.recursive(
    JSON_LEAF, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(TEXT, kids, max_size=3), max_leaves=6
)


def _string(node: dict[str, Any]) -> st.SearchStrategy[str]:
    if "enum" in node:
        return st.sampled_from(node["enum"])
    longest = node.get("maxLength", 10**6)
    pats = _patterns(node)
    if not pats:
        return st.text(st.characters(codec="utf-8"), max_size=min(longest, 40))
    s = st.from_regex(_anchor(pats[0]), fullmatch=True)
    for other in pats[1:]:
        s = s.filter(re.compile(_anchor(other)).match)
    return s.filter(lambda v: len(v) <= longest)


def _number(node: dict[str, Any], integer: bool) -> st.SearchStrategy[Any]:
    lo, hi = node.get("minimum"), node.get("maximum")
    if integer:
        lo = -(2**31) if lo is None else int(lo) + (1 if node.get("exclusiveMinimum") is True else 0)
        return st.integers(lo, 2**31 if hi is None else int(hi))
    return st.floats(
        lo, hi, exclude_min=node.get("exclusiveMinimum") is True, allow_nan=False, allow_infinity=False
    )


def _object(node: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    props = node.get("properties")
    if props:
        required = set(node.get("required") or ())
        return st.fixed_dictionaries(
            {k: strategy(v) for k, v in props.items() if k in required},
            optional={k: strategy(v) for k, v in props.items() if k not in required},
        )
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        keys: st.SearchStrategy[str] = TEXT
        for v in node.get("x-kubernetes-validations", []):
            if m := KEYS_MATCH.match(v["rule"]):
                keys = st.from_regex(_anchor(_cel_string(m.group(2))), fullmatch=True).filter(
                    lambda k, n=int(m.group(1)): len(k) <= n
                )
        return st.dictionaries(keys, strategy(extra), max_size=min(node.get("maxProperties", 3), 3))
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return st.dictionaries(TEXT, JSON, max_size=3)
    return st.just({})


def strategy(node: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values of a structural schema node as the API server enforces it: types, bounds, lengths, enums,
    patterns and CEL `matches` rules; unknown fields never (objects close). Cross-field CEL is left to
    chance."""
    if node.get("x-kubernetes-int-or-string"):
        pats = _patterns(node)
        as_string = st.from_regex(_anchor(pats[0]), fullmatch=True) if pats else TEXT
        for v in node.get("x-kubernetes-validations", []):  # '25%' or a count (rollout steps, minAvailable)
            if "matches(" in v["rule"] and (m := re.search(r"matches\('((?:[^'\\]|\\.)*)'\)", v["rule"])):
                as_string = st.from_regex(_anchor(_cel_string(m.group(1))), fullmatch=True)
        if "maxLength" in node:
            as_string = as_string.filter(lambda v: len(v) <= node["maxLength"])
        quantities = st.from_regex(r"[1-9][0-9]{0,3}(m|Mi|Gi|Ki)?", fullmatch=True)
        return st.integers(0, 1000) | as_string | quantities
    kind = node.get("type")
    if kind == "string":
        return _string(node)
    if kind in ("integer", "number"):
        return _number(node, kind == "integer")
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        items = node.get("items") or {}
        lo = node.get("minItems", 0)
        return st.lists(strategy(items), min_size=lo, max_size=max(lo, min(node.get("maxItems", 3), 3)))
    if kind == "object":
        return _object(node)
    return JSON


def crd_spec_schema() -> dict[str, Any]:
    return crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def _nodes(value: Any, schema: dict[str, Any], path: tuple = ()) -> Iterator[tuple[tuple, Any, dict]]:
    """Every (path, value, schema) in a drawn spec, the spec itself first."""
    yield path, value, schema
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for k, v in value.items():
            sub = props.get(k) or (extra if isinstance(extra, dict) else None)
            if sub is not None:
                yield from _nodes(v, sub, (*path, k))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(value):
            yield from _nodes(v, schema["items"], (*path, i))


def _set(spec: dict[str, Any], path: tuple, value: Any) -> None:
    parent: Any = spec
    for p in path[:-1]:
        parent = parent[p]
    parent[path[-1]] = value


def _wrong_type(schema: dict[str, Any]) -> Any:
    return {
        "string": 12345,
        "integer": "seven",
        "number": "seven",
        "boolean": "yes",
        "object": ["not", "an", "object"],
        "array": {"not": "an array"},
    }.get(schema.get("type", ""), {"nested": {"deep": [1, "two", None]}})


def mutate(spec: dict[str, Any], schema: dict[str, Any], kind: str, pick: int) -> tuple[dict, str]:
    """`spec` pushed outside the schema by one mutation of `kind`, at the `pick`-th place that allows it;
    returns the spec and what was done (a mutation with no place to act on leaves the spec as drawn)."""
    spec = copy.deepcopy(spec)
    nodes = list(_nodes(spec, schema))
    if kind == "cel_combo":
        CEL_COMBOS[pick % len(CEL_COMBOS)](spec)
        return spec, f"cel_combo#{pick % len(CEL_COMBOS)}"
    cands: list[tuple[tuple, Any, dict]]
    if kind == "wrong_type":
        cands = [n for n in nodes if n[0]]
    elif kind == "out_of_range":
        cands = [n for n in nodes if "minimum" in n[2] or "maximum" in n[2] or "minItems" in n[2]]
    elif kind == "bad_enum":
        cands = [n for n in nodes if "enum" in n[2]]
    elif kind == "too_long":
        cands = [n for n in nodes if "maxLength" in n[2] or "maxItems" in n[2]]
    elif kind == "drop_required":
        cands = [n for n in nodes if isinstance(n[1], dict) and n[2].get("required")]
    else:  # unknown_field
        cands = [n for n in nodes if isinstance(n[1], dict) and "properties" in n[2]]
    if not cands:
        return spec, f"{kind} (no place: as drawn)"
    path, value, sub = cands[pick % len(cands)]
    where = ".".join(map(str, ("spec", *path)))
    if kind == "wrong_type":
        _set(spec, path, _wrong_type(sub))
    elif kind == "out_of_range":
        if "minItems" in sub:
            _set(spec, path, [])
        elif "maximum" in sub and (pick % 2 or "minimum" not in sub):
            _set(spec, path, sub["maximum"] + 1 + pick % 1000)
        else:
            _set(spec, path, sub["minimum"] - 1 - pick % 1000)
    elif kind == "bad_enum":
        _set(spec, path, "NotAnEnumValue")
    elif kind == "too_long":
        if "maxItems" in sub:
            item = (value or [None])[0] if isinstance(value, list) else None
            _set(spec, path, [copy.deepcopy(item) for _ in range(sub["maxItems"] + 1)])
        else:
            _set(spec, path, "x" * (sub["maxLength"] + 1))
    elif kind == "drop_required":
        value.pop(sub["required"][pick % len(sub["required"])], None)
    else:
        value[f"unknownField{pick % 7}"] = pick
    return spec, f"{kind} at {where}"


NODE = "fuzz-gpu-0"
NODE_LABELS = {"modeldeploy.dev/fuzz": "yes", "nvidia.com/gpu.product": "FUZZ-GPU"}


def node() -> dict[str, Any]:
    """The one node of the fuzz: huge, untainted, no GPU memory label. `fit` points a spec at it, so
    the operator goes past `Degraded/Unschedulable` and builds and creates children from the spec."""
    # below 1000: the API server writes 1000 back as "1k", and NodeInfo.from_node reads only plain integers
    alloc = {"cpu": "512", "memory": "64Ti", "pods": "500", "nvidia.com/gpu": "512"}
    return {
        "metadata": {"name": NODE, "labels": NODE_LABELS},
        "status": {
            "capacity": alloc,
            "allocatable": alloc,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fuzz"}],
        },
    }


def fit(spec: dict[str, Any]) -> dict[str, Any]:
    """`spec` with its node selector and GPU type pointed at NODE (everything else as drawn)."""
    spec = copy.deepcopy(spec)
    topo = spec.setdefault("topology", {})
    topo["nodeSelector"] = {"modeldeploy.dev/fuzz": "yes"}
    if "gpuType" in topo:
        topo["gpuType"] = NODE_LABELS["nvidia.com/gpu.product"]
    return spec


def outside(
    rng: random.Random, spec: dict[str, Any], schema: dict[str, Any], share: float
) -> tuple[dict, str]:
    """With probability `share` one mutation, its kind and place chosen uniformly by `rng` (seeded):
    hypothesis' own choices lean to the first and the smallest, which made nearly every spec a wrong type."""
    if rng.random() >= share:
        return (fit(spec), "fitted") if rng.random() < 0.5 else (spec, "as drawn")
    return mutate(spec, schema, rng.choice(MUTATIONS), rng.randrange(10**6))


# --- outcomes ----------------------------------------------------------------------------------
PATH = re.compile(r"(^|[\s\"'(\[])\.?spec(\.|\[|:|\b)")


def refusal_paths(status: int, body: str) -> tuple[list[str], str]:
    """The field paths a refusal names (causes' `field`, else `spec...` in the message) and its message."""
    try:
        doc = json.loads(body)
    except ValueError:
        return ([], body[:300])
    msg = str(doc.get("message", ""))
    fields = [c.get("field", "") for c in (doc.get("details") or {}).get("causes") or [] if c.get("field")]
    fields = [f for f in fields if f.lstrip(".").startswith(("spec", "metadata"))]
    if not fields and PATH.search(msg):
        fields = [m.group(0).strip(" \"'([") for m in PATH.finditer(msg)]
    return fields, msg


@dataclass
class Counts:
    generated: int = 0
    refused_with_path: int = 0
    refused_without_path: int = 0
    server_errors: int = 0  # 5xx
    accepted: int = 0
    accepted_reconciled: int = 0
    accepted_invalid_spec: int = 0  # of the reconciled: Degraded/InvalidSpec (the API types refuse it)
    accepted_operator_error: int = 0
    operator_crashes: int = 0
    operator_log_unattributed: int = 0  # warnings/tracebacks naming no object
    mutations: collections.Counter[str] = field(default_factory=collections.Counter)
    phases: collections.Counter[str] = field(default_factory=collections.Counter)
    refusal_kinds: collections.Counter[str] = field(default_factory=collections.Counter)
    invalid_spec_fields: collections.Counter[str] = field(default_factory=collections.Counter)
    phase_examples: dict[str, str] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)

    def clean(self) -> bool:
        return not (
            self.refused_without_path
            or self.server_errors
            or self.accepted_operator_error
            or self.operator_crashes
            or self.operator_log_unattributed
        )


class Fuzzer:
    """Applies specs to the API server and checks the operator's answer to the accepted ones, in batches."""

    def __init__(
        self,
        kubeconfig: str,
        operator_log: Path,
        batch: int = 100,
        settle_timeout: float = 120.0,
        namespace: str = NS,
    ) -> None:
        from kubernetes import client, config

        from modeldeploy_dev.operator_process import OperatorProcess

        self.api_client = config.new_client_from_config(kubeconfig)
        self.custom = client.CustomObjectsApi(self.api_client)
        self.core = client.CoreV1Api(self.api_client)
        self.apps = client.AppsV1Api(self.api_client)
        self.net = client.NetworkingV1Api(self.api_client)
        self.ns, self.batch, self.settle_timeout = namespace, batch, settle_timeout
        self.counts = Counts()
        self.pending: dict[str, str] = {}  # name -> what was done to its spec
        self.n = 0
        self.log_offset = 0
        self.log_errors: dict[str, str] = {}  # object name -> its first warning line
        self.unattributed: list[str] = []  # warning lines that name no object
        self.reported = 0  # of unattributed, counted so far
        self.operator = OperatorProcess(kubeconfig, namespace, operator_log)

    def start(self) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        from modeldeploy_dev.crd_install import apply_crd
        from modeldeploy_dev.wait import wait_until

        apply_crd(client.ApiextensionsV1Api(self.api_client))
        body = node()
        self.core.create_node({"metadata": body["metadata"]})
        self.core.patch_node_status(NODE, {"status": body["status"]})
        self.core.create_namespace({"metadata": {"name": self.ns}})
        # a new CRD's storage answers 429 "(re)initializing" for a moment: the operator's first watch would
        # log that as an ERROR that no spec caused
        wait_until(
            lambda: self.custom.list_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL) is not None,
            60, 0.2, "the ModelDeployment list", ignore=(ApiException,),
        )  # fmt: skip
        self.operator.start()
        wait_until(lambda: self._operator_healthy(), 120, 0.5, "the operator's /healthz", ignore=(OSError,))

    def _operator_healthy(self) -> bool:
        import urllib.request

        if self.operator.proc is None or self.operator.proc.poll() is not None:
            raise RuntimeError(f"the operator exited before it was ready:\n{self.operator.tail()}")
        with urllib.request.urlopen(f"http://127.0.0.1:{self.operator.health_port}/healthz", timeout=5) as r:
            return r.status == 200

    def stop(self) -> None:
        self.operator.stop()
        self.api_client.close()

    def apply(self, spec: dict[str, Any], what: str) -> None:
        """Create one ModelDeployment with `spec`; record its refusal, or queue it for the operator."""
        from kubernetes.client.exceptions import ApiException

        c = self.counts
        c.generated += 1
        c.mutations[what.split(" ")[0]] += 1
        self.n += 1
        name = f"fz-{self.n:05d}"
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": {"name": name}, "spec": spec}
        try:
            self.custom.create_namespaced_custom_object(
                GROUP, VERSION, self.ns, PLURAL, body, field_validation="Strict"
            )
        except ApiException as e:
            self._refused(name, what, e.status or 0, e.body or "")
            return
        except ValueError as e:  # the client itself would not send it: not the API server's answer
            c.findings.append(f"{name} ({what}): client refused to send: {e}")
            c.refused_without_path += 1
            return
        c.accepted += 1
        self.pending[name] = what
        if len(self.pending) >= self.batch:
            self.settle()

    def _refused(self, name: str, what: str, status: int, body: str) -> None:
        c = self.counts
        if status >= 500 or status == 0:
            c.server_errors += 1
            c.findings.append(f"{name} ({what}): HTTP {status}: {body[:400]}")
            return
        fields, msg = refusal_paths(status, body)
        c.refusal_kinds[str(status)] += 1
        if fields:
            c.refused_with_path += 1
        else:
            c.refused_without_path += 1
            c.findings.append(f"{name} ({what}): HTTP {status} without a field path: {msg[:400]}")

    def settle(self) -> None:
        """Wait for the operator's status on every pending object, check its log and liveness, clean up."""
        from modeldeploy_dev.wait import wait_until

        if not self.pending:
            return
        c = self.counts
        seen: dict[str, dict[str, Any]] = {}

        def all_answered() -> bool:
            listed = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL)["items"]
            for m in listed:
                name, status = m["metadata"]["name"], m.get("status") or {}
                gen = m["metadata"].get("generation")
                if name in self.pending and status.get("phase") and status.get("observedGeneration") == gen:
                    seen[name] = status
            self._scan_log()  # an object the operator failed on gets no status: stop waiting for it
            return set(self.pending) <= set(seen) | set(self.log_errors) or not self._operator_alive()

        try:
            wait_until(all_answered, self.settle_timeout, 0.5, "a status on every accepted object")
        except TimeoutError:
            pass
        self._scan_log()
        errors = self.log_errors
        for name, what in self.pending.items():
            status = seen.get(name)
            if status is None or name in errors:
                c.accepted_operator_error += 1
                why = errors.get(name) or "no status written for its generation in time"
                c.findings.append(f"{name} ({what}): {why}")
                continue
            c.accepted_reconciled += 1
            conds = status.get("conditions") or []
            degraded = [x for x in conds if x.get("type") == "Degraded" and x.get("status") == "True"]
            phase = "/".join([status["phase"], *(str(x.get("reason")) for x in degraded)])
            c.phases[phase] += 1
            c.phase_examples.setdefault(phase, f"{name} ({what}): {[x.get('message') for x in degraded]}")
            invalid = [x for x in degraded if x.get("reason") == "InvalidSpec"]
            if invalid:
                c.accepted_invalid_spec += 1
                for part in str(invalid[0].get("message", "")).split("; "):
                    c.invalid_spec_fields[part.split(":")[0]] += 1
        for line in self.unattributed[self.reported :]:
            c.operator_log_unattributed += 1
            c.findings.append(f"operator log, no object named: {line}")
        self.reported = len(self.unattributed)
        if not self._operator_alive():
            c.operator_crashes += 1
            c.findings.append(f"the operator exited:\n{self.operator.tail()}")
            self.operator.start()
        self.pending.clear()
        self._clean()

    def _operator_alive(self) -> bool:
        return self.operator.proc is not None and self.operator.proc.poll() is None

    def _scan_log(self) -> None:
        """WARNING/ERROR/CRITICAL lines and tracebacks in the operator's log, read on from where the last
        scan stopped: the first per object name in `log_errors`, those naming none in `unattributed`."""
        if not self.operator.log.exists():
            return
        with open(self.operator.log, "rb") as fh:
            fh.seek(self.log_offset)
            new = fh.read()
        new = new[: new.rfind(b"\n") + 1]  # a line still being written is read next time
        self.log_offset += len(new)
        for line in new.decode(errors="replace").splitlines():
            if not re.search(r"\b(WARNING|ERROR|CRITICAL)\b|Traceback", line):
                continue
            names = re.findall(r"\bfz-\d{5}\b", line)
            for n in names:
                self.log_errors.setdefault(n, line.strip()[:400])
            if not names:
                self.unattributed.append(line.strip()[:400])

    def _clean(self) -> None:
        """Delete the batch's ModelDeployments, then their children: nothing here garbage-collects them."""
        ns = self.ns
        self.custom.delete_collection_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
        with ThreadPoolExecutor(4) as ex:
            for fn in (
                self.apps.delete_collection_namespaced_deployment,
                self.core.delete_collection_namespaced_service,
                self.net.delete_collection_namespaced_network_policy,
                self.core.delete_collection_namespaced_event,
            ):
                ex.submit(fn, ns)


def fuzz(fz: Fuzzer, examples: int, seed_value: int, mutate_share: float = 0.5) -> Counts:
    """Draw `examples` specs with a fixed seed and apply each; the property never fails (no shrinking),
    the counts are the result."""
    schema = crd_spec_schema()
    rng = random.Random(seed_value)

    @seed(seed_value)
    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        derandomize=False,
        phases=(__import__("hypothesis").Phase.generate,),
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy(schema))
    def run(drawn: dict[str, Any]) -> None:
        fz.apply(*outside(rng, drawn, schema, mutate_share))

    run()
    fz.settle()
    return fz.counts


def finding_kind(finding: str) -> str:
    """A finding without what varies between objects (names, times, values), to group them."""
    text = finding.split("): ", 1)[-1]
    text = re.sub(r"^\S+ \S+ WARNING \S+ reconcile \('[^']*', '[^']*'\): ", "", text)
    text = re.sub(r"fz-\d{5}(-[0-9a-f]+)?", "NAME", text)
    return re.sub(r'"[^"]*"|\'[^\']*\'|\d+', "_", text)[:160]


def report(c: Counts, wall: float, argv: list[str]) -> str:
    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True, capture_output=True
    ).stdout.strip()
    lines = [
        f"git {rev}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])}: `{' '.join(argv)}`",
        "",
        "| outcome | count |",
        "|---|---:|",
        f"| generated | {c.generated} |",
        f"| refused by the API server, with a field path | {c.refused_with_path} |",
        f"| refused without a field path (finding) | {c.refused_without_path} |",
        f"| API server 5xx (finding) | {c.server_errors} |",
        f"| accepted | {c.accepted} |",
        "| accepted and reconciled (status for its generation, no operator warning) | "
        f"{c.accepted_reconciled} |",
        f"| of which Degraded/InvalidSpec (API types refuse what the schema let through) | "
        f"{c.accepted_invalid_spec} |",
        f"| accepted with an operator error (finding) | {c.accepted_operator_error} |",
        f"| operator crashes (finding) | {c.operator_crashes} |",
        f"| operator log warnings naming no object (finding) | {c.operator_log_unattributed} |",
        "",
        f"Wall time {wall:.0f} s. Refusals by HTTP status: {dict(c.refusal_kinds)}. "
        f"Phases of the reconciled: {dict(c.phases)}.",
        f"Specs by mutation: {dict(sorted(c.mutations.items()))}.",
    ]
    if c.invalid_spec_fields:
        lines.append(f"InvalidSpec fields (top 10): {dict(c.invalid_spec_fields.most_common(10))}.")
    lines += ["", "One reconciled object per phase/reason:", ""]
    lines += [f"- {k}: {v[:300]}" for k, v in sorted(c.phase_examples.items())]
    if c.findings:
        kinds = collections.Counter(finding_kind(f) for f in c.findings)
        lines += ["", f"Findings ({len(c.findings)}), by kind (count, then the first of each):", ""]
        for kind, n in kinds.most_common():
            first = next(f for f in c.findings if finding_kind(f) == kind)
            lines.append(f"- {n} x {first[:700]}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=10000, help="specs to generate (default 10000)")
    ap.add_argument("--seed", type=int, default=39, help="hypothesis seed (default 39)")
    ap.add_argument("--batch", type=int, default=100, help="accepted objects per reconcile check")
    ap.add_argument("--settle-timeout", type=float, default=120.0, help="seconds for a batch's statuses")
    ap.add_argument("--mutate-share", type=float, default=0.5, help="share of specs mutated (0..1)")
    ap.add_argument("--keep", action="store_true", help="keep the control plane's temp dir and logs")
    a = ap.parse_args()
    if a.examples < 1 or a.batch < 1 or not 0 <= a.mutate_share <= 1:
        ap.error("--examples and --batch must be >= 1 and --mutate-share within 0..1")
    from modeldeploy_dev.control_plane import ControlPlane, missing

    if gone := missing():
        print(f"not built: {', '.join(map(str, gone))}; run `make cluster-build`", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    with ControlPlane(keep=a.keep) as cp:
        print(f"control plane up in {time.monotonic() - t0:.1f}s ({cp.dir})", file=sys.stderr)
        fz = Fuzzer(str(cp.kubeconfig), cp.dir / "operator.log", a.batch, a.settle_timeout)
        try:
            fz.start()
            t1 = time.monotonic()
            counts = fuzz(fz, a.examples, a.seed, a.mutate_share)
            wall = time.monotonic() - t1
        finally:
            fz.stop()
    print(report(counts, wall, ["bench/crd_fuzz.py", *sys.argv[1:]]))
    return 0 if counts.clean() else 1


if __name__ == "__main__":
    os.environ.setdefault("MODELDEPLOY_RESYNC_SECONDS", "30")
    sys.exit(main())
