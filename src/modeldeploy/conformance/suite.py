"""Run the serving-contract suite and write its evidence record.

The operator calls `run_conformance(ConformanceConfig(url=...))` on every canary before it
gets traffic (it expects an otherwise idle server); `modeldeploy conformance URL` does the
same from a shell. Required checks decide `passed`; every check keeps raw observations.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from modeldeploy.conformance import adapters, checks
from modeldeploy.conformance.http import Server
from modeldeploy.conformance.load import bounded_load
from modeldeploy.conformance.prom import scrape
from modeldeploy.conformance.result import CheckResult, Target
from modeldeploy.conformance.structured import structured_output

CHECKS = (
    "bundle_identity",
    "readiness",
    "normal_response",
    "streaming",
    "usage_accounting",
    "stop_sequences",
    "error_handling",
    "cancellation",
    "bounded_load",
    "adapters",
    "structured_output",  # only when the bundle declares structured output (structured_output=True)
)


@dataclass
class ConformanceConfig:
    url: str
    api_key: str | None = None
    model: str | None = None  # default: the first id in /v1/models
    requests: int = 8  # bounded load: N requests ...
    concurrency: int = 4  # ... from C client workers
    timeout_s: float = 60.0  # per HTTP request
    skip: list[str] = field(default_factory=list)
    expect_bundle: str | None = None  # require /v1/bundle and metric labels to name this bundle id
    structured_output: bool = False  # the bundle serves response_format json_schema: check it


@dataclass
class Report:
    config: dict[str, Any]
    bundle: dict[str, Any] | None
    checks: list[CheckResult]
    started_at: str
    seconds: float
    caveats: list[str]

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tool": "modeldeploy conformance",
            "passed": self.passed,
            "started_at": self.started_at,
            "seconds": round(self.seconds, 3),
            "config": self.config,
            "bundle": self.bundle,
            "caveats": self.caveats,
            "checks": [c.to_dict() for c in self.checks],
        }

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, default=str) + "\n")

    def table(self) -> str:
        rows = [f"{'check':<20} {'req':<4} {'verdict':<8} {'s':>6}  notes"]
        for c in self.checks:
            note = "; ".join(c.failures or c.caveats)[:110]
            rows.append(
                f"{c.name:<20} {'yes' if c.required else 'no':<4} {c.verdict:<8} {c.seconds:>6.2f}  {note}"
            )
        rows.append(f"{'RESULT':<20} {'':<4} {'PASS' if self.passed else 'FAIL'}")
        return "\n".join(rows)


def discover(server: Server, model: str | None) -> tuple[Target, list[str]]:
    """Learn the model name, the bundle, the running limit and whether modeldeploy metrics exist."""
    caveats: list[str] = []
    r = server.get("/v1/models")  # a transport error here means the server is unreachable
    try:
        models = r.json() if r.status_code == 200 else {}
    except ValueError:
        models = {}
    ids: list[str] = (
        # a card without a string id cannot be asked for by name, so it is no candidate
        [m["id"] for m in models.get("data", []) if isinstance(m, dict) and isinstance(m.get("id"), str)]
        if isinstance(models, dict)
        else []
    )
    if model is None:
        if not ids:
            raise ValueError(
                f"{server.base}/v1/models answered {r.status_code} and lists no model; pass --model"
            )
        model = ids[0]
    elif ids and model not in ids:
        caveats.append(f"--model {model!r} is not in /v1/models {ids}")
    entry = (
        next((m for m in models.get("data", []) if isinstance(m, dict) and m.get("id") == model), {})
        if isinstance(models, dict)
        else {}
    )
    max_len = entry.get("max_model_len")
    bundle = server.get_json("/v1/bundle")
    limit = None
    if isinstance(bundle, dict):
        limit = (bundle.get("server") or {}).get("max_num_seqs") or (bundle.get("engine_config") or {}).get(
            "max_num_seqs"
        )
    else:
        bundle = None
        caveats.append("server has no /v1/bundle: not a modeldeploy runtime; its pins are not recorded")
    m = scrape(server)
    has_metrics = m is not None and m.has("modeldeploy_requests_running")
    if not has_metrics:
        caveats.append(
            "no modeldeploy_* metrics: server-side evidence (cancellation, queueing) not collected"
        )
    elif m is not None and not m.label_values("modeldeploy_requests_running", "bundle"):
        caveats.append("modeldeploy metrics carry no 'bundle' label")
    max_len = max_len if isinstance(max_len, int) and max_len > 0 else None
    return Target(server, model, bundle, limit, has_metrics, max_len), caveats


def run_conformance(cfg: ConformanceConfig, log: Callable[[str], None] = lambda s: None) -> Report:
    unknown = set(cfg.skip) - set(CHECKS)
    if unknown:
        raise ValueError(f"--skip: unknown check(s) {sorted(unknown)}; choose from {', '.join(CHECKS)}")
    if cfg.requests < 1 or cfg.concurrency < 1:
        raise ValueError("--requests and --concurrency must be >= 1")
    started, t0 = datetime.now(UTC).isoformat(timespec="seconds"), time.monotonic()
    server = Server(cfg.url, cfg.api_key, cfg.timeout_s)
    config = {k: v for k, v in asdict(cfg).items() if k != "api_key"} | {
        "api_key_set": cfg.api_key is not None
    }
    try:
        target, caveats = discover(server, cfg.model)
        config["model"] = target.model

        def bundle_identity() -> CheckResult:
            assert cfg.expect_bundle is not None  # the loop below skips this check without one
            return checks.bundle_identity(target, cfg.expect_bundle)

        plan: dict[str, Callable[[], CheckResult]] = {
            "bundle_identity": bundle_identity,
            "readiness": lambda: checks.readiness(target),
            "normal_response": lambda: checks.normal_response(target),
            "streaming": lambda: checks.streaming(target),
            "usage_accounting": lambda: checks.usage(target),
            "stop_sequences": lambda: checks.stop_sequences(target),
            "error_handling": lambda: checks.errors(target),
            "cancellation": lambda: checks.cancellation(target),
            "bounded_load": lambda: bounded_load(target, cfg.requests, cfg.concurrency),
            "adapters": lambda: adapters.adapters(target),
            "structured_output": lambda: structured_output(target),
        }
        results = []
        for name in CHECKS:
            if name in cfg.skip or (name == "bundle_identity" and cfg.expect_bundle is None):
                continue
            if name == "structured_output" and not cfg.structured_output:
                continue
            log(f"running {name}")
            s = time.monotonic()
            try:
                res = plan[name]()
            except (httpx.HTTPError, ValueError, KeyError, TypeError, IndexError) as e:
                res = CheckResult(name)
                res.expect(False, f"check crashed on the server's answer: {type(e).__name__}: {e}")
            res.seconds = round(time.monotonic() - s, 3)
            results.append(res)
        return Report(config, target.bundle, results, started, time.monotonic() - t0, caveats)
    finally:
        server.close()
