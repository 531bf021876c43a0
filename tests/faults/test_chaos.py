"""``make chaos``: one long sale under faults drawn from a seed (tests/faults/chaos.py), judged by
the checker of every row. Sized for a nightly run, not CI: it runs only when ``CHAOS_MINUTES``
is set (``make chaos`` sets it; ``CHAOS_SEED`` chooses the schedule, 1 by default).

The sale: the session's private Redis and RabbitMQ, a semi-synchronous MariaDB pair behind its
forwarder, every process on a host of its own (tests/faults/netns.py), buyers at
:data:`PURCHASE_RATE` a second for the whole run but its last minute, and stock for about a third
of the purchases (it sells until late in the run).
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from tests.faults import chaos, terms
from tests.faults.netns import AVAILABLE, topology
from tests.faults.replication import ReplicatedMariaDB
from tests.faults.test_network import ROLES, NetworkSale, server_ports, slowable
from tests.faults.under_load import under_load

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.slow,
    pytest.mark.skipif("CHAOS_MINUTES" not in os.environ, reason="a nightly run: make chaos (CHAOS_MINUTES)"),
    pytest.mark.skipif(not AVAILABLE, reason="needs root, ip, nft (Debian package nftables) and socat"),
]

PURCHASE_RATE = 20.0


async def test_chaos(servers, log_root, record, monkeypatch):
    seed = int(os.environ.get("CHAOS_SEED", "1"))
    minutes = float(os.environ["CHAOS_MINUTES"])
    faults = chaos.schedule(seed, minutes)
    print(f"chaos seed {seed}, {minutes:g} min: {json.dumps(chaos.as_json(faults))}")
    requests = int((minutes * 60 - chaos.QUIET_END_SECONDS) * PURCHASE_RATE)
    monkeypatch.setattr(terms, "PURCHASE_RATE", PURCHASE_RATE)
    monkeypatch.setattr(terms, "REQUESTS", requests)
    monkeypatch.setattr(terms, "USERS", requests // 2)
    monkeypatch.setattr(terms, "STOCK", requests // 3)
    monkeypatch.setattr(terms, "LOAD_DEADLINE", minutes * 60 + 150)

    pair = ReplicatedMariaDB(semi_sync=True)
    try:
        await pair.start()
        ports = {**server_ports(servers), "mariadb": pair.forwarder.port}
        async with topology(ROLES, list(ports.values()), slowable(ports)) as hosts:
            fault = f"chaos: seed {seed}, {minutes:g} min, {len(faults)} faults"
            async with NetworkSale(servers, hosts, fault, log_root, database=pair.url()) as sale:
                began = asyncio.get_running_loop().time()
                await under_load(sale, 0.0)
                sale.faulted()
                problems = await chaos.run(sale, pair, faults, began)
                sale.fault_over()
                sale.notes.extend(problems)
                row = await sale.finish()
                row.details["schedule"] = chaos.as_json(faults)
                record(row)
    finally:
        await pair.remove()
