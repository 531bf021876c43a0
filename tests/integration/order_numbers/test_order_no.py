"""Order numbers on the real Redis: shard leases, the per-second sequence, uniqueness across processes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from service.adapters.redis.lease import Lease
from service.adapters.redis.stores import open_stores
from service.domain.order_numbers.format import COUNTER_MAX, REDIS_SHARDS, is_valid_order_no
from service.domain.order_numbers.minter import (
    LAPSED_WAIT_SECONDS,
    OrderNumberMinter,
    ShardGenerations,
    ShardLease,
    ShardLost,
)
from toolkit.sale.isolation import environment


async def test_a_used_up_second_waits_for_the_next_instead_of_wrapping(redis, settings, engine):
    store = open_stores(redis, f"{settings.redis.key_prefix}-wrap")
    lease = ShardLease(store, 30)
    shard = await lease.acquire()
    try:
        second = datetime.now(UTC).strftime("%Y%m%d%H%M%S")
        await redis.set(store.sequences.key(shard, second), COUNTER_MAX, ex=30)
        order_no = await OrderNumberMinter(store, lease, "FS", ShardGenerations(engine)).mint()
        assert is_valid_order_no(order_no)
        assert order_no[2:16] > second
        assert _sequence(order_no) <= COUNTER_MAX
    finally:
        await lease.stop()


class _Clock:
    """A UTC clock the test moves by hand."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def _sequence(order_no: str) -> int:
    """The counter part of the sequence (after the generation digit)."""
    return int(order_no[19:24])


async def test_a_block_is_given_out_locally_and_a_new_second_takes_a_new_block(redis, settings, engine):
    store = open_stores(redis, f"{settings.redis.key_prefix}-block")
    lease = ShardLease(store, 30)
    shard = await lease.acquire()
    clock = _Clock(datetime(2026, 11, 30, 12, 0, 0, 250_000, tzinfo=UTC))
    try:
        minter = OrderNumberMinter(store, lease, "FS", ShardGenerations(engine), block=3, clock=clock)
        first_second = [await minter.mint() for _ in range(4)]
        assert [_sequence(n) for n in first_second] == [1, 2, 3, 4]
        assert await redis.get(store.sequences.key(shard, "20261130120000")) == "6"  # two blocks of 3

        clock.now += timedelta(seconds=1)
        next_second = await minter.mint()
        assert next_second[2:16] == "20261130120001" and _sequence(next_second) == 1
        assert await redis.get(store.sequences.key(shard, "20261130120001")) == "3"

        # Another process that takes the shard over within the same second continues after
        # this process's blocks; the first keeps giving out its own block: no number twice.
        successor = OrderNumberMinter(store, lease, "FS", ShardGenerations(engine), block=3, clock=clock)
        taken_over = [await successor.mint(), await minter.mint(), await successor.mint(), await minter.mint()]
        assert [_sequence(n) for n in taken_over] == [4, 2, 5, 3]
        numbers = [*first_second, next_second, *taken_over]
        assert len(set(numbers)) == len(numbers) and all(is_valid_order_no(n) for n in numbers)
    finally:
        await lease.stop()


async def test_concurrent_mints_share_blocks_without_repeats(redis, settings, engine):
    store = open_stores(redis, f"{settings.redis.key_prefix}-blocks")
    lease = ShardLease(store, 30)
    shard = await lease.acquire()
    clock = _Clock(datetime(2026, 11, 30, 12, 0, 1, tzinfo=UTC))
    try:
        minter = OrderNumberMinter(store, lease, "FS", ShardGenerations(engine), block=100, clock=clock)
        numbers = await asyncio.gather(*(minter.mint() for _ in range(500)))
        assert sorted(_sequence(n) for n in numbers) == list(range(1, 501))
        assert await redis.get(store.sequences.key(shard, "20261130120001")) == "500"  # five INCRBY, no waste
    finally:
        await lease.stop()


async def test_a_block_that_reaches_the_end_of_a_second_stops_there(redis, settings, engine):
    store = open_stores(redis, f"{settings.redis.key_prefix}-block-end")
    lease = ShardLease(store, 30)
    shard = await lease.acquire()
    try:
        second = datetime.now(UTC).strftime("%Y%m%d%H%M%S")
        await redis.set(store.sequences.key(shard, second), COUNTER_MAX - 1, ex=30)
        minter = OrderNumberMinter(store, lease, "FS", ShardGenerations(engine), block=5)
        last, after = await minter.mint(), await minter.mint()
        if last[2:16] == second:  # the clock did not tick over between the set-up and the mint
            assert _sequence(last) == COUNTER_MAX
        assert after[2:16] > last[2:16] and _sequence(after) <= COUNTER_MAX
    finally:
        await lease.stop()


async def test_shards_are_exclusive(redis, settings):
    store = open_stores(redis, f"{settings.redis.key_prefix}-lease")
    leases = [ShardLease(store, 30) for _ in range(REDIS_SHARDS)]
    shards = [await lease.acquire() for lease in leases]
    assert sorted(shards) == list(range(REDIS_SHARDS))  # 90-99 are the MySQL minter's
    with pytest.raises(ShardLost):
        await ShardLease(store, 30).acquire()
    await leases[0].stop()
    late = ShardLease(store, 30)
    assert await late.acquire() == shards[0]
    for lease in [*leases[1:], late]:
        await lease.stop()


_MINT_IN_A_PROCESS = """
import asyncio, json, sys
from db.engine import make_engine
from service.domain.order_numbers.format import REDIS_SHARDS
from service.domain.order_numbers.minter import OrderNumberMinter, ShardGenerations, ShardLease
from service.adapters.redis.stores import make_stores
from service.settings import Settings

async def main(count, processes):
    settings = Settings()
    store = make_stores(settings)
    lease = ShardLease(store, 30)
    await lease.start()
    # Every process holds its lease before any mints (and releases when done): the shards are
    # held at the same time, as the API's workers hold theirs (a released shard may be taken again).
    while await store.leases.leased_shards(REDIS_SHARDS) < processes:
        await asyncio.sleep(0.05)
    engine = make_engine(settings.db.url, pool_size=2, max_overflow=0)
    minter = OrderNumberMinter(store, lease, "FS", ShardGenerations(engine))
    # At most half the pool's connections in flight: the mints stay concurrent, but none waits on
    # the pool (which gives up after 5 s) however slow a busy machine makes Redis.
    bound = asyncio.Semaphore(max(1, settings.redis.max_connections // 2))

    async def mint():
        async with bound:
            return await minter.mint()

    numbers = await asyncio.gather(*(mint() for _ in range(count)))
    await lease.stop()
    await store.aclose()
    await engine.dispose()
    print(json.dumps(numbers))

asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
"""


@pytest.mark.slow
async def test_order_numbers_are_unique_across_processes(settings):
    env = {**os.environ, **environment(settings), "FLASHSALE_REDIS__KEY_PREFIX": f"{settings.redis.key_prefix}-procs"}
    processes = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", _MINT_IN_A_PROCESS, "3000", "4", env=env, stdout=subprocess.PIPE
        )
        for _ in range(4)
    ]
    outputs = [await process.communicate() for process in processes]
    assert all(process.returncode == 0 for process in processes)
    batches = [json.loads(stdout.splitlines()[-1]) for stdout, _ in outputs]  # after any log lines
    numbers = [n for batch in batches for n in batch]
    assert len(numbers) == 12_000 == len(set(numbers))
    assert all(is_valid_order_no(n) for n in numbers)
    shards_per_process = [{n[16:18] for n in batch} for batch in batches]
    assert all(len(shards) == 1 for shards in shards_per_process)
    assert len(set.union(*shards_per_process)) == 4


async def test_a_lapsed_lease_is_taken_again_by_the_purchase_that_meets_it(redis, settings, engine):
    """Redis was away longer than the lease (paused 40 s, lease 30 s), or this process did not
    run (a paused VM, a stopped event loop): the lease lapsed. The first mint that meets it asks
    the renewer to act now and waits for it, so it mints instead of answering 503, and not at the
    renewer's next period (a third of the lease: here 100 s)."""
    store = open_stores(redis, f"{settings.redis.key_prefix}-lapsed")
    lease = ShardLease(store, 300)
    await lease.start()
    try:
        await asyncio.sleep(0.6)  # the renewer waits for its period (or to be asked)
        await redis.delete(store.leases.shard(lease.shard).key)  # expired while Redis was away
        lease._valid_until = 0.0
        minter = OrderNumberMinter(store, lease, "FS", ShardGenerations(engine))
        assert is_valid_order_no(await minter.mint())
        assert lease.held
    finally:
        await lease.stop()


async def test_a_lapsed_lease_that_redis_does_not_renew_answers_shard_lost_after_the_wait(
    redis, settings, engine, monkeypatch
):
    """Redis is away (here: the renewal never answers): the mint that meets the lapsed lease
    waits :data:`LAPSED_WAIT_SECONDS` for the renewal, then answers ShardLost (a fast 503)."""
    store = open_stores(redis, f"{settings.redis.key_prefix}-unrenewed")
    lease = ShardLease(store, 300)
    await lease.start()
    try:
        never = asyncio.Event()

        async def paused(self, holder: str, ttl_ms: int) -> bool:
            await never.wait()
            return True

        monkeypatch.setattr(Lease, "renew", paused)
        lease._valid_until = 0.0
        minter = OrderNumberMinter(store, lease, "FS", ShardGenerations(engine))
        async with asyncio.timeout(LAPSED_WAIT_SECONDS * 5):  # waited out, not forever
            with pytest.raises(ShardLost):
                await minter.mint()
        assert not lease.held
    finally:
        monkeypatch.undo()
        await lease.stop()
