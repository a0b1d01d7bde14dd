"""The grammar compile thread both engine clients run `GrammarCompiler.compile` on, off the step loop."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor


def compile_pool() -> ThreadPoolExecutor:
    """One worker thread, named grammar-compile, at background priority: compiles queue behind each
    other instead of taking CPU from the step loop."""
    return ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="grammar-compile", initializer=background_priority
    )


def background_priority() -> None:
    """Run grammar compiles at a lower CPU priority than the step loop (Linux threads carry their own
    nice value), so a large schema takes spare CPU instead of stretching other requests' steps."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):  # not Linux, or not permitted: plain priority
        pass
