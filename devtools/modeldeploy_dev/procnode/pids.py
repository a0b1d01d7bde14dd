"""Pod processes recorded by pid + start time, so a crashed node's leftovers can be killed safely."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


def kill_leftovers(state: Path) -> list[int]:
    """SIGKILL the process groups of pod processes recorded under <state>/pods/*/*.pid that are
    still the very process recorded; returns their pids. Used at node start and by `cluster down`."""
    killed = []
    for f in state.glob("pods/*/*.pid"):
        try:
            pid_s, start = f.read_text().split()
            pid = int(pid_s)
            alive_start = proc_start_time(pid)
        except (OSError, ValueError):
            f.unlink(missing_ok=True)
            continue
        if alive_start == start:  # the same process, not a later one that reused the pid
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
                killed.append(pid)
        f.unlink(missing_ok=True)
    return killed


def proc_start_time(pid: int) -> str:
    """Field 22 of /proc/<pid>/stat: with the pid, it identifies one process for good."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[19]


def alive(pid: int) -> bool:
    """The pid names a running process (or a zombie not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
