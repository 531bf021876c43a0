"""An order number the consumer finds taken by another request's order (the consumer's side of
order numbers staying unique when Redis forgets its counters): the second order is resolved, not
retried into the dead-letter queue. It is a final ``rejected``/``order_no_conflict`` row its
buyer reads at ``GET /orders/{order_no}`` with the number of the 202, and its stock is not taken.
On the real Redis, RabbitMQ, MariaDB and consumer."""

from __future__ import annotations

from service.adapters.broker_topology import queue_depth
from service.adapters.redis.reservations import new_attempt
from service.domain.fulfilment.order_writer import Outcome, write_orders
from service.domain.order_numbers.conflicts import stand_in_order_no
from service.domain.order_numbers.format import compose_order_no
from service.domain.purchase.request_id import mint_request_id
from service.domain.stock.realign import Realigner
from service.model.order_message import OrderMessage, encode_order
from service.model.stock import ReserveRequest
from tests.support import eventually, inventory, order_rows, publish_raw, quota_rows, redis_state


def _pair(product_id: int, sequence: int) -> tuple[OrderMessage, OrderMessage]:
    """Two orders of two buyers that were given the same order number."""
    order_no = compose_order_no("FS", "20261130000000", 97, sequence)
    return (
        OrderMessage(mint_request_id(), order_no, "first-buyer", product_id, 1, 0, 1500),
        OrderMessage(mint_request_id(), order_no, "second-buyer", product_id, 1, 0, 1500),
    )


async def test_two_orders_sharing_a_number_in_one_batch(engine, put_product, product_id):
    await put_product(product_id, stock=5, limit=1)
    first, second = _pair(product_id, 800_001)
    assert await write_orders(engine, [first, second]) == [Outcome.APPLIED, Outcome.REJECTED]

    rows = {row.request_id: row for row in await order_rows(engine, product_id)}
    assert (rows[first.request_id].order_no, rows[first.request_id].status) == (first.order_no, 0)
    lost = rows[second.request_id]
    assert (lost.order_no, lost.status, lost.reason) == (stand_in_order_no(second.request_id), 7, "order_no_conflict")
    assert await inventory(engine, product_id) == (4, 1)  # the second order took nothing

    # Redelivered (in either order, together or alone), both are duplicates: nothing more is written.
    assert await write_orders(engine, [second, first]) == [Outcome.DUPLICATE, Outcome.DUPLICATE]
    assert await write_orders(engine, [second]) == [Outcome.DUPLICATE]
    assert len(await order_rows(engine, product_id)) == 2
    assert await inventory(engine, product_id) == (4, 1)


async def test_a_taken_number_met_by_the_consumer_is_resolved_and_readable(
    settings, client, token, put_product, product_id, engine, store, redis, amqp_channel, consumer
):
    await put_product(product_id, stock=5, limit=1)
    order_no = compose_order_no("FS", "20261130000000", 97, 800_002)
    messages = []
    for user in ("first-buyer", "second-buyer"):  # the minter handed one number to two requests
        request_id = mint_request_id()
        reservation = await store.reservations.reserve(
            ReserveRequest(product_id, request_id, user, 1, order_no, new_attempt())
        )
        assert reservation.outcome == "reserved"
        messages.append(OrderMessage(request_id, order_no, user, product_id, 1, reservation.reserved_at_ms, 1500))
    dead_before = await queue_depth(amqp_channel, settings.amqp.dead_letter_queue)
    for message in messages:  # two deliveries, the second meets the first's row
        await publish_raw(amqp_channel, settings, encode_order(message), message.request_id)

    async def both_written():
        return len(await order_rows(engine, product_id)) == 2 and consumer.counts.get("rejected", 0) >= 1

    await eventually(both_written)
    first, second = messages
    assert await queue_depth(amqp_channel, settings.amqp.dead_letter_queue) == dead_before  # no dead letter
    assert consumer.counts.get("retried", 0) == 0

    # Each buyer reads their own order under the number of their 202.
    mine = await client.get(f"/api/v1/orders/{order_no}", headers=token("second-buyer"))
    assert mine.status_code == 200, mine.text
    view = mine.json()
    assert (view["order_no"], view["request_id"], view["status"], view["reason"]) == (
        order_no,
        second.request_id,
        "rejected",
        "order_no_conflict",
    )
    assert [(change["to"], change["reason"]) for change in view["history"]] == [
        ("pending_payment", None),
        ("rejected", "order_no_conflict"),
    ]
    theirs = await client.get(f"/api/v1/orders/{order_no}", headers=token("first-buyer"))
    assert (theirs.json()["request_id"], theirs.json()["status"]) == (first.request_id, "pending_payment")
    listed = await client.get("/api/v1/orders", headers=token("second-buyer"))
    assert [(o["order_no"], o["status"]) for o in listed.json()["orders"] if o["product_id"] == product_id] == [
        (order_no, "rejected")
    ]
    cancel = await client.post(f"/api/v1/orders/{order_no}/cancel", headers=token("second-buyer"))
    assert (cancel.status_code, cancel.json()["code"]) == (409, "order_not_cancellable")
    assert (await client.get(f"/api/v1/orders/{order_no}", headers=token("someone-else"))).status_code == 404

    # Stock: one unit taken in MySQL, the quota counted for the first buyer only; realignment
    # resolves both journal entries (they carry the same order number: each is matched to its
    # own row by request id) and gives Redis the second reservation's unit back.
    assert await inventory(engine, product_id) == (4, 1)
    assert await quota_rows(engine, product_id) == {"first-buyer": 1}
    report = await Realigner(engine, store, 60).realign(product_id)
    assert (report.resolved_dropped, report.in_flight) == (2, 0)
    state = await redis_state(redis, settings, product_id)
    assert (state["stock"], state["journal"], state["quota"]) == ("4", {}, {"first-buyer": "1"})
