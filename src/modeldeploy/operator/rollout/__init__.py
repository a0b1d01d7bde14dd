"""The rollout decision, pure: the state machine (`machine`), `plan()` and the manifests it asks for.

Owns the actions vocabulary, capacity and topology fits, child manifests, traffic routing, drift
detection, bundle identity, status conditions and the manual commands. May import `api` and the
pure `analysis.verdicts`; never `controller`, a Kubernetes client, kopf or an HTTP client.
"""
