"""wait_until: returns the first truthy value, retries ignored errors, names what timed out."""

from __future__ import annotations

import itertools

import pytest

from modeldeploy_dev.wait import wait_until


def test_returns_the_first_truthy_value() -> None:
    calls = itertools.count()
    assert wait_until(lambda: [n for n in [next(calls)] if n >= 3], 30, 0.001) == [3]


def test_ignored_errors_are_retried_others_propagate() -> None:
    calls = itertools.count()

    def flaky() -> str:
        if next(calls) < 2:
            raise ConnectionError("not yet")
        return "up"

    assert wait_until(flaky, 30, 0.001, ignore=(ConnectionError,)) == "up"

    def exited() -> bool:
        raise AssertionError("serve exited")

    with pytest.raises(AssertionError, match="exited"):
        wait_until(exited, 30, 0.001, ignore=(ConnectionError,))


def test_timeout_names_what_and_the_last_value() -> None:
    with pytest.raises(TimeoutError, match=r"timed out after 0s waiting for the pods \(last: 0\)"):
        wait_until(lambda: 0, 0, 0.001, what="the pods")
    with pytest.raises(TimeoutError) as e:
        wait_until(lambda: 1 / 0, 0, 0.001, ignore=(ZeroDivisionError,))
    assert isinstance(e.value.__cause__, ZeroDivisionError)
