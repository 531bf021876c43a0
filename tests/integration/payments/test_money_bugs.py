"""The money bugs once found in the payment path, each as the case that failed and the kind it
stands for.

Every settlement is matched by channel + channel transaction id + order; the price of an order
is fixed at reservation; a notification for a queued order is answered retryably; unknown
notification fields are ignored; units return to sale only on a confirmed refund.
"""

from __future__ import annotations

import aio_pika
import pytest

from db.models import OrderStatus as S
from service.api.app import create_app
from tests.support import (
    buy,
    buy_and_settle,
    eventually,
    inventory,
    notify,
    order_rows,
    own_queues,
    payments_of,
    redis_state,
    running_consumer,
    serving,
    status_of,
)


async def test_a_refund_settles_the_notifying_channels_own_payment(
    client, token, put_product, product_id, engine, settings, consumer
):
    """mockpay pays (P1), altpay pays the same order again (P2, owed back); mockpay's refund
    refunds the order through P1, and P2 stays owed back until altpay refunds it."""
    await put_product(product_id, stock=2, limit=1, price=700)
    [order_no] = await buy_and_settle(client, token, engine, product_id, ["two-channels"])
    assert (await notify(client, settings, order_no, amount=700, txn="P1")).json()["result"] == "paid"
    second = await notify(client, settings, order_no, amount=700, txn="P2", channel="altpay")
    assert second.json() == {"result": "duplicate_payment", "order_status": "paid"}

    refund = await notify(client, settings, order_no, amount=700, txn="R1", event="refunded")
    assert refund.json() == {"result": "refunded", "order_status": "refunded"}
    owed = [(p.channel, p.channel_txn_id, p.status) for p in await payments_of(engine, order_no)]
    assert owed[:2] == [("mockpay", "P1", "applied"), ("altpay", "P2", "duplicate")]

    altpay_refund = await notify(client, settings, order_no, amount=700, txn="R2", channel="altpay", event="refunded")
    assert altpay_refund.json() == {"result": "refunded", "order_status": "refunded"}
    assert [(p.channel_txn_id, p.status) for p in await payments_of(engine, order_no)][1] == ("P2", "refunded")


async def test_a_refund_naming_another_channels_payment_settles_nothing(
    client, token, put_product, product_id, engine, settings, consumer
):
    """A refund from altpay for mockpay's transaction (or for no payment of altpay's) is flagged
    and changes nothing: channel + transaction + order, or no match."""
    await put_product(product_id, stock=2, limit=1, price=700)
    [order_no] = await buy_and_settle(client, token, engine, product_id, ["foreign-refund"])
    assert (await notify(client, settings, order_no, amount=700, txn="M1")).json()["result"] == "paid"
    for txn, extra in (("X1", {"payment_txn_id": "M1"}), ("X2", {})):
        foreign = await notify(
            client, settings, order_no, amount=700, txn=txn, channel="altpay", event="refunded", **extra
        )
        assert foreign.json() == {"result": "unexpected", "order_status": "paid"}
    assert await status_of(engine, order_no) is S.PAID
    named = await notify(client, settings, order_no, amount=700, txn="R-M1", event="refunded", payment_txn_id="M1")
    assert named.json() == {"result": "refunded", "order_status": "refunded"}


async def test_a_republished_reservation_keeps_its_price_through_a_price_change(
    token, admin, product_id, engine, store, settings
):
    """Price 700, buy (202), the message is lost; after the grace period the product is PUT at 900
    and that PUT's realignment pass publishes the reservation again: the order row says 700 and
    the buyer's 700 pays it."""
    async with own_queues(settings, "reprice") as mine:
        patient = mine.model_copy(
            update={
                "realign": mine.realign.model_copy(update={"grace_seconds": 0}),
                "db": mine.db.model_copy(update={"pool_size": 2, "max_overflow": 2}),
            }
        )
        async with serving(create_app(patient), timeout=30) as client:
            product = {"stock": 3, "per_user_limit": 1, "price": 700, "stock_mode": "redis"}
            assert (await client.put(f"/api/v1/admin/products/{product_id}", json=product, headers=admin)).is_success
            accepted = await buy(client, token("repriced"), product_id)
            assert accepted.status_code == 202
            order_no = accepted.json()["order_no"]
            connection = await aio_pika.connect(patient.amqp.url)
            async with connection:
                queue = await (await connection.channel()).get_queue(patient.amqp.queue)
                assert await queue.purge() is not None  # the message is lost
            repriced = {**product, "price": 900}
            report = await client.put(f"/api/v1/admin/products/{product_id}", json=repriced, headers=admin)
            assert report.json()["republished"] == 1
            async with running_consumer(patient, engine, store):

                async def written():
                    return [row for row in await order_rows(engine, product_id) if row.order_no == order_no]

                await eventually(written)
            assert (await client.get(f"/api/v1/orders/{order_no}", headers=token("repriced"))).json()["amount"] == 700
            paid = await notify(client, settings, order_no, amount=700, txn=f"pay-{order_no}")
            assert paid.json() == {"result": "paid", "order_status": "paid"}


async def test_a_payment_for_a_queued_order_is_answered_retryably_then_applied(
    client, token, admin, put_product, product_id, engine, store, settings
):
    """No consumer: the order is queued. The channel's notification gets 409 ``order_queued`` with
    ``Retry-After`` and nothing is recorded; once the row lands, the same notification pays it."""
    await put_product(product_id, stock=2, limit=1)
    accepted = await buy(client, token("early-payer"), product_id)
    order_no = accepted.json()["order_no"]
    assert (await client.get(f"/api/v1/orders/{order_no}", headers=token("early-payer"))).json()["status"] == "queued"
    early = await notify(client, settings, order_no, txn=f"early-{order_no}")
    assert early.status_code == 409 and early.json()["code"] == "order_queued"
    assert early.headers["retry-after"] == "1"
    assert await payments_of(engine, order_no) == []
    refund = await client.post(f"/api/v1/admin/orders/{order_no}/refund", headers=admin)
    assert refund.status_code == 409 and refund.json()["code"] == "order_not_refundable"  # not a 404 either
    async with running_consumer(settings, engine, store):
        await eventually(lambda: order_rows(engine, product_id))
    retried = await notify(client, settings, order_no, txn=f"early-{order_no}")
    assert retried.json() == {"result": "paid", "order_status": "paid"}


async def test_an_order_nobody_accepted_is_still_404(client, settings):
    from service.domain.order_numbers.format import compose_order_no

    unknown = compose_order_no("FS", "20261130120000", 1, 1)
    response = await notify(client, settings, unknown, txn="nobody")
    assert response.status_code == 404 and response.json()["code"] == "order_not_found"


@pytest.mark.parametrize("extra", [{"paid_at": "2026-11-30T12:00:00Z"}, {"fee": 6}, {"metadata": {"k": [1, 2]}}])
async def test_notifications_ignore_fields_they_do_not_know(
    one_order, client, token, put_product, product_id, engine, settings, consumer, extra
):
    order_no = await one_order("extra-fields", stock=2)
    paid = await notify(client, settings, order_no, txn=f"P-{order_no}", **extra)
    assert paid.json() == {"result": "paid", "order_status": "paid"}
    refunded = await notify(client, settings, order_no, txn=f"R-{order_no}", event="refunded", **extra)
    assert refunded.json() == {"result": "refunded", "order_status": "refunded"}


@pytest.mark.parametrize("failure", ["refund_failed", "refund_rejected"])
async def test_units_return_to_sale_only_once_the_refund_is_confirmed(
    one_order, client, token, admin, put_product, product_id, engine, redis, settings, consumer, failure
):
    """A refund with restock keeps the unit off sale while the channel may still fail it; a
    failed or rejected refund puts the order back to ``paid``; a later confirmed refund returns
    the unit and a second buyer gets it."""
    order_no = await one_order("refund-me", stock=1)
    assert (await notify(client, settings, order_no, txn=f"P-{order_no}")).json()["result"] == "paid"

    first = await client.post(f"/api/v1/admin/orders/{order_no}/refund", json={"restock": True}, headers=admin)
    assert first.status_code == 200
    assert (await buy(client, token("second-buyer"), product_id)).json()["code"] == "sold_out"
    failed = await notify(
        client, settings, order_no, txn=f"F-{order_no}", event=failure, refund_no=first.json()["refund_no"]
    )
    assert failed.json() == {"result": failure, "order_status": "paid"}
    assert await inventory(engine, product_id) == (0, 1)

    second = await client.post(f"/api/v1/admin/orders/{order_no}/refund", json={"restock": True}, headers=admin)
    assert second.json()["refund_no"] == f"{order_no}R2"
    done = await notify(client, settings, order_no, txn=f"R-{order_no}", event="refunded")
    assert done.json() == {"result": "refunded", "order_status": "refunded"}
    assert await inventory(engine, product_id) == (1, 0)
    assert (await redis_state(redis, settings, product_id))["stock"] == "1"
    assert (await buy(client, token("second-buyer"), product_id)).status_code == 202


async def test_a_refund_failure_without_a_refund_in_progress_changes_nothing(
    one_order, client, token, put_product, product_id, engine, settings, consumer
):
    order_no = await one_order("not-refunding", stock=1)
    assert (await notify(client, settings, order_no, txn=f"P-{order_no}")).json()["result"] == "paid"
    stray = await notify(client, settings, order_no, txn=f"F-{order_no}", event="refund_failed")
    assert stray.json() == {"result": "unexpected", "order_status": "paid"}
    assert [(p.event, p.flagged) for p in await payments_of(engine, order_no)][-1] == ("refund_failed", True)


async def test_no_cancel_while_a_payment_is_open_at_a_channel(
    one_order, client, token, product_id, engine, store, consumer
):
    """Whatever asked the channels before (or did not), the cancel itself refuses an order whose
    payment attempt is open: a start that came after the sweep's question keeps its order."""
    from sqlalchemy import text

    from service.domain.orders.lifecycle import expire_unpaid

    order_no = await one_order("open-attempt")
    async with engine.begin() as conn:
        await conn.execute(
            text("INSERT INTO payment_attempts (order_no, channel, status) VALUES (:o, 'mockpay', 'open')"),
            {"o": order_no},
        )

    async def overdue():
        async with engine.connect() as conn:
            query = text("SELECT created_at < NOW() FROM orders WHERE order_no = :o")
            return bool((await conn.execute(query, {"o": order_no})).scalar())

    await eventually(overdue, interval=0.2)
    assert await expire_unpaid(engine, store, 0, product_id=product_id) == 0
    refused = await client.post(f"/api/v1/orders/{order_no}/cancel", headers=token("open-attempt"))
    assert refused.status_code == 409 and refused.headers["retry-after"] == "1"
    assert await status_of(engine, order_no) is S.PENDING_PAYMENT
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE payment_attempts SET status = 'closed' WHERE order_no = :o"), {"o": order_no})
    assert await expire_unpaid(engine, store, 0, product_id=product_id) == 1
    assert await status_of(engine, order_no) is S.CANCELLED
