"""The fault suite on a three-node RabbitMQ cluster (docs/RELIABILITY.md; docs/OPERATIONS.md, "A
RabbitMQ cluster"): the sale's processes get every node's address (``FLASHSALE_AMQP__URL`` and
``FLASHSALE_AMQP__FAILOVER_URLS``), the order queues are quorum queues with a member on each
node, and the node that leads the order queue is killed with SIGKILL mid-sale, then started
again. Publishers and consumers must move to a live node by themselves, a 202 must never be
given for a message the cluster did not take, and the consumers must still consume once the
node is back.

The cluster (tests/rabbitmq_cluster.py) is started once for this module, beside the session's
private Redis and MariaDB; the session's single RabbitMQ node is not used here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.faults.harness import FaultSale
from tests.faults.supervisor import Servers, Supervisor
from tests.faults.terms import monotonic
from tests.faults.test_faults import _steady_start
from tests.rabbitmq_cluster import PrivateRabbitMQCluster
from toolkit.sale.isolation import environment

pytestmark = [pytest.mark.faults, pytest.mark.slow]

DOWN_SECONDS = 10.0
"""How long the killed node stays down: long enough for the quorum queues to elect new leaders and
for every client of that node to have moved."""


@pytest.fixture(scope="module")
async def cluster_servers(servers: Servers) -> AsyncIterator[Servers]:
    cluster = PrivateRabbitMQCluster()
    try:
        await cluster.start()
        yield Servers(servers.redis, servers.mariadb, cluster)  # type: ignore[arg-type]
    finally:
        await cluster.remove()


class ClusterSale(FaultSale):
    """A :class:`FaultSale` whose processes know every node of the cluster."""

    def __init__(self, servers: Servers, fault: str, log_root: Path) -> None:
        super().__init__(servers, fault, log_root)
        cluster: PrivateRabbitMQCluster = servers.rabbitmq  # type: ignore[assignment]
        amqp = self.settings.amqp.model_copy(update={"url": cluster.urls[0], "failover_urls": cluster.urls[1:]})
        self.settings = self.settings.model_copy(update={"amqp": amqp})
        self.supervisor = Supervisor({**os.environ, **environment(self.settings)}, self.log_dir)
        self.cluster = cluster


async def test_rabbitmq_cluster_queue_leader_killed(cluster_servers, log_root, record):
    fault = f"RabbitMQ cluster: the order queue's leader node killed -9, back after {DOWN_SECONDS:.0f} s"
    async with ClusterSale(cluster_servers, fault, log_root) as sale:
        cluster = sale.cluster
        queue = sale.settings.amqp.queue
        await _steady_start(sale)
        leader, members = await cluster.quorum(queue)
        every_node = sorted(node.node for node in cluster.nodes.values())
        assert members == every_node, f"{queue} is replicated on {members}, not on every node"
        sale.start_load()
        await sale.mid_sale()
        sale.faulted()
        node = cluster.node_named(leader)
        await node.kill()
        # the fault's own recovery: until a live node leads the queue (tests/faults/availability.py)
        sale.recovery = await _new_leader_after(cluster, queue, leader) - sale.fault_start
        await asyncio.sleep(max(0.0, DOWN_SECONDS - (monotonic() - sale.fault_start)))
        await node.start()
        sale.fault_over()
        new_leader, _ = await cluster.quorum(queue)
        sale.notes.append(
            f"leader {leader.split('@')[0]} killed; {new_leader.split('@')[0]} led after, within {sale.recovery:.1f} s"
        )

        async def replicated_and_consumed() -> str | None:
            _, now = await cluster.quorum(queue)
            if now != every_node:
                return f"{queue} members after the fault: {now}"
            consumers = await cluster.consumers(queue)
            return None if consumers >= 1 else f"{queue} has no consumer after the node came back"

        sale.extra_checks.append(replicated_and_consumed)
        record(await sale.finish())


async def _new_leader_after(cluster: PrivateRabbitMQCluster, queue: str, old: str) -> float:
    """When ``rabbitmqctl`` first names a leader of ``queue`` other than ``old`` (monotonic
    seconds; late by up to one ``rabbitmqctl`` call, so the bound errs on the generous side)."""
    deadline = monotonic() + 60
    while monotonic() < deadline:
        with contextlib.suppress(RuntimeError):
            leader, _ = await cluster.quorum(queue)
            if leader != old:
                return monotonic()
        await asyncio.sleep(0.1)
    raise AssertionError(f"{queue} has no new leader 60 s after {old} was killed")


async def test_flashsale_sale_on_the_cluster_holds_every_invariant(cluster_servers):
    """``flashsale sale --rabbitmq-cluster URL,URL,URL`` (a small sale, payments and sweep
    included) on the private cluster, Redis and MariaDB; not a row of the table."""
    cluster: PrivateRabbitMQCluster = cluster_servers.rabbitmq
    flashsale = str(Path(sys.executable).with_name("flashsale"))
    small = ["--stock", "30", "--requests", "400", "--users", "150", "--concurrency", "32", "--noop-requests", "0"]
    env = {
        **os.environ,
        "FLASHSALE_REDIS__URL": cluster_servers.redis.url,
        "FLASHSALE_DB__URL": cluster_servers.mariadb.url("flashsale"),
        "FLASHSALE_DB__POOL_SIZE": "4",
        "FLASHSALE_DB__MAX_OVERFLOW": "4",
    }
    argv = [flashsale, "sale", "--json", "--rabbitmq-cluster", ",".join(cluster.urls), *small]
    argv += ["--pay-share", "0.5", "--payment-window", "2"]
    result = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["ok"] is True and all(check["ok"] for check in report["invariants"].values())
