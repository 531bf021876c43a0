"""Hosts of their own for the network rows (docs/RELIABILITY.md, "Network faults"): each process
of the sale runs in a network namespace joined to this machine by a veth pair, and the link
between one host and one server is slowed, made to drop packets or cut.

- :class:`Topology` creates the namespaces ``fs<hex>-<role>`` (``ip netns add``), one veth pair
  each (``10.<net>.<i>.1`` on this machine's end, ``10.<net>.<i>.2`` in the namespace, a /30 of its
  own), and, on this machine's end of each link, one relay per private server, bound to that
  link's address only and connecting to the server on 127.0.0.1 (``socat``; a
  :class:`~tests.faults.forwarder.Forwarder` for the links that may be slowed): a process in the
  namespace reaches Redis, MariaDB and RabbitMQ at ``10.<net>.<i>.1`` on the servers' own ports.
  Traffic goes only between the namespaces and this machine's loopback.
- Packet loss and partitions (:meth:`Topology.drop`): ``nftables`` rules in the host's namespace
  drop that share of the packets to and from one server's port (``numgen random``), or all of
  them: the fault hits one pair (API and Redis, consumer and MySQL ...) and nothing else.
- Latency (:meth:`Topology.slow`): this kernel has no ``sch_netem`` (``tc qdisc add ... netem``
  answers "Specified qdisc kind is unknown"), so the link's relay holds every chunk, each way, for
  half the added round trip (uniformly within half the spread).
- :meth:`Topology.heal` removes the fault; :meth:`Topology.remove` (also on failure: use
  :func:`topology`) stops the relays and deletes the namespaces, which deletes their veth pairs.

Needs root (``ip netns``), ``nft`` (Debian package nftables) and ``socat``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from tests.faults.forwarder import Forwarder

AVAILABLE = os.geteuid() == 0 and all(shutil.which(tool) for tool in ("ip", "nft", "socat"))
"""The network rows can run here (root, iproute2, nftables and socat): else they are skipped, saying so."""
TABLE = "flashsale_fault"


def _run(*argv: str, netns: str | None = None) -> None:
    command = ["ip", "netns", "exec", netns, *argv] if netns else list(argv)
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")


def _nft(netns: str, ruleset: str) -> None:
    done = subprocess.run(
        ["ip", "netns", "exec", netns, "nft", "-f", "-"], input=ruleset, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"nft in {netns}: {done.stderr.strip()}")


def _quietly(*argv: str) -> None:
    subprocess.run(argv, capture_output=True, check=False)


@dataclass
class Host:
    """One process's host: its namespace and its link to this machine."""

    role: str
    netns: str
    index: int
    net: int
    relays: list[subprocess.Popen[bytes]] = field(default_factory=list)
    slowed: dict[int, Forwarder] = field(default_factory=dict)
    dropping: bool = False

    @property
    def gateway(self) -> str:
        """This machine's end of the link: where the host reaches the servers."""
        return f"10.{self.net}.{self.index}.1"

    @property
    def address(self) -> str:
        """The host's own address (an API there listens on it)."""
        return f"10.{self.net}.{self.index}.2"

    @property
    def outer(self) -> str:
        return f"{self.netns[:10]}o{self.index}"

    @property
    def inner(self) -> str:
        return f"{self.netns[:10]}i{self.index}"


class Topology:
    """Hosts ``roles`` relayed to the servers listening on 127.0.0.1 at ``ports``."""

    def __init__(self, roles: list[str], ports: list[int], slowable: set[tuple[str, int]] | None = None) -> None:
        tag = f"fs{secrets.token_hex(3)}"
        used = subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True, check=False).stdout
        net = random.choice([n for n in range(200, 250) if f" 10.{n}." not in used])
        self.ports = ports
        self.slowable = slowable or set()
        self.hosts = {role: Host(role, f"{tag}-{role}", i + 1, net) for i, role in enumerate(roles)}

    async def create(self) -> None:
        await asyncio.to_thread(self._create)
        for role, port in self.slowable:
            host = self.hosts[role]
            host.slowed[port] = Forwarder([("127.0.0.1", port)], host=host.gateway, port=port)
            await host.slowed[port].start()

    def _create(self) -> None:
        for host in self.hosts.values():
            _run("ip", "netns", "add", host.netns)
            _run("ip", "link", "add", host.outer, "type", "veth", "peer", "name", host.inner)
            _run("ip", "link", "set", host.inner, "netns", host.netns)
            _run("ip", "addr", "add", f"{host.gateway}/30", "dev", host.outer)
            _run("ip", "link", "set", host.outer, "up")
            _run("ip", "addr", "add", f"{host.address}/30", "dev", host.inner, netns=host.netns)
            _run("ip", "link", "set", host.inner, "up", netns=host.netns)
            _run("ip", "link", "set", "lo", "up", netns=host.netns)
            for port in self.ports:
                if (host.role, port) in self.slowable:
                    continue
                host.relays.append(
                    subprocess.Popen(
                        [
                            "socat",
                            f"TCP-LISTEN:{port},bind={host.gateway},reuseaddr,fork",
                            f"TCP:127.0.0.1:{port}",
                        ],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )

    def url(self, role: str, url: str) -> str:
        """``url`` (a server on 127.0.0.1) as the host of ``role`` reaches it."""
        return url.replace("127.0.0.1", self.hosts[role].gateway)

    async def drop(self, role: str, port: int, percent: int) -> None:
        """Drop ``percent`` % of the packets between the host of ``role`` and the server on
        ``port``, both ways (100: a partition)."""
        host = self.hosts[role]
        chance = [] if percent >= 100 else ["numgen", "random", "mod", "100", "<", str(percent)]
        ruleset = (
            f"table inet {TABLE} {{\n"
            f"  chain out {{ type filter hook output priority 0; tcp dport {port} {' '.join(chance)} drop; }}\n"
            f"  chain in {{ type filter hook input priority 0; tcp sport {port} {' '.join(chance)} drop; }}\n"
            "}\n"
        )
        await asyncio.to_thread(_nft, host.netns, ruleset)
        host.dropping = True

    def slow(self, role: str, port: int, round_trip: float, spread: float) -> None:
        """Add ``round_trip`` ± ``spread`` seconds to every round trip between the host of
        ``role`` and the server on ``port`` (a link created slowable)."""
        self.hosts[role].slowed[port].delay = (round_trip / 2, spread / 2)

    async def heal(self, role: str) -> None:
        """End the fault of the host of ``role``."""
        host = self.hosts[role]
        for relay in host.slowed.values():
            relay.delay = None
        if host.dropping:
            await asyncio.to_thread(_run, "nft", "delete", "table", "inet", TABLE, netns=host.netns)
            host.dropping = False

    async def remove(self) -> None:
        for host in self.hosts.values():
            for forwarder in host.slowed.values():
                await forwarder.close()
            for relay in host.relays:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(relay.pid, signal.SIGKILL)
                await asyncio.to_thread(relay.wait)
            await asyncio.to_thread(_quietly, "ip", "netns", "del", host.netns)
            await asyncio.to_thread(_quietly, "ip", "link", "del", host.outer)


@contextlib.asynccontextmanager
async def topology(
    roles: list[str], ports: list[int], slowable: set[tuple[str, int]] | None = None
) -> AsyncIterator[Topology]:
    """A :class:`Topology`, removed on the way out whatever happened."""
    created = Topology(roles, ports, slowable)
    try:
        await created.create()
        yield created
    finally:
        await created.remove()
