"""Freeze what loading left on the Python heap, so the garbage collector never walks it while serving.

Loading a model leaves hundreds of thousands of long-lived objects behind: modules, the tokenizer, the
model's modules and parameters, configs. CPython's full (generation 2) collection walks every one of
them, and the short-lived containers each request allocates (a parsed body, its messages and tools,
per-step bookkeeping) trigger one every few seconds. Measured with `gc.callbacks` on the real model
(bench/results/hostile_input.md, 2026-12-05): full collections of 250-450 ms in the serving processes
while a stream ran, each one a stall of that stream's tokens. `gc.freeze()` after load moves those
objects into a permanent generation the collector skips (vLLM does the same after its startup); what
requests allocate afterwards is collected as before. Only for processes that serve: it is global to
the interpreter, so an in-process test server must not do it to the test runner's heap.
"""

from __future__ import annotations

import gc


def freeze_after_load() -> int:
    """Collect once, then freeze every object alive; returns how many objects are now frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
