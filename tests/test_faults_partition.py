"""faults.Partition, the chaos runs' network cut (bench/chaos.py partition-*): one process loses its
path to an address while every other process keeps it, and everything is undone on exit.

Real parts: a real HTTP server on loopback, a real child process connecting to it, a real cgroup v2
and a real iptables rule. Needs root, iptables and a cgroup2 mount (skips, saying which, without).
"""

from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from modeldeploy_dev.faults import Partition, cgroup2_root

HYBRID = """cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""


def test_cgroup2_root_is_read_from_the_mounts() -> None:
    assert cgroup2_root(HYBRID) == Path("/sys/fs/cgroup/unified")
    assert cgroup2_root("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n") == Path("/sys/fs/cgroup")
    with pytest.raises(RuntimeError, match="no cgroup2 hierarchy"):
        cgroup2_root("cgroup /sys/fs/cgroup/memory cgroup rw 0 0\n")


def test_partition_refuses_no_addresses() -> None:
    with pytest.raises(ValueError, match="no addresses"):
        Partition(os.getpid(), []).__enter__()


# The child connects once per line it reads on stdin and answers "ok" or the error's name: each probe
# is bounded (0.5 s connect timeout) and the test sends a bounded number of them.
PROBE = """
import socket, sys
port = int(sys.argv[1])
for line in sys.stdin:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        print("ok", flush=True)
    except OSError as e:
        print(type(e).__name__, flush=True)
"""


def _can_partition() -> str | None:
    if os.geteuid() != 0:
        return "needs root (iptables, cgroups)"
    if shutil.which("iptables") is None:
        return "no iptables"
    try:
        cgroup2_root()
    except RuntimeError as e:
        return str(e)
    return None


@pytest.mark.skipif(_can_partition() is not None, reason=str(_can_partition()))
def test_one_process_is_cut_off_and_the_rest_are_not() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    child = subprocess.Popen(
        [sys.executable, "-c", PROBE, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdin is not None and child.stdout is not None

    def probe() -> str:
        child.stdin.write("\n")  # type: ignore[union-attr]
        child.stdin.flush()  # type: ignore[union-attr]
        return child.stdout.readline().strip()  # type: ignore[union-attr]

    def ours() -> str:
        import socket

        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return "ok"
        except OSError as e:
            return type(e).__name__

    try:
        assert probe() == "ok"
        cut = Partition(child.pid, ["127.0.0.1"], name=f"modeldeploy-partition-test-{os.getpid()}")
        with cut:
            assert (cut.cgroup / "cgroup.procs").read_text().split() == [str(child.pid)]
            t = time.monotonic()
            assert probe() in ("TimeoutError", "timeout")  # dropped, not refused: a dead link
            assert time.monotonic() - t < 5
            assert ours() == "ok"  # this process (another cgroup) still reaches the server
        assert probe() == "ok"  # the rule is gone
        assert not cut.cgroup.exists()
        rules = subprocess.run(["iptables", "-S", "OUTPUT"], capture_output=True, text=True, check=True)
        assert cut.name not in rules.stdout
    finally:
        child.kill()
        child.wait(timeout=10)
        server.shutdown()
