"""Order numbers minted in MySQL (stock mode ``database``, no Redis): unique across processes
and concurrent callers, valid, on the shards reserved to MySQL, never repeated by a clock that
goes back."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from sqlalchemy import text

from service.domain.order_numbers.format import is_valid_order_no
from service.domain.order_numbers.mysql_minter import MYSQL_SHARDS, MysqlOrderNumberMinter


async def test_concurrent_minters_never_hand_out_a_number_twice(engine):
    minters = [MysqlOrderNumberMinter(engine, "FS", block=7) for _ in range(4)]  # four "processes"
    batches = await asyncio.gather(*(asyncio.gather(*(minter.take() for _ in range(500))) for minter in minters))
    numbers = [n for batch in batches for n in batch]
    assert len(set(numbers)) == len(numbers) == 2000
    assert all(map(is_valid_order_no, numbers))
    assert {int(n[16:18]) for n in numbers} <= set(MYSQL_SHARDS)


async def test_a_clock_that_goes_back_continues_after_the_stored_pair(engine):
    shard = MYSQL_SHARDS[0]
    ahead = MysqlOrderNumberMinter(
        engine, "FS", block=3, clock=lambda: datetime(2099, 1, 1, 0, 0, 5, tzinfo=UTC), shards=range(shard, shard + 1)
    )
    first = [await ahead.mint() for _ in range(3)]
    behind = MysqlOrderNumberMinter(
        engine, "FS", block=3, clock=lambda: datetime(2099, 1, 1, 0, 0, 1, tzinfo=UTC), shards=range(shard, shard + 1)
    )
    later = await behind.mint()
    assert later[2:16] == "20990101000005" and int(later[18:24]) == int(first[-1][18:24]) + 1
    # Put the shard's row back to the present for the other tests of the session.
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE order_no_sequences SET second = :now, sequence = 999999 WHERE shard = :s"),
            {"now": datetime.now(UTC).strftime("%Y%m%d%H%M%S"), "s": shard},
        )
