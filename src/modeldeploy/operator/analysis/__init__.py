"""Canary analysis: how a canary is judged against stable, and where the figures come from.

Owns the verdicts (`verdicts`, pure), the metric sources behind one protocol (`sources`: the pod
scrape in `scrape`, Prometheus in `promql`), reaching serving pods over HTTP (`pods`) and the
conformance gate (`gate`). May import `api`, `conformance`, httpx and the pure manifest constants
of `rollout.children`; never `controller` or a Kubernetes client.
"""
