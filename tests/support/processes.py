"""Process liveness for the tests that kill or wait on server and rank processes."""

from __future__ import annotations


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone, or reaped between the open and the read
        return False
