"""Orders whose rows a database failover lost (asynchronous replication) are written again from
the journal (service/domain/stock/lost_commits.py), in the full and the incremental pass.

A lost commit is made by hand as a promoted replica that lacks it would show it: the order row
and its status log gone (ON DELETE CASCADE), the inventory and user_quota rows as before
the order (stock, sold, version; units bought). Realignment recorded in Redis an inventory version
of the lost primary :data:`VERSIONS_AHEAD` beyond the replica's: more than the rewritten orders
give back (two lost single-order batches come back as one, say), so without forgetting it every
pass would be judged stale and write nothing."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text
from structlog.testing import capture_logs

from service.adapters.broker import Publisher
from service.adapters.redis.reservations import new_attempt
from service.domain.fulfilment.order_writer import apply_order
from service.domain.order_numbers.format import compose_order_no
from service.domain.purchase.request_id import mint_request_id
from service.domain.stock import realign
from service.domain.stock.realign import Realigner
from service.model.order_message import OrderMessage
from service.model.stock import ReserveRequest
from tests.support import eventually, inventory, order_rows

KEEP = 60.0
VERSIONS_AHEAD = 3


async def _lose_commit(engine, order: OrderMessage) -> None:
    async with engine.begin() as conn:
        await conn.execute(text("DELETE FROM orders WHERE request_id = :r"), {"r": order.request_id})
        await conn.execute(
            text("UPDATE user_quota SET bought = bought - :q WHERE product_id = :p AND user_id = :u"),
            {"q": order.quantity, "p": order.product_id, "u": order.user_id},
        )
        await conn.execute(
            text(
                "UPDATE inventory SET stock = stock + :q, sold = sold - :q, version = version - 1 WHERE product_id = :p"
            ),
            {"q": order.quantity, "p": order.product_id},
        )


@pytest.mark.parametrize("incremental", [False, True], ids=["full-pass", "incremental-pass"])
async def test_an_order_whose_row_vanished_is_in_flight_again_and_written_again(
    engine, redis, store, settings, put_product, product_id, consumer, monkeypatch, incremental
):
    if incremental:
        monkeypatch.setattr(realign, "FULL_PASS_MAX_ENTRIES", 0)
    await put_product(product_id, stock=5, limit=2)
    keys = store.product_keys(product_id)
    orders = []
    for number, user in enumerate(("kept", "lost")):
        request_id = mint_request_id()
        order_no = compose_order_no("FS", "20261206000000", 91, product_id * 10 + number)
        reservation = await store.reservations.reserve(
            ReserveRequest(product_id, request_id, user, 2, order_no, new_attempt())
        )
        assert reservation.outcome == "reserved"
        order = OrderMessage(request_id, order_no, user, product_id, 2, reservation.reserved_at_ms, 1500)
        await apply_order(engine, order)
        orders.append(order)
    lost = orders[1]

    publisher = Publisher(settings.amqp)
    await publisher.connect()
    try:
        keeping = Realigner(engine, store, grace_seconds=0, publisher=publisher, keep_resolved_seconds=KEEP)
        first = await keeping.realign(product_id)
        # both resolved: not in flight, not dropped, Redis = MySQL
        assert (first.mysql_stock, first.redis_stock_after, first.in_flight, first.resolved_dropped) == (1, 1, 0, 0)
        assert sorted(await redis.hkeys(keys.journal)) == sorted(order.request_id for order in orders)

        await _lose_commit(engine, lost)
        synced = int(await redis.hget(keys.versions, "synced"))
        await redis.hset(keys.versions, "synced", synced + VERSIONS_AHEAD)
        assert await inventory(engine, product_id) == (3, 2)
        await asyncio.sleep(0.01)
        with capture_logs() as logs:
            repaired = await keeping.realign(product_id)
        # the lost order is in flight again: its units are not sold twice, and it is published again;
        # the versions of the lost history are forgotten, so the pass writes
        assert (repaired.in_flight, repaired.in_flight_units, repaired.republished) == (1, 2, 1)
        assert not repaired.skipped_stale
        assert await redis.get(keys.stock) == "1"
        assert [(log["event"], log["order_no"]) for log in logs if log["event"] == "lost_commit"] == [
            ("lost_commit", lost.order_no)
        ]
    finally:
        await publisher.close()

    rows = await eventually(lambda: _two_rows(engine, product_id))
    assert sorted((row.order_no, row.user_id, row.quantity, row.status, row.reason) for row in rows) == sorted(
        (order.order_no, order.user_id, 2, 0, None) for order in orders
    )
    settled = await Realigner(engine, store, 60).realign(product_id)  # no keeping: drops them
    assert (settled.mysql_stock, settled.redis_stock_after, settled.in_flight) == (1, 1, 0)
    assert await redis.hlen(keys.journal) == 0


async def _two_rows(engine, product_id: int):
    rows = await order_rows(engine, product_id)
    return rows if len(rows) == 2 else None


async def test_without_keeping_resolved_entries_are_dropped_at_once(engine, redis, store, put_product, product_id):
    """The default (``FLASHSALE_REALIGN__KEEP_RESOLVED_SECONDS`` 0): the journal empties as before."""
    await put_product(product_id, stock=5, limit=2)
    request_id = mint_request_id()
    order_no = compose_order_no("FS", "20261206000001", 91, product_id)
    reservation = await store.reservations.reserve(
        ReserveRequest(product_id, request_id, "u", 1, order_no, new_attempt())
    )
    await apply_order(engine, OrderMessage(request_id, order_no, "u", product_id, 1, reservation.reserved_at_ms, 1500))
    report = await Realigner(engine, store, 60).realign(product_id)
    assert (report.redis_stock_after, report.in_flight, report.resolved_dropped) == (4, 0, 1)
    assert await redis.hlen(store.product_keys(product_id).journal) == 0
