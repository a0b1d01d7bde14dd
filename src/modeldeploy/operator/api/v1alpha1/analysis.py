"""How a canary is judged against stable (spec.rollout.analysis): thresholds, SLOs, Prometheus.

The Prometheus source carries its own regexes: each is checked twice, by pydantic (full match)
and by a CEL rule the API server runs, so a bad address or PromQL template is refused at apply.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from modeldeploy.operator.api.v1alpha1._model import _Model
from modeldeploy.operator.api.v1alpha1.common import _cel
from modeldeploy.operator.api.v1alpha1.quality import Quality


class SLO(_Model):
    ttft_seconds: float = Field(default=1.0, gt=0, description="Time-to-first-token SLO for goodput.")
    inter_token_seconds: float = Field(default=0.1, gt=0, description="Inter-token latency SLO for goodput.")


# Prometheus as the analysis source: the address, the label selector and PromQL templates.
PROM_URL_RE = r"^https?://([A-Za-z0-9.-]+|\[[0-9a-fA-F:.]+\])(:[0-9]{1,5})?(/[A-Za-z0-9._~%+=:@/-]*)?$"
_PROM_MATCHER = r'[ ]*[a-zA-Z_][a-zA-Z0-9_]*[ ]*(=|!=|=~|!~)[ ]*"[^"]*"[ ]*'  # one label matcher
PROM_MATCHERS_RE = rf"^({_PROM_MATCHER}(,{_PROM_MATCHER})*,?[ ]*)?$"
PROM_DURATION_RE = r"^[1-9][0-9]{0,6}(s|m|h)$"


def _only_placeholders(*names: str) -> str:
    """Regex: every `{word}` in the text is one of `names` (PromQL's own braces hold no bare word)."""
    known = "|".join(names)
    return f"^([^{{]|[{{]({known})[}}]|[{{][}}]|[{{][a-zA-Z0-9_]*([^a-zA-Z0-9_}}]|$))*$"


PROM_TEMPLATE_RE = _only_placeholders("bundle", "namespace", "selector", "window")
PROM_SELECTOR_RE = _only_placeholders("bundle", "namespace")
MSG_PROM_URL = (
    "prometheus.address must be an http:// or https:// URL: scheme://host[:port][/path], "
    "no credentials or query"
)
MSG_PROM_SELECTOR = (
    'prometheus.selector must be comma-separated PromQL label matchers such as namespace="{namespace}" '
    "(placeholders: {bundle}, {namespace})"
)
MSG_PROM_QUERY = (
    "prometheus.queries: a template must contain {bundle} and no placeholders other than "
    "{bundle}, {namespace}, {selector}, {window}"
)
MSG_PROM_WINDOW = "prometheus.window must be a PromQL duration in whole s, m or h, e.g. 5m"


def _full(pattern: str, message: str, contains: str = "") -> AfterValidator:
    """Like `_matches`, but the whole string (re.match's `$` accepts a trailing newline; RE2's does not)."""

    def check(v: str) -> str:
        if not re.fullmatch(pattern, v) or contains not in v:
            raise ValueError(f"{message} (got {v!r})")
        return v

    return AfterValidator(check)


def _cel_all(message: str, *patterns: str, contains: str = "") -> dict[str, Any]:
    """One CEL rule for several checks; a regex backslash is doubled inside the CEL string literal."""
    rules = [f"self.matches('{p}')".replace("\\", "\\\\") for p in patterns]
    rules += [f"self.contains('{contains}')"] if contains else []
    return _cel(" && ".join(rules), message)


PromAddress = Annotated[
    str,
    _full(PROM_URL_RE, MSG_PROM_URL),
    Field(max_length=2048, json_schema_extra=_cel_all(MSG_PROM_URL, PROM_URL_RE)),
]
PromSelector = Annotated[
    str,
    _full(PROM_MATCHERS_RE, MSG_PROM_SELECTOR),
    _full(PROM_SELECTOR_RE, MSG_PROM_SELECTOR),
    Field(max_length=1024, json_schema_extra=_cel_all(MSG_PROM_SELECTOR, PROM_MATCHERS_RE, PROM_SELECTOR_RE)),
]
PromWindow = Annotated[
    str,
    _full(PROM_DURATION_RE, MSG_PROM_WINDOW),
    Field(max_length=16, json_schema_extra=_cel_all(MSG_PROM_WINDOW, PROM_DURATION_RE)),
]
PromQLTemplate = Annotated[
    str,
    _full(PROM_TEMPLATE_RE, MSG_PROM_QUERY, contains="{bundle}"),
    Field(max_length=4096, json_schema_extra=_cel_all(MSG_PROM_QUERY, PROM_TEMPLATE_RE, contains="{bundle}")),
]


class PrometheusQueries(_Model):
    """PromQL templates replacing the built-in ones (see operator/analysis/promql.py for the defaults).

    Each returns one cohort's increase over the window: the histogram ones one series per
    `le` (cumulative counts, +Inf included), the outcome one one series per `outcome`.
    """

    ttft_buckets: PromQLTemplate | None = Field(
        default=None, description="Time-to-first-token bucket increases, by le."
    )
    itl_buckets: PromQLTemplate | None = Field(
        default=None, description="Inter-token latency bucket increases, by le."
    )
    outcomes: PromQLTemplate | None = Field(
        default=None,
        description="Finished requests by outcome (completed, error, rejected, invalid, cancelled).",
    )


class PrometheusSource(_Model):
    """Where canary analysis reads the cohorts' metrics when it does not scrape the pods itself."""

    address: PromAddress = Field(
        description="Prometheus HTTP API base URL, e.g. http://prometheus-operated.monitoring.svc:9090."
    )
    selector: PromSelector = Field(
        default='namespace="{namespace}"',
        description="Label matchers added to every query next to bundle=; "
        "placeholders {namespace}, {bundle}.",
    )
    window: PromWindow | None = Field(
        default=None,
        description="Fixed PromQL range (e.g. 5m); default: since the current step began, at most 1h.",
    )
    queries: PrometheusQueries = Field(
        default_factory=PrometheusQueries, description="PromQL templates overriding the built-in ones."
    )


class Analysis(_Model):
    interval_seconds: int = Field(
        default=30, ge=5, le=3600, description="How often canary is compared to stable."
    )
    min_samples: int = Field(
        default=50, ge=1, description="Below this many requests per cohort the verdict is Inconclusive."
    )
    max_ttft_p95_ratio: float = Field(
        default=1.2, gt=0, description="Fail when canary TTFT p95 > ratio * stable."
    )
    max_inter_token_p95_ratio: float = Field(
        default=1.2, gt=0, description="Fail when canary ITL p95 > ratio * stable."
    )
    max_error_rate: float = Field(
        default=0.01, ge=0, le=1, description="Fail when canary error rate exceeds this."
    )
    min_goodput_ratio: float = Field(
        default=0.95, ge=0, description="Fail when canary goodput < ratio * stable."
    )
    slo: SLO = Field(default_factory=SLO, description="Latency SLOs that define goodput.")
    on_inconclusive: Literal["Hold", "Rollback"] = Field(
        default="Hold",
        description="An Inconclusive verdict (too few samples, metrics unreadable) after the step's pause: "
        "Hold keeps the step until a verdict or progressDeadlineSeconds; Rollback rolls back at once "
        "(reason AnalysisInconclusive).",
    )
    prometheus: PrometheusSource | None = Field(
        default=None,
        description="Read the cohorts' metrics from a Prometheus HTTP API; "
        "default: scrape cohort pods' /metrics.",
    )
    quality: Quality | None = Field(
        default=None,
        description="The quality gate: canary against stable on a pinned evaluation set, answered greedily, "
        "after the conformance gate and before any traffic; a failure rolls back (QualityFailed). "
        "`quality: {}` runs it on the built-in set.",
    )
