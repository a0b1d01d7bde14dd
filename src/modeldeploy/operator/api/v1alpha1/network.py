"""Who may reach a ModelDeployment's serving pods (spec.network): the NetworkPolicy the operator writes.

Ingress only. The pods' own egress needs are few and deployment-specific (DNS, the OTLP collector, an
object store or registry the fetch init container reads the model from), so a default egress rule would
either be too open to mean anything or break a model fetch; egress stays the cluster's default.

The runtime serves the API and /metrics on one port (`http`, 8000), and a NetworkPolicy is L4: the
monitoring and operator sources can reach the API too. The API key (bundle.config.apiKeySecretRef)
guards the API routes; the policy decides who gets a TCP connection at all.

Selectors follow metav1.LabelSelector (matchLabels, matchExpressions) and the API server checks them
at admission: label values and expression keys by pattern, operators by enum, matchLabels keys, In/NotIn
values and a peer naming no selector by CEL rules (each map bounded by maxProperties, so the API server's
cost estimate of the key regex stays within its budget; checked against kube-apiserver 1.36).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from modeldeploy.operator.api.v1alpha1._model import _Model
from modeldeploy.operator.api.v1alpha1.common import _cel

# metav1 label value: at most 63, alphanumeric at both ends, '-', '_' and '.' inside (or empty)
LABEL_VALUE_RE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# metav1 qualified name: an optional DNS-subdomain prefix and '/', then a name like a label value
LABEL_KEY_RE = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
MAX_PEERS = 32
MAX_TERMS = 16
MSG_LABEL_KEY = (
    "must be a label key: an optional DNS subdomain prefix (at most 253) and '/', then a name of at most "
    "63 alphanumerics, '-', '_' or '.' that starts and ends alphanumeric"
)
MSG_VALUES = "matchExpressions: operator In and NotIn need values, Exists and DoesNotExist take none"
MSG_PEER = "name a namespaceSelector, a podSelector or both (an empty selector {} selects all)"
MONITORING_NAMESPACE = "monitoring"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set on every namespace by the API server (1.21+)


def _check_key(key: str) -> str:
    prefix, _, name = key.rpartition("/")
    if not re.fullmatch(LABEL_KEY_RE, key) or len(prefix) > 253 or len(name) > 63:
        raise ValueError(f"{key!r} {MSG_LABEL_KEY}")
    return key


LabelKey = Annotated[str, Field(max_length=317, pattern=LABEL_KEY_RE), AfterValidator(_check_key)]
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_RE)]
# a matchLabels key: a pattern on it would become patternProperties, which a structural CRD schema cannot
# carry, so the CRD checks map keys with a CEL rule on the map instead
MapLabelKey = Annotated[str, AfterValidator(_check_key)]


def _cel_re(pattern: str) -> str:
    """A regex inside a single-quoted CEL string literal: backslashes doubled."""
    return pattern.replace("\\", "\\\\")


class SelectorRequirement(_Model):
    """One matchExpressions term (metav1.LabelSelectorRequirement)."""

    model_config = ConfigDict(
        json_schema_extra=_cel(
            "(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)", MSG_VALUES
        )
    )
    key: LabelKey = Field(description="Label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="How key and values relate."
    )
    values: list[LabelValue] = Field(
        default_factory=list, max_length=64, description="Values (In, NotIn); empty for Exists, DoesNotExist."
    )

    @model_validator(mode="after")
    def _values_fit_operator(self) -> SelectorRequirement:
        if (self.operator in ("In", "NotIn")) != bool(self.values):
            raise ValueError(f"{MSG_VALUES} (got {self.operator} with {len(self.values)} values)")
        return self


class Selector(_Model):
    """A label selector (metav1.LabelSelector): every matchLabels pair and every expression must hold."""

    match_labels: dict[MapLabelKey, LabelValue] = Field(
        default_factory=dict,
        description="Labels that must be equal.",
        json_schema_extra={
            "maxProperties": MAX_TERMS,
            **_cel(
                f"self.all(k, size(k) <= 317 && k.matches('{_cel_re(LABEL_KEY_RE)}'))",
                f"keys {MSG_LABEL_KEY}",
            ),
        },
    )
    match_expressions: list[SelectorRequirement] = Field(
        default_factory=list, max_length=MAX_TERMS, description="Set-based requirements."
    )

    def to_k8s(self) -> dict[str, object]:
        out: dict[str, object] = {}
        if self.match_labels:
            out["matchLabels"] = dict(self.match_labels)
        if self.match_expressions:
            out["matchExpressions"] = [
                {"key": e.key, "operator": e.operator, **({"values": list(e.values)} if e.values else {})}
                for e in self.match_expressions
            ]
        return out


class Peer(_Model):
    """A source of traffic, as a NetworkPolicy peer: namespaceSelector alone (every pod of those
    namespaces), podSelector alone (those pods of the ModelDeployment's namespace), or both (those pods
    of those namespaces)."""

    model_config = ConfigDict(
        json_schema_extra=_cel("has(self.namespaceSelector) || has(self.podSelector)", MSG_PEER)
    )
    namespace_selector: Selector | None = Field(default=None, description="Namespaces, by their labels.")
    pod_selector: Selector | None = Field(default=None, description="Pods, by their labels.")

    @model_validator(mode="after")
    def _names_one(self) -> Peer:
        if self.namespace_selector is None and self.pod_selector is None:
            raise ValueError(MSG_PEER)
        return self

    def to_k8s(self) -> dict[str, object]:
        out: dict[str, object] = {}
        if self.namespace_selector is not None:
            out["namespaceSelector"] = self.namespace_selector.to_k8s()
        if self.pod_selector is not None:
            out["podSelector"] = self.pod_selector.to_k8s()
        return out


def namespace_peer(namespace: str) -> Peer:
    """Every pod of one namespace, by the name label the API server sets on each namespace."""
    return Peer(namespace_selector=Selector(match_labels={NAMESPACE_NAME_LABEL: namespace}))


def _default_metrics_from() -> list[Peer]:
    return [namespace_peer(MONITORING_NAMESPACE)]


class Network(_Model):
    """The NetworkPolicy `<name>` on the serving pods (ingress only; see the module docstring)."""

    policy: bool = Field(
        default=True,
        description="Write a NetworkPolicy that admits only the sources below to the serving pods; false: "
        "none (and an existing one is deleted), every pod in the cluster can reach them.",
    )
    allow_from: list[Peer] | None = Field(
        default=None,
        max_length=MAX_PEERS,
        description="Who may reach the serving port. Unset: pods of the ModelDeployment's own namespace. "
        "Set: exactly these peers ([]: none). The namespaces of the Gateways in "
        "rollout.trafficRouting.gatewayAPI.parentRefs are always added (a Gateway whose data plane runs "
        "elsewhere, e.g. in its controller's namespace, needs that namespace listed here).",
    )
    metrics_from: list[Peer] = Field(
        default_factory=_default_metrics_from,
        max_length=MAX_PEERS,
        description="Who may scrape /metrics (it shares the serving port): by default the namespace "
        f"named {MONITORING_NAMESPACE!r}. The operator's own namespace is always added (it reads the "
        "pods' /metrics and /health/ready for analysis and load progress).",
    )
