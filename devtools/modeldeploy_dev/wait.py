"""`wait_until`: the one polling loop of the tests, harnesses and benchmarks.

Tests on shared, noisy machines wait for a condition with a generous timeout instead of
sleeping a fixed time; every such wait goes through here, so each one fails the same way:
a TimeoutError naming what was awaited, the timeout and the last value seen.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    pred: Callable[[], T | None],
    timeout: float,
    interval: float = 0.5,
    what: str = "the condition",
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call `pred` every `interval` seconds until it returns something truthy, and return that.

    An exception of a type in `ignore` counts as "not yet" (the last one is chained to the
    TimeoutError); any other exception, an assertion included, propagates at once. `pred` may
    return None for "not yet", which is why the result is typed without it.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    error: BaseException | None = None
    while True:
        try:
            value, error = pred(), None
            if value:
                return value
            last = value
        except ignore as e:
            error = e
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what} (last: {last!r})") from error
        time.sleep(interval)
