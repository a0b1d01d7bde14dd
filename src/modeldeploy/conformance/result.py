"""What one check found: verdict, raw observations, failures and caveats."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from modeldeploy.conformance.http import Server
from modeldeploy.conformance.prom import Metrics, scrape


@dataclass
class CheckResult:
    name: str
    required: bool = True
    verdict: str = "pass"  # pass | fail | skip
    observations: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def expect(self, ok: bool, message: str) -> bool:
        if not ok:
            self.failures.append(message)
            self.verdict = "fail"
        return ok

    def skip(self, why: str) -> None:
        if self.verdict != "fail":
            self.verdict = "skip"
        self.caveats.append(why)

    @property
    def ok(self) -> bool:
        return self.verdict != "fail" or not self.required

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Target:
    """The server under test and what the suite learned about it."""

    server: Server
    model: str
    bundle: dict[str, Any] | None = None  # /v1/bundle when the server is a modeldeploy runtime
    limit: int | None = None  # running-sequence limit, when the server says
    has_metrics: bool = False  # exposes modeldeploy_* Prometheus metrics
    max_model_len: int | None = None  # the model's context length, when /v1/models says (vLLM and ours do)

    @property
    def is_modeldeploy(self) -> bool:
        return self.bundle is not None

    def extra(self) -> dict[str, Any]:
        """Fixed-length outputs where the server supports it (ignore_eos is a modeldeploy/vLLM extension)."""
        return {"ignore_eos": True} if self.is_modeldeploy else {}

    def metrics(self) -> Metrics | None:
        return scrape(self.server) if self.has_metrics else None

    def wait_metrics(
        self, pred, timeout_s: float = 10.0, interval_s: float = 0.05
    ) -> tuple[Metrics | None, float]:
        """Poll /metrics until pred(metrics) holds (bounded); returns the last scrape and seconds waited."""
        t0 = time.monotonic()
        m = self.metrics()
        while m is not None and not pred(m) and time.monotonic() - t0 < timeout_s:
            time.sleep(interval_s)
            m = self.metrics()
        return m, time.monotonic() - t0
