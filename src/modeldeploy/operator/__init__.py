"""The ModelDeployment operator (kopf): no torch, no transformers, no runtime.

Packages, lowest first: `api` (the v1alpha1 types and what is generated from them: CRD, chart
schema, RBAC), `analysis` (canary verdicts, metric sources, the conformance gate), `rollout` (the
pure rollout machine and `plan()`), `controller` (the API client, watch-fed store, work queue and
the Controller that observes, plans and applies). `handlers`, `cli` and `rollout_cli` sit on top.
The import contracts in pyproject's `[tool.importlinter]` hold each package to its layer.
"""
