"""faults.Partition, the chaos runs' network cut (bench/chaos.py partition-*): one process loses its
path to an address while every other process keeps it, and everything is undone on exit.

Real parts: a real HTTP server on loopback, a real child process connecting to it, a real cgroup v2
and a real iptables rule. Needs root, iptables and a cgroup2 mount (skips, saying which, without).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import socketserver
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
    if _can_partition() is not None:
        pytest.skip(str(_can_partition()))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with Partition(child.pid, name=f"modeldeploy-partition-test-{os.getpid()}-0") as cut:
            with pytest.raises(ValueError, match="no addresses"):
                cut.cut([])
    finally:
        child.kill()
        child.wait(timeout=10)


# The child answers one line per command on stdin: "new" connects afresh and echoes one byte, "kept"
# echoes one byte over a connection it opened at its first "kept" and keeps (as Prometheus keeps its
# scrape connections); "ok" or the error's name. Every wait is bounded (0.5 s socket timeout) and the
# test sends a bounded number of commands.
PROBE = """
import socket, sys
port, kept = int(sys.argv[1]), None
def echo(s):
    s.sendall(b"x")
    assert s.recv(1) == b"x"
for line in sys.stdin:
    try:
        if line.strip() == "new":
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                echo(s)
        else:
            kept = kept or socket.create_connection(("127.0.0.1", port), timeout=0.5)
            echo(kept)
        print("ok", flush=True)
    except OSError as e:
        print(type(e).__name__, flush=True)
"""


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.settimeout(10)
        with contextlib.suppress(OSError):
            while data := self.request.recv(64):
                self.request.sendall(data)


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
def test_one_process_is_cut_off_on_new_and_kept_connections_and_the_rest_are_not() -> None:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    child = subprocess.Popen(
        [sys.executable, "-c", PROBE, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdin is not None and child.stdout is not None

    def probe(how: str) -> str:
        child.stdin.write(how + "\n")  # type: ignore[union-attr]
        child.stdin.flush()  # type: ignore[union-attr]
        return child.stdout.readline().strip()  # type: ignore[union-attr]

    def ours() -> str:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"y")
                return "ok" if s.recv(1) == b"y" else "wrong echo"
        except OSError as e:
            return type(e).__name__

    try:
        with Partition(child.pid, name=f"modeldeploy-partition-test-{os.getpid()}") as cut:
            assert (cut.cgroup / "cgroup.procs").read_text().split() == [str(child.pid)]
            assert probe("new") == "ok" and probe("kept") == "ok"  # the kept connection is now open
            t = time.monotonic()
            cut.cut(["127.0.0.1"])
            assert probe("new") in ("TimeoutError", "timeout")  # dropped, not refused: a dead link
            assert probe("kept") in ("TimeoutError", "timeout")  # the established one too
            assert time.monotonic() - t < 5
            assert ours() == "ok"  # this process (another cgroup) still reaches the server
            cut.heal()
            assert probe("new") == "ok"  # the rule is gone
        assert not cut.cgroup.exists()
        rules = subprocess.run(["iptables", "-S", "OUTPUT"], capture_output=True, text=True, check=True)
        assert cut.name not in rules.stdout
    finally:
        child.kill()
        child.wait(timeout=10)
        server.shutdown()
        server.server_close()
