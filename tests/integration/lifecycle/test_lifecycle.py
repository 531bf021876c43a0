"""Order lifecycle on the real services: payment, cancellation, timeout, refunds, races."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter

import pytest
from sqlalchemy import bindparam, text

from db.models import OrderStatus as S
from service.domain.orders.lifecycle import IllegalTransition, expire_unpaid, transition
from service.domain.payments.notification import sign
from service.domain.stock.realign import Realigner
from tests.support import (
    buy_and_settle,
    eventually,
    inventory,
    notification,
    notify,
    order_rows,
    payments_of,
    redis_state,
    status_of,
)


async def test_whitelist_refuses_illegal_changes(engine, client, token, put_product, product_id, consumer):
    await put_product(product_id, stock=2, limit=1)
    [order_no] = await buy_and_settle(client, token, engine, product_id, ["w"])
    async with engine.begin() as conn:
        for frm, to in [
            (S.CANCELLED, S.PAID),
            (S.REJECTED, S.PAID),
            (S.PENDING_PAYMENT, S.REFUNDED),
            (S.PAID, S.PENDING_PAYMENT),
        ]:
            with pytest.raises(IllegalTransition):
                await transition(conn, order_no, frm, to, actor="system:test")
    assert await status_of(engine, order_no) is S.PENDING_PAYMENT


async def test_same_notification_ten_times_at_once_pays_once(
    client, token, put_product, product_id, engine, settings, consumer
):
    await put_product(product_id, stock=2, limit=1)
    [order_no] = await buy_and_settle(client, token, engine, product_id, ["payer"])
    responses = await asyncio.gather(*(notify(client, settings, order_no, txn="same") for _ in range(10)))
    assert all(r.status_code == 200 for r in responses)
    assert Counter(r.json()["result"] for r in responses) == {"paid": 1, "already_processed": 9}
    later = await notify(client, settings, order_no, txn="same")
    assert later.json() == {"result": "already_processed", "order_status": "paid"}
    assert await status_of(engine, order_no) is S.PAID
    assert [(p.status, p.idem_key) for p in await payments_of(engine, order_no)] == [
        ("applied", f"pay:{order_no}:paid")
    ]
    history = (await client.get(f"/api/v1/orders/{order_no}", headers=token("payer"))).json()["history"]
    assert [(h["from"], h["to"]) for h in history] == [(None, "pending_payment"), ("pending_payment", "paid")]


@pytest.mark.parametrize("signature", [None, "", "00" * 32, "not-hex"])
async def test_bad_signature_is_401_with_no_side_effects(
    client, token, put_product, product_id, engine, settings, consumer, signature
):
    await put_product(product_id, stock=2, limit=1)
    [order_no] = await buy_and_settle(client, token, engine, product_id, ["sig"])
    body, headers = notification(settings, order_no)
    if signature is None:
        del headers["X-Signature"]
    else:
        headers["X-Signature"] = signature
    response = await client.post("/api/v1/payments/notify", content=body, headers=headers)
    assert response.status_code == 401 and response.json()["code"] == "invalid_signature"
    assert await payments_of(engine, order_no) == []
    assert await status_of(engine, order_no) is S.PENDING_PAYMENT


async def test_unknown_channel_and_tampered_body_are_401(
    client, token, put_product, product_id, engine, settings, consumer
):
    await put_product(product_id, stock=2, limit=1)
    [order_no] = await buy_and_settle(client, token, engine, product_id, ["tamper"])
    body, headers = notification(settings, order_no)
    tampered = body.replace(b'"amount": 1500', b'"amount": 1')
    assert (await client.post("/api/v1/payments/notify", content=tampered, headers=headers)).status_code == 401
    other = body.replace(b'"mockpay"', b'"otherpay"')
    assert (await client.post("/api/v1/payments/notify", content=other, headers=headers)).status_code == 401
    assert await payments_of(engine, order_no) == []


@pytest.mark.parametrize("change", [{"amount": 1499}, {"amount": 15000}, {"currency": "USD"}])
async def test_amount_or_currency_mismatch_is_recorded_flagged_and_not_paid(
    client, token, put_product, product_id, engine, settings, consumer, change
):
    await put_product(product_id, stock=2, limit=1)
    [order_no] = await buy_and_settle(client, token, engine, product_id, ["mis"])
    body = json.dumps(
        {
            "channel": "mockpay",
            "channel_txn_id": f"m-{order_no}",
            "order_no": order_no,
            "amount": 1500,
            "currency": settings.payment.currency,
            "event": "paid",
            **change,
        }
    ).encode()
    headers = {
        "content-type": "application/json",
        "X-Signature": sign(settings.payment.channel_secrets["mockpay"], body),
    }
    response = await client.post("/api/v1/payments/notify", content=body, headers=headers)
    assert response.status_code == 200 and response.json()["result"] == "amount_mismatch"
    assert [(p.status, p.flagged, p.idem_key) for p in await payments_of(engine, order_no)] == [("mismatch", 1, None)]
    assert await status_of(engine, order_no) is S.PENDING_PAYMENT


async def test_cancel_returns_the_unit_exactly_once_and_it_sells_again(
    client, token, put_product, product_id, engine, redis, store, settings, consumer
):
    await put_product(product_id, stock=1, limit=1)
    [order_no] = await buy_and_settle(client, token, engine, product_id, ["canceller"])
    assert await inventory(engine, product_id) == (0, 1)
    assert (await client.post(f"/api/v1/orders/{order_no}/cancel", headers=token("someone-else"))).status_code == 404

    cancelled = await client.post(f"/api/v1/orders/{order_no}/cancel", headers=token("canceller"))
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    again = await client.post(f"/api/v1/orders/{order_no}/cancel", headers=token("canceller"))
    assert again.status_code == 409 and again.json()["code"] == "order_not_cancellable"
    assert await inventory(engine, product_id) == (1, 0)
    state = await redis_state(redis, settings, product_id)
    assert state["stock"] == "1" and state["quota"] == {}

    # The unit is on sale again, and the same buyer's quota is free again.
    resold = await client.post(
        "/api/v1/orders", json={"product_id": product_id, "quantity": 1}, headers=token("canceller")
    )
    assert resold.status_code == 202
    report = await Realigner(engine, store, 60).realign(product_id)
    mysql_stock, sold = await inventory(engine, product_id)
    assert mysql_stock + sold == 1
    assert report.redis_stock_after == report.mysql_stock - report.in_flight_units


async def test_payment_timeout_sweep_cancels_unpaid_orders_once(
    client, token, put_product, product_id, engine, redis, store, settings, consumer
):
    await put_product(product_id, stock=5, limit=1)
    order_nos = await buy_and_settle(client, token, engine, product_id, [f"slow{i}" for i in range(4)])
    paid = order_nos[0]
    assert (await notify(client, settings, paid, txn="sweep-paid")).json()["result"] == "paid"
    # The window below is 1 s; created_at has one-second precision: wait until MySQL's clock says so.
    await eventually(lambda: _created_before(engine, order_nos, seconds_ago=1))

    # The sweep is global: earlier tests' unpaid orders in this run's database go too.
    assert await expire_unpaid(engine, store, window_seconds=1) >= 3
    assert await expire_unpaid(engine, store, window_seconds=1) == 0
    statuses = {o: await status_of(engine, o) for o in order_nos}
    assert statuses[paid] is S.PAID
    assert [s for o, s in statuses.items() if o != paid] == [S.CANCELLED] * 3
    assert await inventory(engine, product_id) == (4, 1)
    state = await redis_state(redis, settings, product_id)
    assert state["stock"] == "4" and set(state["quota"]) == {"slow0"}
    rows = {row.order_no: row.reason for row in await order_rows(engine, product_id)}
    assert {rows[o] for o in order_nos[1:]} == {"payment_timeout"}


async def _created_before(engine, order_nos: list[str], seconds_ago: int) -> bool:
    async with engine.connect() as conn:
        older = (
            await conn.execute(
                text(
                    "SELECT COUNT(*) FROM orders WHERE order_no IN :o AND created_at < NOW() - INTERVAL :s SECOND"
                ).bindparams(bindparam("o", expanding=True)),
                {"o": order_nos, "s": seconds_ago},
            )
        ).scalar()
    return older == len(order_nos)


async def test_cancel_racing_pay_a_hundred_times(
    client, token, put_product, product_id, engine, redis, store, settings, consumer
):
    await put_product(product_id, stock=100, limit=1)
    users = [f"racer{i}" for i in range(100)]
    order_nos = await buy_and_settle(client, token, engine, product_id, users)

    async def cancel(order_no, user):
        await asyncio.sleep(random.uniform(0, 0.02))
        return await client.post(f"/api/v1/orders/{order_no}/cancel", headers=token(user))

    async def pay(order_no):
        await asyncio.sleep(random.uniform(0, 0.02))
        return await notify(client, settings, order_no, txn=f"race-{order_no}")

    results = await asyncio.gather(
        *(asyncio.gather(cancel(o, u), pay(o)) for o, u in zip(order_nos, users, strict=True))
    )
    paid = cancelled = 0
    for order_no, (cancel_response, pay_response) in zip(order_nos, results, strict=True):
        status = await status_of(engine, order_no)
        payments = await payments_of(engine, order_no)
        assert cancel_response.status_code in (200, 409) and pay_response.status_code == 200
        if status is S.PAID:  # the payment won: the cancel lost and said so
            paid += 1
            assert cancel_response.status_code == 409 and pay_response.json()["result"] == "paid"
            assert [p.status for p in payments] == ["applied"]
        else:  # the cancel won: the money is recorded and goes back; the order is never paid
            cancelled += 1
            assert status is S.CANCELLED and cancel_response.status_code == 200
            assert pay_response.json()["result"] == "refund_started"
            assert [(p.status, p.flagged) for p in payments] == [("refunding", 1)]
    assert paid + cancelled == 100
    assert paid and cancelled  # the jitter lets each side win some of the races
    mysql_stock, sold = await inventory(engine, product_id)
    assert (mysql_stock, sold) == (cancelled, paid)
    report = await Realigner(engine, store, 60).realign(product_id)
    assert report.redis_stock_after == mysql_stock and report.drift == 0
    assert len(await redis.hgetall(store.product_keys(product_id).quota)) == paid


async def test_refunds_admin_then_channel_idempotent_and_restock_only_once_confirmed(
    client, token, admin, put_product, product_id, engine, redis, settings, consumer
):
    await put_product(product_id, stock=3, limit=1)
    keep, restock = await buy_and_settle(client, token, engine, product_id, ["r1", "r2"])
    for order_no in (keep, restock):
        assert (await notify(client, settings, order_no, txn=f"pay-{order_no}")).json()["result"] == "paid"

    plain = await client.post(f"/api/v1/admin/orders/{keep}/refund", headers=admin)
    assert plain.status_code == 200 and plain.json()["status"] == "refunding"
    assert plain.json()["refund_no"] == f"{keep}R1" and plain.json()["channel"] == "mockpay"
    assert (await client.post(f"/api/v1/admin/orders/{keep}/refund", headers=admin)).status_code == 409
    with_stock = await client.post(f"/api/v1/admin/orders/{restock}/refund", json={"restock": True}, headers=admin)
    assert with_stock.status_code == 200 and with_stock.json()["restock"] is True
    assert await inventory(engine, product_id) == (1, 2)  # nothing back before the channel confirms
    assert (await redis_state(redis, settings, product_id))["stock"] == "1"

    for _ in range(2):  # the channel confirms, twice
        done = await notify(client, settings, keep, txn=f"refund-{keep}", event="refunded")
    assert done.json() == {"result": "already_processed", "order_status": "refunded"}
    assert await status_of(engine, keep) is S.REFUNDED
    assert await inventory(engine, product_id) == (1, 2)  # no restock without asking
    confirmed = await notify(client, settings, restock, txn=f"refund-{restock}", event="refunded")
    assert confirmed.json() == {"result": "refunded", "order_status": "refunded"}
    assert await inventory(engine, product_id) == (2, 1)
    assert (await redis_state(redis, settings, product_id))["stock"] == "2"
    assert (await client.post(f"/api/v1/admin/orders/{keep}/refund", headers=token("r1"))).status_code == 403


async def test_a_channel_transaction_id_cannot_pay_two_orders(
    client, token, put_product, product_id, engine, settings, consumer
):
    await put_product(product_id, stock=2, limit=1)
    first, second = await buy_and_settle(client, token, engine, product_id, ["tx1", "tx2"])
    assert (await notify(client, settings, first, txn="shared-txn")).json()["result"] == "paid"
    reused = await notify(client, settings, second, txn="shared-txn")
    assert reused.status_code == 409 and reused.json()["code"] == "channel_txn_reused"
    assert await status_of(engine, second) is S.PENDING_PAYMENT and await payments_of(engine, second) == []


async def test_late_payment_after_cancel_is_refunded(
    client, token, put_product, product_id, engine, settings, consumer
):
    await put_product(product_id, stock=2, limit=1)
    [order_no] = await buy_and_settle(client, token, engine, product_id, ["late"])
    assert (await client.post(f"/api/v1/orders/{order_no}/cancel", headers=token("late"))).status_code == 200
    late = await notify(client, settings, order_no, txn="late-pay")
    assert late.json() == {"result": "refund_started", "order_status": "cancelled"}
    settled = await notify(client, settings, order_no, txn="late-refund", event="refunded")
    assert settled.json()["result"] == "refunded"
    assert [(p.event, p.status) for p in await payments_of(engine, order_no)] == [
        ("paid", "refunded"),
        ("refunded", "applied"),
    ]
    assert await status_of(engine, order_no) is S.CANCELLED


async def test_order_list_is_the_callers_newest_first_in_keyset_pages(
    client, token, put_product, new_product_id, engine, consumer
):
    products = [new_product_id() for _ in range(5)]
    for pid in products:
        await put_product(pid, stock=3, limit=1)
    mine = [(await buy_and_settle(client, token, engine, pid, ["lister"]))[0] for pid in products]
    await buy_and_settle(client, token, engine, products[0], ["other-lister"])

    seen, cursor, pages = [], None, 0
    while True:
        query = "?limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = (await client.get(f"/api/v1/orders{query}", headers=token("lister"))).json()
        seen += [o["order_no"] for o in page["orders"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 3 and seen == list(reversed(mine))
    bad = await client.get("/api/v1/orders?cursor=garbage!", headers=token("lister"))
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_request"


async def test_when_the_redis_step_of_a_cancel_is_lost_realignment_restores_stock_and_quota(
    client, token, put_product, product_id, engine, redis, store, settings, consumer
):
    from service.domain.orders.lifecycle import cancel_order, give_back_to_redis

    await put_product(product_id, stock=2, limit=1)
    [order_no] = await buy_and_settle(client, token, engine, product_id, ["lost-step"])
    returned = await cancel_order(
        engine, order_no, "buyer_cancelled", actor="buyer:u"
    )  # MySQL committed; Redis never told
    before = await redis_state(redis, settings, product_id)
    assert (before["stock"], before["quota"]) == ("1", {"lost-step": "1"})

    report = await Realigner(engine, store, 60).realign(product_id)
    after = await redis_state(redis, settings, product_id)
    assert (report.redis_stock_after, after["stock"], after["quota"]) == (2, "2", {})
    # The late Redis step, should it still come, finds the return already counted.
    assert await give_back_to_redis(store, returned) == "realigned"
    assert (await redis_state(redis, settings, product_id))["stock"] == "2"


async def test_refund_of_a_duplicate_charge_settles_that_charge_not_the_paid_order(
    client, token, put_product, product_id, engine, settings, consumer
):
    await put_product(product_id, stock=2, limit=1)
    [order_no] = await buy_and_settle(client, token, engine, product_id, ["charged-twice"])
    assert (await notify(client, settings, order_no, txn="D-1")).json()["result"] == "paid"
    assert (await notify(client, settings, order_no, txn="D-2")).json()["result"] == "duplicate_payment"
    refund = await notify(client, settings, order_no, txn="D-R", event="refunded")
    assert refund.json() == {"result": "refunded", "order_status": "paid"}
    assert [(p.channel_txn_id, p.status) for p in await payments_of(engine, order_no)] == [
        ("D-1", "applied"),
        ("D-2", "refunded"),
        ("D-R", "applied"),
    ]


@pytest.mark.parametrize("change", [{"amount": 1}, {"currency": "USD"}])
async def test_a_refund_that_does_not_match_the_order_is_flagged_and_changes_nothing(
    client, token, put_product, product_id, engine, settings, consumer, change
):
    await put_product(product_id, stock=2, limit=1)
    [order_no] = await buy_and_settle(client, token, engine, product_id, ["odd-refund"])
    assert (await notify(client, settings, order_no, txn=f"P-{order_no}")).json()["result"] == "paid"
    body = json.dumps(
        {
            "channel": "mockpay",
            "channel_txn_id": f"R-{order_no}",
            "order_no": order_no,
            "amount": 1500,
            "currency": settings.payment.currency,
            "event": "refunded",
            **change,
        }
    ).encode()
    headers = {
        "content-type": "application/json",
        "X-Signature": sign(settings.payment.channel_secrets["mockpay"], body),
    }
    response = await client.post("/api/v1/payments/notify", content=body, headers=headers)
    assert response.json() == {"result": "amount_mismatch", "order_status": "paid"}
    assert await status_of(engine, order_no) is S.PAID


async def test_a_refund_with_restock_keeps_the_buyers_quota(
    client, token, admin, put_product, product_id, engine, redis, store, settings, consumer
):
    await put_product(product_id, stock=3, limit=1)
    [order_no] = await buy_and_settle(client, token, engine, product_id, ["bob"])
    assert (await notify(client, settings, order_no, txn=f"pay-{order_no}")).json()["result"] == "paid"
    refund = await client.post(f"/api/v1/admin/orders/{order_no}/refund", json={"restock": True}, headers=admin)
    assert refund.status_code == 200
    confirmed = await notify(client, settings, order_no, txn=f"refund-{order_no}", event="refunded")
    assert confirmed.json()["result"] == "refunded"
    assert (await redis_state(redis, settings, product_id))["quota"] == {"bob": "1"}
    again = await client.post("/api/v1/orders", json={"product_id": product_id, "quantity": 1}, headers=token("bob"))
    assert again.status_code == 409 and again.json()["code"] == "limit_exceeded"
    await Realigner(engine, store, 60).realign(product_id)
    assert (await redis_state(redis, settings, product_id))["quota"] == {"bob": "1"}


@pytest.mark.parametrize("signature", ["é" * 64, "\udcff"])
async def test_a_non_ascii_signature_is_401_not_500(
    client, token, put_product, product_id, engine, settings, consumer, signature
):
    await put_product(product_id, stock=2, limit=1)
    [order_no] = await buy_and_settle(client, token, engine, product_id, ["ascii"])
    body, _ = notification(settings, order_no)
    raw_headers = [
        (b"content-type", b"application/json"),
        (b"x-signature", signature.encode("utf-8", "surrogateescape")),
    ]
    response = await client.post("/api/v1/payments/notify", content=body, headers=raw_headers)
    assert response.status_code == 401 and response.json()["code"] == "invalid_signature"
    assert await payments_of(engine, order_no) == []


async def test_cancelling_an_order_that_is_still_queued_is_409_not_404(client, token, put_product, product_id):
    await put_product(product_id, stock=2, limit=1)  # no consumer: the order stays queued
    accepted = await client.post(
        "/api/v1/orders", json={"product_id": product_id, "quantity": 1}, headers=token("quick")
    )
    response = await client.post(f"/api/v1/orders/{accepted.json()['order_no']}/cancel", headers=token("quick"))
    assert response.status_code == 409 and response.json()["code"] == "order_not_cancellable"
    assert response.headers["retry-after"]


async def test_forged_cursors_are_400(client, token):
    import base64

    for forged in ("2026-11-30T01:02:03+00:00|42", "2026-11-30T01:02:03|-1", "2026-11-30T01:02:03|0042", "x|1"):
        cursor = base64.urlsafe_b64encode(forged.encode()).decode().rstrip("=")
        response = await client.get(f"/api/v1/orders?cursor={cursor}", headers=token("lister"))
        assert response.status_code == 400, forged
