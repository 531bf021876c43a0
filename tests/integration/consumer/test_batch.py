"""The batched writer: many deliveries in one transaction, with the per-order rules intact."""

from __future__ import annotations

import asyncio

import aio_pika
import pytest
from sqlalchemy import text

from consumers.consume import consuming
from consumers.order_consumer import OrderConsumer
from service.adapters.broker_topology import declare_topology, queue_depth
from service.domain.fulfilment.order_writer import OrderWriter, Outcome, apply_order
from service.domain.order_numbers.format import compose_order_no
from service.model.order_message import OrderMessage, encode_order
from tests.support import (
    eventually,
    inventory,
    message_for,
    order_rows,
    own_queues,
    publish_raw,
    rows_are,
    running_consumer,
)

A, R, D, U = Outcome.APPLIED, Outcome.REJECTED, Outcome.DUPLICATE, Outcome.UNKNOWN_PRODUCT


async def history(engine, product_id) -> dict[str, list[tuple]]:
    """order_no -> its order_status_log rows (from, to, reason), oldest first."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT o.order_no, l.from_status, l.to_status, l.reason FROM order_status_log l"
                " JOIN orders o ON o.id = l.order_id WHERE o.product_id = :p ORDER BY l.id"
            ),
            {"p": product_id},
        )
        found: dict[str, list[tuple]] = {}
        for row in rows:
            found.setdefault(row.order_no, []).append((row.from_status, row.to_status, row.reason))
        return found


async def test_batch_with_duplicates_before_and_inside_it(engine, store, put_product, product_id):
    await put_product(product_id, stock=10, limit=5)
    before = [message_for(product_id, f"old{i}", 100 + i) for i in range(2)]
    for order in before:
        assert await apply_order(engine, order) is A
    new = [message_for(product_id, f"new{i}", 200 + i) for i in range(3)]
    # The same request again with a new order number: its replay record was lost (a fresh order
    # holds the id), so it gets a row under a reissued id, rejected, never a second purchase.
    new_order_no = compose_order_no("FS", "20261130000000", 99, 299)
    again = OrderMessage(new[0].request_id, new_order_no, "new0", product_id, 1, 0, 1500)
    batch = [before[0], new[0], new[1], new[0], before[1], new[2], new[1], again]

    outcomes = await OrderWriter(engine, store).write(batch)

    assert outcomes == [D, A, A, D, D, A, D, R]
    assert await inventory(engine, product_id) == (5, 5)
    rows = {row.order_no: row for row in await order_rows(engine, product_id)}
    assert len(rows) == 6  # 2 before + 3 new + the rejected retry
    assert (rows[again.order_no].status, rows[again.order_no].reason) == (7, "duplicate_request")
    logs = await history(engine, product_id)
    assert all(logs[o.order_no] == [(None, 0, None)] for o in before + new)
    assert logs[again.order_no] == [(None, 0, None), (0, 7, "duplicate_request")]


async def test_batch_crossing_the_last_unit_applies_in_delivery_order(engine, store, put_product, product_id):
    await put_product(product_id, stock=5, limit=1)
    batch = [message_for(product_id, f"u{i}", 300 + i) for i in range(8)]

    outcomes = await OrderWriter(engine, store).write(batch)

    assert outcomes == [A] * 5 + [R] * 3
    assert await inventory(engine, product_id) == (0, 5)
    rows = {row.order_no: row for row in await order_rows(engine, product_id)}
    statuses = [(rows[o.order_no].status, rows[o.order_no].reason) for o in batch]
    assert statuses == [(0, None)] * 5 + [(7, "sold_out")] * 3
    logs = await history(engine, product_id)
    assert [logs[o.order_no] for o in batch[5:]] == [[(None, 0, None), (0, 7, "sold_out")]] * 3


async def test_an_order_that_does_not_fit_leaves_its_units_to_later_ones(engine, store, put_product, product_id):
    await put_product(product_id, stock=5, limit=3)
    quantities = [2, 2, 3, 1, 1]  # 2 + 2 fit, 3 does not, 1 fits, then nothing is left
    batch = [message_for(product_id, f"q{i}", 400 + i, quantity) for i, quantity in enumerate(quantities)]

    assert await OrderWriter(engine, store).write(batch) == [A, A, R, A, R]
    assert await inventory(engine, product_id) == (0, 5)


async def test_batch_mixing_products_one_sold_out_one_unknown(engine, store, put_product, new_product_id):
    plenty, scarce, unknown = new_product_id(), new_product_id(), new_product_id()
    await put_product(plenty, stock=10, limit=2)
    await put_product(scarce, stock=1, limit=2)
    batch = [
        message_for(plenty, "m1", 500),
        message_for(scarce, "m2", 501),
        message_for(unknown, "m3", 502),
        message_for(scarce, "m4", 503),
        message_for(plenty, "m5", 504),
    ]

    assert await OrderWriter(engine, store).write(batch) == [A, A, U, R, A]
    assert await inventory(engine, plenty) == (8, 2)
    assert await inventory(engine, scarce) == (0, 1)
    assert [(row.user_id, row.status, row.reason) for row in await order_rows(engine, scarce)] == [
        ("m2", 0, None),
        ("m4", 7, "sold_out"),
    ]
    assert await order_rows(engine, unknown) == []


async def test_poison_messages_in_a_batch_do_not_hold_up_the_rest(
    settings, engine, store, put_product, product_id, new_product_id
):
    await put_product(product_id, stock=10, limit=1)
    good = [message_for(product_id, f"p{i}", 600 + i) for i in range(6)]
    ghost = message_for(new_product_id(), "ghost", 610)
    too_many = message_for(product_id, "greedy", 611, quantity=2**40)  # beyond the INT column
    bodies = [encode_order(good[0]), b"\x00garbage", encode_order(ghost), encode_order(good[1])]
    bodies += [encode_order(too_many)] + [encode_order(order) for order in good[2:]]
    async with own_queues(settings, "poison") as mine, running_consumer(mine, engine, store) as consumer:
        connection = await aio_pika.connect(mine.amqp.url)
        try:
            channel = await connection.channel()
            await asyncio.gather(*(publish_raw(channel, mine, body) for body in bodies))

            await eventually(lambda: rows_are(engine, product_id, 6))
            assert await inventory(engine, product_id) == (4, 6)
            # The unknown product and the two undecodable ones are dead-lettered at once.
            await eventually(lambda: _depth_is(channel, mine.amqp.dead_letter_queue, 3))
        finally:
            await connection.close()
        assert consumer.counts.get("invalid") == 2
        assert consumer.counts.get("unknown_product") == 1
        assert consumer.counts.get("applied") == 6


async def _depth_is(channel, queue, expected):
    return await queue_depth(channel, queue) == expected


@pytest.mark.parametrize("writers", [1, 3])
async def test_two_consumers_drain_more_demand_than_stock_exactly(
    settings, engine, store, put_product, product_id, monkeypatch, writers
):
    stock, messages, repeated = 700, 2400, 300
    await put_product(product_id, stock=stock, limit=1)
    orders = [message_for(product_id, f"c{i}", 600_000 + 10_000 * writers + i) for i in range(messages)]
    bodies = [encode_order(order) for order in orders] + [encode_order(order) for order in orders[:repeated]]
    consumers = [OrderConsumer(engine, store, batch_size=100, writers=writers) for _ in range(2)]
    at_once = _AtOnce()
    monkeypatch.setattr(OrderWriter, "write", at_once.wrap(OrderWriter.write))
    async with own_queues(settings, "two") as mine:
        connection = await aio_pika.connect(mine.amqp.url)
        try:
            publishing = await connection.channel()
            await declare_topology(publishing, mine.amqp)
            for start in range(0, len(bodies), 300):
                await asyncio.gather(*(publish_raw(publishing, mine, body) for body in bodies[start : start + 300]))
            async with (
                consuming(mine.amqp, consumers[0], prefetch=200),
                consuming(mine.amqp, consumers[1], prefetch=200),
            ):
                await eventually(lambda: _handled(consumers, len(bodies)))
            left = await queue_depth(publishing, mine.amqp.queue)
        finally:
            await connection.close()

    rows = await order_rows(engine, product_id)
    assert len(rows) == messages
    assert len({row.request_id for row in rows}) == len({row.order_no for row in rows}) == messages
    assert sum(row.status == 0 for row in rows) == stock
    assert sum((row.status, row.reason) == (7, "sold_out") for row in rows) == messages - stock
    assert await inventory(engine, product_id) == (0, stock)
    kinds = ("applied", "rejected", "duplicate")
    totals = {what: sum(c.counts.get(what, 0) for c in consumers) for what in kinds}
    assert totals == {"applied": stock, "rejected": messages - stock, "duplicate": repeated}
    assert left == 0
    # A backlog of full batches waited: with writers > 1 a consumer's transactions overlapped,
    # never more of them than allowed.
    assert len(at_once.peak) == 2
    assert all(peak <= writers for peak in at_once.peak.values())
    assert max(at_once.peak.values()) > 1 if writers > 1 else max(at_once.peak.values()) == 1


class _AtOnce:
    """Counts the batch transactions each consumer (by its writer) has in flight at once."""

    def __init__(self) -> None:
        self.now: dict[int, int] = {}
        self.peak: dict[int, int] = {}
        self._ids: dict[int, int] = {}

    def wrap(self, write):
        async def counted(writer, batch):
            key = self._ids.setdefault(id(writer), len(self._ids))
            self.now[key] = self.now.get(key, 0) + 1
            self.peak[key] = max(self.peak.get(key, 0), self.now[key])
            try:
                return await write(writer, batch)
            finally:
                self.now[key] -= 1

        return counted


async def _handled(consumers, count: int) -> bool:
    done = sum(c.counts.get(what, 0) for c in consumers for what in ("applied", "rejected", "duplicate"))
    return done >= count


async def test_a_lone_order_is_written_at_once_whatever_the_linger(settings, engine, store, put_product, product_id):
    await put_product(product_id, stock=10, limit=1)
    lingering = OrderConsumer(engine, store, linger_seconds=3600.0)  # the most a batch may wait: an hour
    async with own_queues(settings, "lone") as mine, consuming(mine.amqp, lingering, prefetch=8):
        connection = await aio_pika.connect(mine.amqp.url)
        try:
            channel = await connection.channel()
            await publish_raw(channel, mine, encode_order(message_for(product_id, "lone", 620)))
            # Orders come far apart (this is the first): the batch waits for nothing.
            await eventually(lambda: rows_are(engine, product_id, 1))
        finally:
            await connection.close()
    assert lingering.counts == {"applied": 1}
