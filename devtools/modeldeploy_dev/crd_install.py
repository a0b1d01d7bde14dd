"""Create or replace the ModelDeployment CRD (generated from the API types) on a cluster, then wait
until the API server has it Established: shared by `modeldeploy demo` and bench/operator_scale.py."""

from __future__ import annotations

from typing import Any

from modeldeploy_dev.wait import wait_until


def apply_crd(ext: Any, timeout: float = 60) -> str:
    """`ext`: a kubernetes ApiextensionsV1Api. Returns the CRD's name; TimeoutError if never Established."""
    from kubernetes.client.exceptions import ApiException

    from modeldeploy.operator.api.crd import crd

    body = crd()
    name = body["metadata"]["name"]
    try:
        ext.create_custom_resource_definition(body)
    except ApiException as e:
        if e.status != 409:
            raise
        body["metadata"]["resourceVersion"] = ext.read_custom_resource_definition(
            name
        ).metadata.resource_version
        ext.replace_custom_resource_definition(name, body)

    def established() -> bool:
        conds = ext.read_custom_resource_definition(name).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conds)

    wait_until(established, timeout, 0.2, f"CRD {name} Established")
    return name
