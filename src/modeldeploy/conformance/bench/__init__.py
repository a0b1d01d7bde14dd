"""`modeldeploy bench`: open-loop goodput at SLO for any OpenAI-compatible URL (httpx, no torch).

from modeldeploy.conformance.bench import Bench, BenchConfig, probe
bench = Bench(BenchConfig(urls=[url], rates=[1, 2]), [probe(url)])
bench.run(); bench.runs, bench.compare()

One concept per module: workload (what is sent), arrivals (when), client (one streamed
request), server (the target's pins and own metrics), stats (figures, SLOs, verdicts),
runner (rates, interleaving, capacity search), report (record, table, plot), cli.
"""

from modeldeploy.conformance.bench.runner import Bench, BenchConfig
from modeldeploy.conformance.bench.server import probe

__all__ = ["Bench", "BenchConfig", "probe"]
