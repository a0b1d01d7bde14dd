"""Reading a server's Prometheus text: samples by name and label subset."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass
class Sample:
    name: str
    labels: dict[str, str]
    value: float


class Metrics:
    def __init__(self, text: str):
        self.samples = [
            Sample(s.name, dict(s.labels), s.value)
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
        ]

    def get(self, name: str, **labels: str) -> float | None:
        """Sum of the samples called `name` whose labels include `labels`; None if there are none."""
        hits = [
            s.value
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]
        return sum(hits) if hits else None

    def has(self, name: str) -> bool:
        return any(s.name == name for s in self.samples)

    def label_values(self, name: str, label: str) -> set[str]:
        return {s.labels[label] for s in self.samples if s.name == name and label in s.labels}


def scrape(server) -> Metrics | None:
    """The server's metrics, or None when it exposes none (not every engine does)."""
    try:
        r = server.get("/metrics")
        if r.status_code != 200:
            return None
        return Metrics(r.text)
    except Exception:  # noqa: BLE001 - an unparsable /metrics is "no metrics", recorded as a caveat
        return None
