"""Bundle identity and the labels every child object carries.

The bundle id is a hash of the canonical JSON of `spec.bundle` *after* defaults are
applied, so writing a default explicitly does not start a rollout, while any real change
(image, model/tokenizer pin, serving config) yields a new id. It is short enough to be a
label value, so pods, Deployments, Services and metrics never silently mix two bundles.
"""

from __future__ import annotations

import hashlib
import json

from modeldeploy.operator.api.v1alpha1.bundle import Bundle

BUNDLE_LABEL = "modeldeploy.dev/bundle"
INSTANCE_LABEL = "app.kubernetes.io/instance"  # the owning ModelDeployment's name
COHORT_LABEL = "modeldeploy.dev/cohort"
MANAGED_BY = "modeldeploy-operator"
APP_NAME = "modeldeploy-serve"
ID_LEN = 16  # hex chars: 64 bits, far from collisions among one object's bundles


def canonical_json(bundle: Bundle) -> str:
    data = bundle.model_dump(mode="json", by_alias=True, exclude_none=True)
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def bundle_id(bundle: Bundle) -> str:
    return hashlib.sha256(canonical_json(bundle).encode()).hexdigest()[:ID_LEN]


def instance_labels(name: str) -> dict[str, str]:
    """Labels shared by every object of one ModelDeployment (the `<name>` Service selects these)."""
    return {
        "app.kubernetes.io/name": APP_NAME,
        INSTANCE_LABEL: name,
        "app.kubernetes.io/component": "serving",
        "app.kubernetes.io/part-of": "modeldeploy",
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def selector_labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": APP_NAME, INSTANCE_LABEL: name}


def bundle_labels(name: str, bid: str, revision: str | None = None) -> dict[str, str]:
    labels = instance_labels(name) | {BUNDLE_LABEL: bid}
    if revision and _label_value_ok(revision):
        labels["app.kubernetes.io/version"] = revision
    return labels


def _label_value_ok(v: str) -> bool:
    import re

    return len(v) <= 63 and re.fullmatch(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?", v) is not None


def deployment_name(name: str, bid: str) -> str:
    return f"{name}-{bid[:10]}"
