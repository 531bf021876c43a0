"""Order numbers stay unique whatever Redis forgets (docs/ARCHITECTURE.md): FLUSHALL mid-minting, and
a failover to a replica whose counters lag behind, on a Redis server of the test's own; the
generations live in the run's MySQL."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime

import structlog
from redis.asyncio import Redis

from db.engine import make_engine
from db.migrate import upgrade
from service.adapters.redis.stores import open_stores
from service.domain.order_numbers import minter as minter_module
from service.domain.order_numbers.format import is_valid_order_no
from service.domain.order_numbers.minter import OrderNumberMinter, ShardGenerations, ShardLease
from tests.support import private_redis
from toolkit.sale.isolation import isolated_settings, new_run_id
from toolkit.sale.stores import tear_down

_SECOND = datetime(2026, 11, 30, 12, 0, 0, 500_000, tzinfo=UTC)


def _frozen() -> datetime:
    """Every number in the same UTC second: the second a restarted counter would mint again."""
    return _SECOND


@contextlib.asynccontextmanager
async def _minting(settings, engine, name: str):
    """(redis, store, lease, shard, generations) on a Redis server of the test's own."""
    async with private_redis() as url:
        redis = Redis.from_url(url, decode_responses=True)
        store = open_stores(redis, f"{settings.redis.key_prefix}-{name}")
        lease = ShardLease(store, 30)
        shard = await lease.acquire()
        try:
            yield redis, store, lease, shard, ShardGenerations(engine)
        finally:
            await lease.stop()
            await redis.aclose()


async def test_a_flush_mid_minting_never_mints_a_number_twice(settings, engine):
    async with _minting(settings, engine, "flush") as (redis, store, lease, shard, generations):
        minter = OrderNumberMinter(store, lease, "FS", generations, block=7, clock=_frozen)
        before = await asyncio.gather(*(minter.mint() for _ in range(100)))
        generation = await generations.current(shard)

        flushed = asyncio.Event()

        async def flush_while_minting() -> None:
            await asyncio.sleep(0)
            await redis.flushall()
            flushed.set()

        # Concurrent mints with the flush landing among them; then a second process takes the
        # shard over (its lease is gone with the flush) within the same second.
        during, _ = await asyncio.gather(asyncio.gather(*(minter.mint() for _ in range(300))), flush_while_minting())
        assert flushed.is_set()
        successor = OrderNumberMinter(store, lease, "FS", generations, block=7, clock=_frozen)
        after = await asyncio.gather(*(successor.mint() for _ in range(100)), *(minter.mint() for _ in range(100)))

        numbers = [*before, *during, *after]
        assert len(numbers) == 600
        assert len(set(numbers)) == len(numbers), "an order number was minted twice"
        assert all(is_valid_order_no(n) and n[2:16] == "20261130120000" for n in numbers)
        # The flush moved the shard's generation on once, and the numbers after it carry its digit.
        assert await generations.current(shard) == generation + 1
        assert {n[18] for n in after} == {str((generation + 1) % 10)}


async def test_a_failover_to_a_lagging_replica_moves_the_generation_on(settings, engine):
    """A replica holds the epoch the old primary installed (its run id) and a counter that lags
    behind: the minter must not trust either."""
    async with _minting(settings, engine, "failover") as (redis, store, lease, shard, generations):
        minter = OrderNumberMinter(store, lease, "FS", generations, block=10, clock=_frozen)
        before = [await minter.mint() for _ in range(25)]
        epoch = f"{settings.redis.key_prefix}-failover:{{seq:{shard:02d}}}:epoch"
        # What the promoted replica holds: the old primary's epoch, the counter 20 behind.
        await redis.hset(epoch, "run_id", "0" * 40)
        await redis.set(store.sequences.key(shard, "20261130120000"), 10)
        successor = OrderNumberMinter(store, lease, "FS", generations, block=10, clock=_frozen)
        after = [await successor.mint() for _ in range(25)] + [await minter.mint() for _ in range(25)]
        numbers = before + after
        assert len(set(numbers)) == len(numbers) == 75


async def test_a_first_epoch_is_routine_and_a_forgotten_one_a_warning(settings, monkeypatch):
    """A new deployment's first order number installs generation 1 (logged at info: nothing went
    wrong); after Redis forgets the epoch the move to generation 2 is a warning."""
    monkeypatch.setattr(minter_module, "log", structlog.get_logger(minter_module.__name__))  # not a cached one
    own = isolated_settings(settings, new_run_id("gen"))
    await upgrade(own.db.url)
    engine = make_engine(own.db.url)
    try:
        async with _minting(own, engine, "first") as (redis, store, lease, shard, generations):
            minter = OrderNumberMinter(store, lease, "FS", generations, block=7, clock=_frozen)
            with structlog.testing.capture_logs() as logs:
                await minter.mint()
                await redis.flushall()
                for _ in range(8):  # past the block given out before the flush
                    await minter.mint()
    finally:
        await engine.dispose()
        await tear_down(own)
    moves = [(line["log_level"], line["generation"]) for line in logs if line["event"] == "order_no_generation_moved"]
    assert moves == [("info", 1), ("warning", 2)]
