"""Fault rows: the MariaDB primary fails over to its replica mid-sale (docs/RELIABILITY.md,
"Database failover"; the servers and the moving address: tests/faults/replication.py).

Each row runs the sale of every row (tests/faults/harness.py) with ``FLASHSALE_DB__URL`` naming
the forwarder, the session's private Redis and RabbitMQ, and a primary/replica pair of its own:

- semi-synchronous (``AFTER_SYNC``): the primary killed -9 mid-sale while its replica lags (it
  stopped receiving, the primary wrote on: :data:`UNREPLICATED`), the replica promoted after a
  detection delay; and a clean switchover. Nothing a client was told committed may be missing.
- asynchronous: the same two. A switchover waits for the replica, so it loses nothing. A kill
  may lose the last commits: realignment keeps a resolved reservation in the journal for
  ``FLASHSALE_REALIGN__KEEP_RESOLVED_SECONDS`` (docs/ARCHITECTURE.md, "Realignment"), so an order
  whose row vanished with the primary is in flight again and is published again; the row counts
  how many orders that rewrote (``lost commits repaired``) and fails on any order still missing.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.faults.harness import FaultSale
from tests.faults.replication import ReplicatedMariaDB
from tests.faults.supervisor import Servers, Supervisor
from tests.faults.under_load import under_load
from toolkit.sale.isolation import environment

pytestmark = [pytest.mark.faults, pytest.mark.slow]

UNREPLICATED = 2
"""The replica stops receiving; once the primary has this many transactions it lacks (orders the
consumer writes; at most 20 s) and two realignment passes ran after (they saw those orders
resolved), the primary is killed."""
DETECTION_SECONDS = 2.0
"""How long the stand-in for the failover manager takes to notice the primary is gone."""
KEEP_RESOLVED_SECONDS = 60
"""``FLASHSALE_REALIGN__KEEP_RESOLVED_SECONDS`` of the asynchronous rows: longer than detection,
promotion and the replica's lag together."""


class FailoverSale(FaultSale):
    """A :class:`FaultSale` whose MySQL is ``pair`` behind its forwarder."""

    def __init__(self, servers: Servers, pair: ReplicatedMariaDB, fault: str, log_root: Path) -> None:
        super().__init__(servers, fault, log_root)
        db = self.settings.db.model_copy(update={"url": pair.url()})
        realign = self.settings.realign
        if not pair.semi_sync:
            realign = realign.model_copy(update={"keep_resolved_seconds": KEEP_RESOLVED_SECONDS})
        self.settings = self.settings.model_copy(update={"db": db, "realign": realign})
        self.supervisor = Supervisor({**os.environ, **environment(self.settings)}, self.log_dir)


@pytest.fixture(params=[True, False], ids=["semi-sync", "async"])
async def pair(request: pytest.FixtureRequest) -> AsyncIterator[ReplicatedMariaDB]:
    replicated = ReplicatedMariaDB(semi_sync=request.param)
    try:
        await replicated.start()
        yield replicated
    finally:
        await replicated.remove()


def _mode(pair: ReplicatedMariaDB) -> str:
    return "semi-sync AFTER_SYNC" if pair.semi_sync else "async"


async def test_primary_killed_replica_promoted(servers, log_root, record, pair):
    fault = f"MariaDB {_mode(pair)}: primary killed -9, replica promoted"
    async with FailoverSale(servers, pair, fault, log_root) as sale:
        await under_load(sale)
        sale.faulted()
        await pair.cut_replication()
        await pair.unreplicated(UNREPLICATED)
        await _realignment_passes(sale, 2)
        await pair.kill_primary()
        await asyncio.sleep(DETECTION_SECONDS)
        await pair.fail_over()
        sale.fault_over()
        sale.notes.extend(pair.events)
        row = await sale.finish()
        row.details["replica_behind_transactions"] = pair.behind
        row.details["lost_commits_reported"] = _reported(sale)
        if not pair.semi_sync:
            assert pair.behind, "the replica lacked no commit: the row did not test the repair"
            assert row.details["lost_commits_reported"], "no lost commit was found: the row did not test the repair"
        record(row)


async def test_clean_switchover(servers, log_root, record, pair):
    fault = f"MariaDB {_mode(pair)}: clean switchover mid-sale"
    async with FailoverSale(servers, pair, fault, log_root) as sale:
        await under_load(sale)
        sale.faulted()
        await pair.switch_over()
        sale.fault_over()
        sale.notes.extend(pair.events)
        record(await sale.finish())


async def _realignment_passes(sale: FaultSale, count: int, timeout: float = 30.0) -> None:
    """Until ``realign --watch`` ran ``count`` more passes (a report per product each: the sale's
    and the canary's)."""
    before = sale.supervisor.log_text("realign").count('"mysql_sold"')
    for _ in range(int(timeout / 0.2)):
        if sale.supervisor.log_text("realign").count('"mysql_sold"') >= before + 2 * count:
            return
        await asyncio.sleep(0.2)


def _reported(sale: FaultSale) -> int:
    """Orders realignment found without their row again (``lost_commit`` log lines)."""
    return sum(sale.supervisor.log_text(name).count('"lost_commit"') for name in ("realign", "api"))
