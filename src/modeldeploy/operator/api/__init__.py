"""The operator's public API and what is generated from it.

Owns the ModelDeployment types (`v1alpha1`), the CRD generator (`crd`, `modeldeploy crd`), the
chart's typed values (`chart`) and the operator's RBAC rules (`rbac`). May import pydantic and
yaml only: nothing else of the operator, no Kubernetes client, no HTTP.
"""
