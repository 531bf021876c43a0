"""Fault rows: Redis comes back from an older snapshot mid-sale (docs/RELIABILITY.md).

A Redis restarted from an older RDB file (or a replica promoted before it got the last writes)
has forgotten acknowledged writes: reservations, release tombstones, per-user quotas, replay
records and order-number counters of the last seconds. The rows do it for real to the suite's
private Redis: ``SAVE`` mid-sale keeps the RDB file, the sale goes on, then Redis is killed
with SIGKILL and started again with that file as its only data (the AOF directory replaced by
one whose base is the old RDB file), while orders are queued (the consumer is paused) and
buyers' retries are in flight. What a 202 promised must still hold: every confirmed order gets
its row, no order number goes to two requests nor two numbers to one, nothing oversold.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from pathlib import Path

import pytest

from tests.faults.harness import FaultSale
from tests.servers import PrivateRedis

pytestmark = [pytest.mark.faults, pytest.mark.slow]
ci = pytest.mark.faults_ci

_AOF_DIR = "appendonlydir"  # redis-server's default appenddirname
_AOF_BASE = "appendonly.aof.1.base.rdb"
_MANIFEST = "appendonly.aof.manifest"


async def save_snapshot(redis: PrivateRedis, name: str) -> Path:
    """``SAVE`` now; the RDB file kept as ``name`` beside the server's data."""
    await redis.command("SAVE")
    kept = redis.root / name
    shutil.copyfile(redis.root / "dump.rdb", kept)
    return kept


async def restart_from(redis: PrivateRedis, snapshot: Path) -> None:
    """SIGKILL Redis and start it again with ``snapshot`` as all it has: the AOF directory is
    replaced by one whose base file is that RDB file and which has no increments."""
    await redis.kill()
    aof = redis.root / _AOF_DIR
    shutil.rmtree(aof, ignore_errors=True)
    aof.mkdir()
    shutil.copyfile(snapshot, aof / _AOF_BASE)
    (aof / _MANIFEST).write_text(f"file {_AOF_BASE} seq 1 type b\n")
    await redis.start()


@contextlib.asynccontextmanager
async def consumer_paused(sale: FaultSale):
    """SIGSTOP the consumer's process group (its deliveries stay unacknowledged, orders queue
    up behind them), SIGCONT on leaving."""
    pid = sale.supervisor.pid("consumer")
    assert pid is not None, "no consumer running"
    os.killpg(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGCONT)


async def _faulted_mid_sale(sale: FaultSale) -> None:
    """Start the case's processes and the load; return once a fifth of the stock is sold, the
    fault begun."""
    await sale.start_all()
    assert await sale.ready()
    sale.start_load()
    await sale.mid_sale(0.2)
    sale.faulted()


@ci
async def test_redis_rolled_back_across_releases(servers, log_root, record):
    """The issue's case: the broker freezes long enough for publishes to time out, so buyers'
    first attempts are released (tombstones) and answered 503; the snapshot is taken then. The
    broker comes back, the retries (same Idempotency-Key) are confirmed and answered 202 while
    the consumer is paused, and Redis restarts from the snapshot: it holds the first attempts'
    tombstones and none of the retries' reservations."""
    async with FaultSale(servers, "Redis rolled back to a snapshot taken across releases", log_root) as sale:
        await _faulted_mid_sale(sale)
        servers.rabbitmq.pause()
        await asyncio.sleep(sale.settings.amqp.confirm_timeout + 1.5)  # publishes time out: released, 503
        snapshot = await save_snapshot(servers.redis, "across-releases.rdb")
        async with consumer_paused(sale):
            servers.rabbitmq.resume()
            await asyncio.sleep(3)  # retries confirmed and answered 202, late copies queued
            await restart_from(servers.redis, snapshot)
            await asyncio.sleep(1)
        sale.fault_over()
        record(await sale.finish())


async def test_redis_rolled_back_mid_sale(servers, log_root, record):
    """A snapshot at a fifth of the stock sold, then the sale goes on (reservations, quotas,
    replay records, order-number counters) with the consumer paused for the last seconds, and
    Redis restarts from that snapshot."""
    async with FaultSale(servers, "Redis rolled back 4 s mid-sale (quotas, replays, sequences)", log_root) as sale:
        await _faulted_mid_sale(sale)
        snapshot = await save_snapshot(servers.redis, "mid-sale.rdb")
        await asyncio.sleep(2)
        async with consumer_paused(sale):
            await asyncio.sleep(2)  # accepted orders wait in the queue
            await restart_from(servers.redis, snapshot)
            await asyncio.sleep(1)
        sale.fault_over()
        record(await sale.finish())
