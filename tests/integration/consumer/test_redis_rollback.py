"""A Redis that comes back from an older snapshot never makes the consumer drop a confirmed order
(docs/ARCHITECTURE.md, "Consumer"): a ``released`` tombstone drops only the message of the very
attempt that was released, so the tombstone of a first attempt, brought back by a rollback, does
not drop its confirmed retry. The rollback is real for the product's slot: every key is put back
as it was (``DUMP``/``RESTORE``, :class:`tests.support.RedisSnapshot`)."""

from __future__ import annotations

from service.domain.fulfilment.order_writer import OrderWriter, Outcome
from service.domain.model.order_message import OrderMessage
from service.domain.order_numbers.format import compose_order_no
from service.domain.purchase.request_id import mint_request_id
from tests.support import RedisSnapshot, inventory, order_rows


async def test_a_confirmed_retry_is_written_after_redis_rolled_back_to_its_first_attempts_release(
    store, put_product, product_id, redis, settings, engine
):
    await put_product(product_id, stock=3, limit=1)
    request_id = mint_request_id()
    order_no = compose_order_no("FS", "20261203000000", 98, 11)
    first = await store.reservations.reserve(product_id, request_id, "u", 1, order_no, "a1")
    assert first.outcome == "reserved"
    assert await store.reservations.release(product_id, request_id, "a1") == "released"  # first attempt: 503
    snapshot = await RedisSnapshot(redis, settings, product_id).take()

    retry = await store.reservations.reserve(
        product_id, request_id, "u", 1, compose_order_no("FS", "20261203000000", 98, 12), "a2"
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
    reserved = await store.reservations.reserve(product_id, request_id, "u", 1, order_no, "a1")
    assert await store.reservations.release(product_id, request_id, "a1") == "released"
    late = OrderMessage(request_id, order_no, "u", product_id, 1, reserved.reserved_at_ms, 1500, attempt="a1")
    assert await OrderWriter(engine, store).write([late]) == [Outcome.RELEASED]
    assert await order_rows(engine, product_id) == []
    assert await inventory(engine, product_id) == (3, 0)
