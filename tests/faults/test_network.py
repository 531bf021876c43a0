"""Fault rows: the network between one process and one server misbehaves mid-sale
(docs/RELIABILITY.md, "Network faults"; the hosts and links: tests/faults/netns.py).

Every process of the sale runs on a host of its own (a network namespace): ``serve``,
``consume``, ``realign --watch`` and ``sweep --watch``; the session's private servers stay on
this machine. Between one host and one server, for :data:`FAULT_SECONDS` mid-sale:

- latency: 100 ms ± 20 ms added to every round trip;
- loss: 20 % of the packets dropped, each way;
- a partition: every packet dropped;

for each pair API↔Redis, API↔RabbitMQ, consumer↔RabbitMQ, consumer↔MySQL and realignment↔Redis.
And one asymmetric case: two API hosts behind one address (a load balancer taking each
connection to each host in turn), one of them cut from Redis while the other keeps serving.
Every row holds the zeros of tests/faults/harness.py.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from service.settings import Settings
from tests.faults.buyers import Buyers
from tests.faults.forwarder import Forwarder
from tests.faults.harness import FaultSale
from tests.faults.netns import AVAILABLE, Topology, topology
from tests.faults.supervisor import Servers, Supervisor
from tests.faults.terms import WORKERS
from tests.faults.under_load import under_load
from toolkit.sale.isolation import environment

pytestmark = [
    pytest.mark.faults,
    pytest.mark.slow,
    pytest.mark.skipif(not AVAILABLE, reason="needs root, ip, nft (Debian package nftables) and socat"),
]

FAULT_SECONDS = 20.0
ROUND_TRIP, SPREAD = 0.100, 0.020  # latency rows: seconds added to each round trip, ± spread
LOSS_PERCENT = 20
ROLES = ["api", "consumer", "realign", "sweep"]
PAIRS = {
    "API↔Redis": ("api", "redis"),
    "API↔RabbitMQ": ("api", "rabbitmq"),
    "consumer↔RabbitMQ": ("consumer", "rabbitmq"),
    "consumer↔MySQL": ("consumer", "mariadb"),
    "realignment↔Redis": ("realign", "redis"),
}


class HostedSupervisor(Supervisor):
    """A :class:`Supervisor` that runs each process on the host of its name (``ip netns exec``),
    with the stores' URLs as that host reaches them and an API listening on the host's address."""

    def __init__(self, env: dict[str, str], log_dir: Path, hosts: Topology, settings: Settings) -> None:
        super().__init__(env, log_dir)
        self._hosts = hosts
        self._settings = settings
        self._flashsale = self._script
        ip = shutil.which("ip")
        assert ip is not None
        self._script = ip

    async def start(self, name: str, *argv: str, env: dict[str, str] | None = None) -> None:
        host = self._hosts.hosts[name]
        urls = {
            "FLASHSALE_REDIS__URL": self._hosts.url(name, self._settings.redis.url),
            "FLASHSALE_DB__URL": self._hosts.url(name, self._settings.db.url),
            "FLASHSALE_AMQP__URL": self._hosts.url(name, self._settings.amqp.url),
        }
        hosted = [host.address if arg == "127.0.0.1" else arg for arg in argv]  # serve --host
        await super().start(name, "netns", "exec", host.netns, self._flashsale, *hosted, env={**urls, **(env or {})})


class NetworkSale(FaultSale):
    """A :class:`FaultSale` whose processes run on the hosts of ``hosts``; buyers reach the API
    host directly, or through ``balancer`` when given. ``database``: another MySQL (a URL on
    127.0.0.1) than the session's."""

    def __init__(
        self,
        servers: Servers,
        hosts: Topology,
        fault: str,
        log_root: Path,
        balancer: Forwarder | None = None,
        database: str | None = None,
    ) -> None:
        super().__init__(servers, fault, log_root)
        self.hosts = hosts
        self.ports = server_ports(servers)
        if database is not None:
            db = self.settings.db.model_copy(update={"url": database})
            self.settings = self.settings.model_copy(update={"db": db})
            self.ports["mariadb"] = int(database.split("127.0.0.1:", 1)[1].split("/", 1)[0])
        self.supervisor = HostedSupervisor(
            {**os.environ, **environment(self.settings)}, self.log_dir, hosts, self.settings
        )
        if balancer is not None:
            balancer.targets = [(hosts.hosts[role].address, self.port) for role in ("api", "api2")]
            self.url = f"http://127.0.0.1:{balancer.port}"
        else:
            self.url = f"http://{hosts.hosts['api'].address}:{self.port}"
        self.buyers = Buyers(self.url, self.product_id, self.settings)

    def port_of(self, server: str) -> int:
        return self.ports[server]


def server_ports(servers: Servers) -> dict[str, int]:
    return {"redis": servers.redis.port, "mariadb": servers.mariadb.port, "rabbitmq": servers.rabbitmq.port}


def slowable(ports: dict[str, int]) -> set[tuple[str, int]]:
    """The links the rows may slow: each pair's."""
    return {(role, ports[server]) for role, server in PAIRS.values()}


async def _impaired_for(sale: NetworkSale, role: str, server: str, kind: str) -> None:
    """The fault ``kind`` between the host of ``role`` and ``server`` for :data:`FAULT_SECONDS`."""
    port = sale.port_of(server)
    sale.faulted()
    if kind == "latency":
        sale.hosts.slow(role, port, ROUND_TRIP, SPREAD)
    else:
        await sale.hosts.drop(role, port, 100 if kind == "partition" else LOSS_PERCENT)
    await asyncio.sleep(FAULT_SECONDS)
    await sale.hosts.heal(role)
    sale.fault_over()


KINDS = {
    "latency": f"+{ROUND_TRIP * 1000:.0f} ms ± {SPREAD * 1000:.0f} latency",
    "loss": f"{LOSS_PERCENT} % packet loss",
    "partition": f"{FAULT_SECONDS:.0f} s partition",
}


@pytest.mark.parametrize(
    "pair", list(PAIRS), ids=["api-redis", "api-rabbitmq", "consumer-rabbitmq", "consumer-mysql", "realign-redis"]
)
@pytest.mark.parametrize("kind", list(KINDS))
async def test_network_fault_between_a_process_and_a_server(servers, log_root, record, kind, pair):
    role, server = PAIRS[pair]
    fault = f"network: {pair}, {KINDS[kind]}" + ("" if kind == "partition" else f" for {FAULT_SECONDS:.0f} s")
    ports = server_ports(servers)
    async with topology(ROLES, list(ports.values()), slowable(ports)) as hosts:
        async with NetworkSale(servers, hosts, fault, log_root) as sale:
            await under_load(sale)
            await _impaired_for(sale, role, server, kind)
            record(await sale.finish())


async def test_one_of_two_api_hosts_loses_redis(servers, log_root, record):
    """Two API hosts behind one address; the first is cut from Redis for :data:`FAULT_SECONDS`.
    The second keeps selling meanwhile: buyers (who retry a 503, as everywhere) are answered 202
    during the partition."""
    balancer = Forwarder([])
    await balancer.start()
    try:
        async with topology([*ROLES, "api2"], list(server_ports(servers).values())) as hosts:
            fault = f"network: one of two API hosts cut from Redis for {FAULT_SECONDS:.0f} s"
            async with NetworkSale(servers, hosts, fault, log_root, balancer) as sale:
                await sale.supervisor.start(
                    "api2", "serve", "--host", "127.0.0.1", "--port", str(sale.port), "--workers", str(WORKERS)
                )
                await under_load(sale)
                await _impaired_for(sale, "api", "redis", "partition")
                assert sale.fault_start is not None and sale.fault_end is not None
                window = (sale.fault_start + 1.0, sale.fault_end)
                served = sum(1 for t in sale.buyers.tries if t.status == 202 and window[0] <= t.at <= window[1])
                answered_503 = sum(1 for t in sale.buyers.tries if t.status == 503 and window[0] <= t.at <= window[1])
                sale.notes.append(f"during the partition: {served} purchases answered 202, {answered_503} 503")

                async def other_host_served() -> str | None:
                    return None if served else "no purchase was answered 202 during the partition"

                sale.extra_checks.append(other_host_served)
                record(await sale.finish())
    finally:
        await balancer.close()
