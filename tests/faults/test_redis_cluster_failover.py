"""Fault row: Redis Cluster with one replica per master; the master holding the hot product is
killed with SIGKILL mid-sale (docs/RELIABILITY.md).

Six private ``redis-server`` processes in cluster mode on free ports (three masters, three
replicas: ``redis-cli --cluster create ... --cluster-replicas 1``, ``cluster-node-timeout`` of
two seconds), AOF off as on a cache node: the replica is promoted with whatever the asynchronous
replication had sent it, possibly without the last writes. The service runs with
``FLASHSALE_REDIS__CLUSTER`` on (the session's private MariaDB and RabbitMQ as in every row) and
must follow the new topology by itself: redis-py's cluster client reloads the slot map after a
connection error (from ``FLASHSALE_REDIS__CLUSTER_NODES`` when the node the URL names is the one
killed), and the promoted replica is another server (run id), so realignment gives back from
MySQL what it may lack before the product sells there again. The kill waits until every replica
has finished its first sync: Redis does not promote a replica that never had its master's data.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from service.adapters.redis.keys import ProductKeys
from tests.faults.harness import FaultSale
from tests.faults.supervisor import Servers, Supervisor
from tests.redis_cluster import free_ports as free_cluster_ports  # each with its bus port free
from toolkit.sale.isolation import environment

pytestmark = [pytest.mark.faults, pytest.mark.slow]

NODE_TIMEOUT_MS = 2000
_HAVE_REDIS = shutil.which("redis-server") is not None and shutil.which("redis-cli") is not None


def _cli(port: int, *command: str) -> str:
    done = subprocess.run(["redis-cli", "-p", str(port), *command], capture_output=True, text=True, timeout=10)
    return done.stdout.strip()


class PrivateRedisCluster:
    """Three masters and three replicas on free ports under a directory of their own; each node
    a process of its own (killed by its PID), removed with :meth:`remove`."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="flashsale-faults-cluster-"))
        self.ports = free_cluster_ports(6)
        self.nodes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def _start(self, port: int) -> None:
        log = (self.root / f"node-{port}.log").open("ab")
        with log:
            self.nodes[port] = subprocess.Popen(
                [
                    "redis-server",
                    "--port", str(port),
                    "--bind", "127.0.0.1",
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", str(self.root / f"nodes-{port}.conf"),
                    "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                    "--dir", str(self.root),
                    "--dbfilename", f"dump-{port}.rdb",
                    "--save", "",
                    "--appendonly", "no",
                    "--repl-diskless-sync-delay", "0",  # replicas' first sync at once, not after 5 s
                    "--maxmemory-policy", "noeviction",
                    "--daemonize", "no",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    async def start(self) -> None:
        for port in self.ports:
            self._start(port)
        await _until(lambda: all(_cli(port, "ping") == "PONG" for port in self.ports), "nodes did not answer")
        created = await asyncio.to_thread(
            subprocess.run,
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{port}" for port in self.ports)]
            + ["--cluster-replicas", "1", "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert created.returncode == 0, f"redis-cli --cluster create failed: {created.stdout}{created.stderr}"
        await _until(self.healthy, "cluster_state not ok with three masters and three replicas in sync")

    @property
    def alive(self) -> list[int]:
        return [port for port, node in self.nodes.items() if node.poll() is None]

    def healthy(self) -> bool:
        """Every live node sees the cluster ok with three masters, and every live replica has
        its master's data: a replica that has not finished its first sync refuses to be promoted
        (its data would be of unknown age), so a master killed before that is never replaced."""
        alive = self.alive
        if not all("cluster_state:ok" in _cli(port, "cluster", "info") for port in alive):
            return False
        roles = [line.split()[2] for line in _cli(alive[0], "cluster", "nodes").splitlines()]
        if sum("master" in role and "fail" not in role for role in roles) != 3:
            return False
        replication = [_cli(port, "info", "replication") for port in alive]
        return all("master_link_status:up" in info for info in replication if "role:slave" in info)

    def took_over(self, key: str, killed: int) -> bool:
        """A replica is master of ``key``'s slot in place of ``killed``, and the cluster is healthy."""
        try:
            return self.master_of(key) != killed and self.healthy()
        except AssertionError:  # no master holds the slot yet
            return False

    def master_of(self, key: str) -> int:
        """The port of the master that holds ``key``'s slot, as a live node sees it."""
        seen_from = self.alive[0]
        slot = int(_cli(seen_from, "cluster", "keyslot", key))
        for line in _cli(seen_from, "cluster", "nodes").splitlines():
            fields = line.split()
            if "master" not in fields[2] or "fail" in fields[2]:
                continue
            for span in fields[8:]:
                low, _, high = span.partition("-")
                if low.isdigit() and int(low) <= slot <= int(high or low):
                    return int(fields[1].split("@")[0].rsplit(":", 1)[1])  # ip:port@bus-port
        raise AssertionError(f"no master holds slot {slot}")

    async def kill(self, port: int) -> None:
        node = self.nodes[port]
        node.kill()
        await asyncio.to_thread(node.wait)

    async def remove(self) -> None:
        for node in self.nodes.values():
            if node.poll() is None:
                node.terminate()
        for node in self.nodes.values():
            await asyncio.to_thread(node.wait, 10)
        shutil.rmtree(self.root, ignore_errors=True)


async def _until(condition, problem: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await asyncio.to_thread(condition):
            return
        await asyncio.sleep(0.2)
    raise AssertionError(problem)


class ClusterFaultSale(FaultSale):
    """A :class:`FaultSale` whose Redis is ``cluster`` (the session's MariaDB and RabbitMQ)."""

    def __init__(self, servers: Servers, cluster: PrivateRedisCluster, fault: str, log_root: Path) -> None:
        super().__init__(servers, fault, log_root)
        others = [f"127.0.0.1:{port}" for port in cluster.ports[1:]]  # the URL's node may be the one killed
        redis = self.settings.redis.model_copy(update={"url": cluster.url, "cluster": True, "cluster_nodes": others})
        self.settings = self.settings.model_copy(update={"redis": redis})
        self.supervisor = Supervisor({**os.environ, **environment(self.settings)}, self.log_dir)


@pytest.mark.skipif(not _HAVE_REDIS, reason="redis-server or redis-cli not installed (Debian package redis-server)")
async def test_hot_products_master_killed_replica_promoted(servers, log_root, record):
    cluster = PrivateRedisCluster()
    try:
        await cluster.start()
        fault = "Redis Cluster: hot product's master killed -9, replica promoted"
        async with ClusterFaultSale(servers, cluster, fault, log_root) as sale:
            await sale.start_all()
            assert await sale.ready()
            sale.start_load()
            await sale.mid_sale(0.3)
            stock_key = ProductKeys(sale.settings.redis.key_prefix, sale.product_id).stock
            master = cluster.master_of(stock_key)
            assert cluster.healthy(), "the replicas were not in sync before the kill"
            sale.faulted()
            await cluster.kill(master)
            await _until(lambda: cluster.took_over(stock_key, master), "no replica was promoted", timeout=30)
            sale.fault_over()
            named = " (the node FLASHSALE_REDIS__URL names)" if master == cluster.ports[0] else ""
            sale.notes.append(f"master :{master}{named} killed; a replica took its slots")
            record(await sale.finish())
    finally:
        await cluster.remove()
