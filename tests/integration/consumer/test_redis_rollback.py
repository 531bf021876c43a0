"""A Redis that comes back from an older snapshot never makes the consumer drop a confirmed order
(docs/ARCHITECTURE.md, "Consumer"): a ``released`` tombstone drops only the message of the very
attempt that was released, so the tombstone of a first attempt, brought back by a rollback, does
not drop its confirmed retry. The rollback is real for the product's slot: every key is put back
as it was (``DUMP``/``RESTORE``, :class:`tests.support.RedisSnapshot`)."""

from __future__ import annotations

from service.domain.fulfilment.order_writer import OrderWriter, Outcome
from service.domain.order_numbers.format import compose_order_no
from service.domain.purchase.request_id import mint_request_id
from service.domain.stock.realign import Realigner
from service.model.order_message import OrderMessage
from service.model.stock import ReserveRequest
from tests.support import RedisSnapshot, inventory, order_rows


async def test_a_confirmed_retry_is_written_after_redis_rolled_back_to_its_first_attempts_release(
    store, put_product, product_id, redis, settings, engine
):
    await put_product(product_id, stock=3, limit=1)
    request_id = mint_request_id()
    order_no = compose_order_no("FS", "20261203000000", 98, 11)
    first = await store.reservations.reserve(ReserveRequest(product_id, request_id, "u", 1, order_no, "a1"))
    assert first.outcome == "reserved"
    assert await store.reservations.release(product_id, request_id, "a1") == "released"  # first attempt: 503
    snapshot = await RedisSnapshot(redis, settings, product_id).take()

    retry = await store.reservations.reserve(
        ReserveRequest(product_id, request_id, "u", 1, compose_order_no("FS", "20261203000000", 98, 12), "a2")
    )
    assert (retry.outcome, retry.order_no) == ("reserved", order_no)  # the retry reuses the number
    confirmed = OrderMessage(request_id, order_no, "u", product_id, 1, retry.reserved_at_ms, 1500, attempt="a2")
    await snapshot.restore()  # Redis restarts from the snapshot taken between the two attempts

    writer = OrderWriter(engine, store)
    assert await writer.write([confirmed]) == [Outcome.APPLIED]
    assert [(row.order_no, row.request_id, row.status) for row in await order_rows(engine, product_id)] == [
        (order_no, request_id, 0)
    ]
    assert await inventory(engine, product_id) == (2, 1)
    # A late copy of the released first attempt's message is still dropped, nothing written twice.
    late = OrderMessage(request_id, order_no, "u", product_id, 1, first.reserved_at_ms, 1500, attempt="a1")
    assert await writer.write([late]) in ([Outcome.RELEASED], [Outcome.DUPLICATE])
    assert await inventory(engine, product_id) == (2, 1)


async def test_the_released_attempts_own_message_is_dropped(store, put_product, product_id, engine):
    await put_product(product_id, stock=3, limit=1)
    request_id = mint_request_id()
    order_no = compose_order_no("FS", "20261203000000", 98, 13)
    reserved = await store.reservations.reserve(ReserveRequest(product_id, request_id, "u", 1, order_no, "a1"))
    assert await store.reservations.release(product_id, request_id, "a1") == "released"
    late = OrderMessage(request_id, order_no, "u", product_id, 1, reserved.reserved_at_ms, 1500, attempt="a1")
    assert await OrderWriter(engine, store).write([late]) == [Outcome.RELEASED]
    assert await order_rows(engine, product_id) == []
    assert await inventory(engine, product_id) == (3, 0)


async def _server_of_another_life(redis, store, product_id) -> None:
    """What a restart from an older snapshot leaves: the product's sale terms name the run id of
    the server's earlier life (the snapshot's), not this one's."""
    await redis.hset(store.product_keys(product_id).sale, "server", "0" * 40)


async def test_a_rolled_back_product_sells_nothing_until_realigned_then_a_retry_gets_its_order(
    store, put_product, product_id, redis, settings, engine
):
    """A retry with the same key after a rollback that lost the replay record of an order MySQL
    holds is answered that order, never a second number: reserves answer ``not_loaded`` until a
    pass has given the replay records back from MySQL and reloaded the product."""
    await put_product(product_id, stock=3, limit=1)
    snapshot = await RedisSnapshot(redis, settings, product_id).take()
    request_id = mint_request_id()
    order_no = compose_order_no("FS", "20261203000000", 98, 21)
    reserved = await store.reservations.reserve(ReserveRequest(product_id, request_id, "u", 1, order_no, "a1"))
    message = OrderMessage(request_id, order_no, "u", product_id, 1, reserved.reserved_at_ms, 1500, attempt="a1")
    assert await OrderWriter(engine, store).write([message]) == [Outcome.APPLIED]

    await snapshot.restore()
    await _server_of_another_life(redis, store, product_id)
    retry = compose_order_no("FS", "20261203000000", 98, 22)
    assert (
        await store.reservations.reserve(ReserveRequest(product_id, request_id, "u", 1, retry, "a2"))
    ).outcome == "not_loaded"

    report = await Realigner(engine, store, grace_seconds=60).realign(product_id)
    assert (report.redis_stock_after, report.in_flight) == (2, 0)
    again = await store.reservations.reserve(ReserveRequest(product_id, request_id, "u", 1, retry, "a3"))
    assert (again.outcome, again.order_no) == ("replay", order_no)
    assert [row.order_no for row in await order_rows(engine, product_id)] == [order_no]


async def test_sale_terms_a_previous_release_loaded_sell_at_once_and_are_this_servers(
    store, put_product, product_id, redis
):
    """A release before the server check loaded the sale without ``server``: the new reserve
    sells at once (an upgrade has no not_loaded window) and records this server, so a later
    rollback is still caught."""
    await put_product(product_id, stock=3, limit=1)
    sale = store.product_keys(product_id).sale
    await redis.hdel(sale, "server")
    order_no = compose_order_no("FS", "20261203000000", 98, 31)
    reserved = await store.reservations.reserve(ReserveRequest(product_id, mint_request_id(), "u", 1, order_no, "a1"))
    assert reserved.outcome == "reserved"
    run_id = (await redis.info("server"))["run_id"]
    assert await redis.hget(sale, "server") in (run_id, run_id.encode())
    await _server_of_another_life(redis, store, product_id)
    later = compose_order_no("FS", "20261203000000", 98, 32)
    assert (
        await store.reservations.reserve(ReserveRequest(product_id, mint_request_id(), "v", 1, later, "a2"))
    ).outcome == "not_loaded"
