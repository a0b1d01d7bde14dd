"""bench/tracing_cpu.py's interval for the on-vs-off difference: the "< 2 %" tracing claim rests
on its upper bound, so it must cover what it estimates and widen when neighbouring windows move
together (each "on" window is compared with the "off" windows on both sides of it)."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path
from statistics import mean, median

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("tracing_cpu", ROOT / "bench/tracing_cpu.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_the_interval_holds_the_estimate_and_narrows_with_more_windows() -> None:
    rng = random.Random(7)
    xs = [rng.gauss(1.0, 4.0) for _ in range(400)]
    lo, hi = bench.block_bootstrap(xs, mean)
    assert lo < mean(xs) < hi
    assert 0.5 < hi - lo < 1.3  # about 2 x 1.96 x 4 / sqrt(400) = 0.78
    few_lo, few_hi = bench.block_bootstrap(xs[:40], median)
    assert few_hi - few_lo > hi - lo


def test_windows_that_move_in_pairs_give_a_wider_interval_than_independent_ones() -> None:
    rng = random.Random(3)
    independent = [rng.gauss(0.0, 1.0) for _ in range(300)]
    paired = [x for x in (rng.gauss(0.0, 1.0) for _ in range(150)) for _ in range(2)]  # same spread
    w_ind = (lambda b: b[1] - b[0])(bench.block_bootstrap(independent, mean))
    w_pair = (lambda b: b[1] - b[0])(bench.block_bootstrap(paired, mean))
    assert w_pair > 1.2 * w_ind
