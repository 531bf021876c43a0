"""A randomized run (``make chaos``; docs/RELIABILITY.md, "A randomized run"): one long sale, and
faults of the suite's kinds drawn from a seed, one after another and overlapping, then the
checker of every row (tests/faults/checks.py, :func:`tests.faults.checks.finish`).

:func:`schedule` is a pure function of the seed and the length: the same seed gives the same
faults at the same offsets with the same parameters (it is printed at the start of the run and
kept in the row's details). Faults on one resource never overlap (a server is not killed while it
is down, a host's link has one fault at a time); faults on different resources do.

The kinds (each a function of :data:`ACTIONS`): API workers, the consumer or the realignment
process killed -9 (restarted as compose does); Redis or RabbitMQ killed -9 and started again after
a few seconds; a process or a server paused (SIGSTOP) for a while; a clean switchover of the
replicated MariaDB (tests/faults/replication.py); latency, packet loss or a partition between one
process and one server (tests/faults/netns.py).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from tests.faults import test_network as network
from tests.faults.replication import ReplicatedMariaDB

MEAN_GAP_SECONDS = 15.0
"""Mean time between two faults' starts (exponential gaps: bursts and lulls)."""
QUIET_END_SECONDS = 60.0
"""No fault starts in the last minute: the sale is left to finish under load."""


@dataclass(frozen=True)
class Fault:
    """One drawn fault: when (seconds from the start of the load), what, for how long, on what."""

    at: float
    kind: str
    seconds: float
    target: str = ""
    detail: str = ""

    @property
    def resource(self) -> str:
        return self.target.split("-")[0] if self.kind.startswith("network") else self.target or self.kind


def schedule(seed: int, minutes: float) -> list[Fault]:
    """The faults of a run of ``minutes`` with ``seed`` (see the module docstring)."""
    draw = random.Random(seed)
    busy_until: dict[str, float] = {}
    faults: list[Fault] = []
    at = draw.uniform(5, MEAN_GAP_SECONDS)
    end = minutes * 60 - QUIET_END_SECONDS
    while at < end:
        fault = _draw(draw, round(at, 1))
        if busy_until.get(fault.resource, -1.0) < at:
            faults.append(fault)
            busy_until[fault.resource] = at + fault.seconds + 5.0  # and a few seconds to come back
        at += draw.expovariate(1 / MEAN_GAP_SECONDS)
    return faults


def _draw(draw: random.Random, at: float) -> Fault:
    kind = draw.choice(["kill", "kill", "server_restart", "pause", "switchover", "network", "network", "network"])
    if kind == "kill":
        return Fault(at, "kill", 0.0, draw.choice(["api_workers", "consumer", "realign"]))
    if kind == "server_restart":
        return Fault(at, "server_restart", round(draw.uniform(2, 8), 1), draw.choice(["redis", "rabbitmq"]))
    if kind == "pause":
        return Fault(at, "pause", round(draw.uniform(2, 20), 1), draw.choice(["consumer", "redis", "realign"]))
    if kind == "switchover":
        return Fault(at, "switchover", 0.0, "mariadb")
    pair = draw.choice(list(network.PAIRS))
    role, server = network.PAIRS[pair]
    return Fault(at, "network", round(draw.uniform(5, 25), 1), f"{role}-{server}", draw.choice(list(network.KINDS)))


Action = Callable[["network.NetworkSale", ReplicatedMariaDB, Fault], Awaitable[None]]


async def _kill(sale: network.NetworkSale, pair: ReplicatedMariaDB, fault: Fault) -> None:
    if fault.target == "api_workers":
        for pid in sale.supervisor.children("api"):
            os.kill(pid, signal.SIGKILL)
    else:
        await sale.supervisor.kill(fault.target)


async def _server_restart(sale: network.NetworkSale, pair: ReplicatedMariaDB, fault: Fault) -> None:
    server = sale.servers.redis if fault.target == "redis" else sale.servers.rabbitmq
    await server.kill()
    await asyncio.sleep(fault.seconds)
    await server.start()


async def _pause(sale: network.NetworkSale, pair: ReplicatedMariaDB, fault: Fault) -> None:
    if fault.target == "redis":
        sale.servers.redis.pause()
        await asyncio.sleep(fault.seconds)
        sale.servers.redis.resume()
        return
    pid = sale.supervisor.pid(fault.target)
    if pid is None:
        return
    os.killpg(pid, signal.SIGSTOP)
    await asyncio.sleep(fault.seconds)
    try:
        os.killpg(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


async def _switchover(sale: network.NetworkSale, pair: ReplicatedMariaDB, fault: Fault) -> None:
    await pair.switch_over()


async def _network(sale: network.NetworkSale, pair: ReplicatedMariaDB, fault: Fault) -> None:
    role, server = fault.target.split("-")
    port = sale.port_of(server)
    if fault.detail == "latency":
        sale.hosts.slow(role, port, network.ROUND_TRIP, network.SPREAD)
    else:
        await sale.hosts.drop(role, port, 100 if fault.detail == "partition" else network.LOSS_PERCENT)
    await asyncio.sleep(fault.seconds)
    await sale.hosts.heal(role)


ACTIONS: dict[str, Action] = {
    "kill": _kill,
    "server_restart": _server_restart,
    "pause": _pause,
    "switchover": _switchover,
    "network": _network,
}


async def run(sale: network.NetworkSale, pair: ReplicatedMariaDB, faults: list[Fault], began: float) -> list[str]:
    """Inject ``faults`` at their offsets from ``began`` (loop time), overlapping as drawn; the
    faults that failed to inject, as text (a fault that raises is a finding, not a crash of the run)."""
    loop = asyncio.get_running_loop()
    problems: list[str] = []

    async def inject(fault: Fault) -> None:
        await asyncio.sleep(max(began + fault.at - loop.time(), 0))
        try:
            await ACTIONS[fault.kind](sale, pair, fault)
        except Exception as exc:
            problems.append(f"{fault.kind} {fault.target} at {fault.at:.0f}s: {exc!r}"[:300])

    await asyncio.gather(*(inject(fault) for fault in faults))
    return problems


def as_json(faults: list[Fault]) -> list[dict[str, Any]]:
    return [asdict(fault) for fault in faults]
