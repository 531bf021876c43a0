"""A private Redis Cluster, for the cluster tests (tests/integration/cluster) and
tools/bench_reserve_scripts.py: three masters (``redis-server --cluster-enabled yes`` on
free ports, nothing saved) joined by ``redis-cli --cluster create``, every slot covered."""

from __future__ import annotations

import contextlib
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

MASTERS = 3
MISSING = "redis-server or redis-cli not installed (Debian package redis-server): no Redis Cluster to test on"


def available() -> bool:
    """True when the Debian ``redis-server`` and ``redis-cli`` binaries are on PATH."""
    return shutil.which("redis-server") is not None and shutil.which("redis-cli") is not None


@contextlib.contextmanager
def private_redis_cluster(masters: int = MASTERS) -> Iterator[str]:
    """Start ``masters`` cluster nodes on free ports, create the cluster (no replicas), wait for
    ``cluster_state:ok`` on every node; yields ``redis://127.0.0.1:PORT/0`` of the first node and
    stops every node (by its PID) and removes their files on exit.

    Raises:
        RuntimeError: the cluster did not form within 30 s (with redis-cli's output).
    """
    root = Path(tempfile.mkdtemp(prefix="flashsale-cluster-"))
    servers: list[subprocess.Popen[bytes]] = []
    try:
        ports = free_ports(masters)
        for port in ports:
            servers.append(
                subprocess.Popen(
                    [
                        "redis-server",
                        "--port", str(port),
                        "--bind", "127.0.0.1",
                        "--cluster-enabled", "yes",
                        "--cluster-config-file", str(root / f"nodes-{port}.conf"),
                        "--dir", str(root),
                        "--save", "",
                        "--appendonly", "no",
                        "--daemonize", "no",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )  # fmt: skip
        for port in ports:
            _wait(lambda port=port: _cli(port, "ping") == "PONG", f"node {port} did not answer")
        created = subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{port}" for port in ports)]
            + ["--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if created.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {created.stdout}{created.stderr}")
        for port in ports:
            _wait(lambda port=port: "cluster_state:ok" in _cli(port, "cluster", "info"), "cluster_state not ok")
        yield f"redis://127.0.0.1:{ports[0]}/0"
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)


def free_ports(count: int) -> list[int]:
    """``count`` ports that are free, each with its cluster bus port (port + 10000) free too:
    an ephemeral port from the OS may lie above 55535, where the bus port cannot exist."""
    ports: list[int] = []
    while len(ports) < count:
        port = random.randrange(20_000, 30_000)
        if port not in ports and _free(port) and _free(port + 10_000):
            ports.append(port)
    return ports


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _cli(port: int, *command: str) -> str:
    done = subprocess.run(["redis-cli", "-p", str(port), *command], capture_output=True, text=True, timeout=10)
    return done.stdout.strip()


def _wait(condition: object, problem: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return
        time.sleep(0.1)
    raise RuntimeError(problem)
