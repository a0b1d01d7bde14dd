"""runtime/engine/heap.py: freezing after load takes every live object out of the collector's walk."""

from __future__ import annotations

import subprocess
import sys


def test_freeze_after_load_freezes_the_live_heap_in_a_fresh_interpreter() -> None:
    # in a child interpreter: gc.freeze() is global and must never touch the test runner's heap
    code = (
        "import gc\n"
        "from modeldeploy.runtime.engine.heap import freeze_after_load\n"
        "kept = [[i] for i in range(50_000)]\n"
        "n = freeze_after_load()\n"
        "assert n == gc.get_freeze_count() and n > 50_000, n\n"
        "assert gc.get_count()[2] == 0\n"
        "print(n)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 50_000
