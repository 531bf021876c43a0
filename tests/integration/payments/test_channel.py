"""Paying through the channel simulator over real HTTP: the pay route, parallel channel
attempts, the sweep's active query and close, ``flashsale payments sync``, refunds through the
channel, and the simulator's fault knobs."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import bindparam, text

from db.models import OrderStatus as S
from service.bootstrap import open_job, opened
from service.domain.orders.lifecycle import expire_unpaid
from tests.support import buy_and_settle, eventually, inventory, payments_of, redis_state, status_of
from toolkit.sale.isolation import environment

pytestmark = pytest.mark.slow


async def _pay(live, token, user: str, order_no: str, channel: str):
    return await live.api.post(f"/api/v1/orders/{order_no}/pay", json={"channel": channel}, headers=token(user))


async def _paid_with_the_notification_lost(live, token, user: str, order_no: str, channel: str) -> None:
    """The buyer starts paying at ``channel`` and pays there; the channel drops the notification."""
    assert (await _pay(live, token, user, order_no, channel)).status_code == 200
    await live.faults(drop=1.0)
    assert (await live.buyer_pays(channel, order_no)).status_code == 200


async def _becomes(engine, order_no: str, status: S) -> None:
    async def reached():
        return await status_of(engine, order_no) is status

    await eventually(reached)


async def _overdue(engine, order_no: str) -> None:
    """Wait until the order's ``created_at`` is in the past second (a window of 0 s then covers it)."""

    async def older():
        async with engine.connect() as conn:
            query = text("SELECT created_at < NOW() FROM orders WHERE order_no = :o")
            return bool((await conn.execute(query, {"o": order_no})).scalar())

    await eventually(older, interval=0.2)


async def test_the_pay_route_reuses_one_merchant_order_number_and_the_notification_pays(
    one_order, clean_faults, client, token, put_product, product_id, engine, consumer
):
    live = clean_faults
    order_no = await one_order("payer", stock=2)
    first = await _pay(live, token, "payer", order_no, "mockpay")
    assert first.status_code == 200, first.text
    params = first.json()
    assert (params["order_no"], params["channel"], params["amount"], params["status"]) == (
        order_no,
        "mockpay",
        1500,
        "unpaid",
    )
    again = await _pay(live, token, "payer", order_no, "mockpay")  # a refresh, a retry
    assert again.json()["channel_txn_id"] == params["channel_txn_id"]
    assert (await _pay(live, token, "someone-else", order_no, "mockpay")).status_code == 404

    assert (await live.sim.post(params["pay_url"])).json()["status"] == "paid"  # the buyer pays
    await _becomes(engine, order_no, S.PAID)

    async def notification_logged() -> bool:
        # JSON, as every process logs; the simulator logs its notification once the API answered
        # it, which may be after the API committed the payment
        notified = [json.loads(line) for line in live.sim_log.read_text().splitlines()]
        return any(line.get("logger") == "httpx" for line in notified)

    await eventually(notification_logged)
    [payment] = await payments_of(engine, order_no)
    assert (payment.channel, payment.channel_txn_id, payment.idem_key) == (
        "mockpay",
        params["channel_txn_id"],
        f"pay:{order_no}:paid",
    )
    paid_again = await _pay(live, token, "payer", order_no, "mockpay")
    assert paid_again.status_code == 409 and paid_again.json()["code"] == "order_not_payable"
    today = datetime.now(UTC).date().isoformat()
    bill = (await live.sim.get("/mockpay/bill", params={"date": today})).json()["transactions"]
    assert [(t["order_no"], t["amount"], t["type"]) for t in bill if t["order_no"] == order_no] == [
        (order_no, 1500, "payment")
    ]


async def test_a_second_channel_closes_the_first_at_its_channel_first(
    one_order, clean_faults, client, token, put_product, product_id, engine, consumer
):
    live = clean_faults
    order_no = await one_order("switcher", stock=2)
    assert (await _pay(live, token, "switcher", order_no, "mockpay")).status_code == 200
    switched = await _pay(live, token, "switcher", order_no, "altpay")
    assert switched.status_code == 200 and switched.json()["channel"] == "altpay"
    assert (await live.sim.get(f"/mockpay/payments/{order_no}")).json()["status"] == "closed"
    late = await live.buyer_pays("mockpay", order_no)
    assert late.status_code == 409 and late.json()["code"] == "payment_closed"
    assert (await live.buyer_pays("altpay", order_no)).status_code == 200
    await _becomes(engine, order_no, S.PAID)
    assert [(p.channel, p.status) for p in await payments_of(engine, order_no)] == [("altpay", "applied")]


async def test_a_second_channel_while_the_first_cannot_be_closed_is_payment_in_progress(
    one_order, clean_faults, client, token, put_product, product_id, engine, consumer
):
    live = clean_faults
    order_no = await one_order("stuck", stock=2)
    down = await _pay(live, token, "stuck", order_no, "deadpay")
    assert down.status_code == 503 and down.json()["code"] == "channel_unavailable" and down.headers["retry-after"]
    refused = await _pay(live, token, "stuck", order_no, "mockpay")
    assert refused.status_code == 409 and refused.json()["code"] == "payment_in_progress"
    assert refused.headers["retry-after"] == "1"
    assert (await live.sim.get(f"/mockpay/payments/{order_no}")).status_code == 404  # never created there


async def test_paid_at_the_first_channel_with_the_notification_lost_is_found_by_the_switch(
    one_order, clean_faults, client, token, put_product, product_id, engine, consumer
):
    live = clean_faults
    order_no = await one_order("lost-note", stock=2)
    await _paid_with_the_notification_lost(live, token, "lost-note", order_no, "mockpay")
    switched = await _pay(live, token, "lost-note", order_no, "altpay")
    assert switched.status_code == 409 and switched.json()["code"] == "order_not_payable"
    assert await status_of(engine, order_no) is S.PAID
    assert (await live.sim.get(f"/altpay/payments/{order_no}")).status_code == 404


async def test_bad_pay_requests_are_4xx(
    one_order, clean_faults, client, token, put_product, product_id, engine, consumer
):
    live = clean_faults
    order_no = await one_order("bad-pay", stock=2)
    for body, code in (
        ({"channel": "nopay"}, "invalid_request"),
        ({"channel": "mockpay", "extra": 1}, "invalid_request"),
        ({}, "invalid_request"),
    ):
        answer = await live.api.post(f"/api/v1/orders/{order_no}/pay", json=body, headers=token("bad-pay"))
        assert answer.status_code == 400 and answer.json()["code"] == code, answer.text
    bad_no = await _pay(live, token, "bad-pay", "FS123", "mockpay")
    assert bad_no.status_code == 400 and bad_no.json()["code"] == "invalid_order_no"
    async with engine.connect() as conn:
        attempts = await conn.execute(
            text("SELECT COUNT(*) FROM payment_attempts WHERE order_no = :o"), {"o": order_no}
        )
        assert attempts.scalar() == 0


async def test_the_sweep_asks_the_channel_before_cancelling(
    clean_faults, client, token, put_product, product_id, engine, store, consumer
):
    """Three overdue orders: paid at mockpay with the notification lost (-> paid), an open
    unpaid attempt (-> closed at the channel, then cancelled), an attempt at a channel that does
    not answer (-> left pending for the next sweep)."""
    live = clean_faults
    await put_product(product_id, stock=3, limit=1)
    paid, unpaid, unknown = await buy_and_settle(client, token, engine, product_id, ["s-paid", "s-unpaid", "s-dead"])
    for user, order_no, channel in (("s-paid", paid, "mockpay"), ("s-unpaid", unpaid, "altpay")):
        assert (await _pay(live, token, user, order_no, channel)).status_code == 200
    assert (await _pay(live, token, "s-dead", unknown, "deadpay")).status_code == 503
    await live.faults(drop=1.0)
    assert (await live.buyer_pays("mockpay", paid)).status_code == 200
    for order_no in (paid, unpaid, unknown):
        await _overdue(engine, order_no)

    async with opened(open_job(live.settings, publish=False)) as resources:
        cancelled = await expire_unpaid(
            engine, store, 0, product_id=product_id, may_cancel=resources.checkout.may_cancel
        )
    assert cancelled == 1
    assert [await status_of(engine, o) for o in (paid, unpaid, unknown)] == [S.PAID, S.CANCELLED, S.PENDING_PAYMENT]
    assert (await live.sim.get(f"/altpay/payments/{unpaid}")).json()["status"] == "closed"
    assert (await live.buyer_pays("altpay", unpaid)).status_code == 409  # the buyer can no longer pay it
    assert await inventory(engine, product_id) == (1, 2)


async def test_a_notification_racing_the_sweeps_query_pays_once(
    one_order, clean_faults, client, token, put_product, product_id, engine, store, consumer
):
    live = clean_faults
    order_no = await one_order("racer", stock=2)
    assert (await _pay(live, token, "racer", order_no, "mockpay")).status_code == 200
    await live.faults(delay=0.3, duplicate=1.0)
    assert (await live.buyer_pays("mockpay", order_no)).status_code == 200
    await _overdue(engine, order_no)
    async with opened(open_job(live.settings, publish=False)) as resources:
        assert (
            await expire_unpaid(engine, store, 0, product_id=product_id, may_cancel=resources.checkout.may_cancel) == 0
        )

    async def both_delivered():
        stats = (await live.sim.get("/faults")).json()["stats"]
        return stats.get("delivered", 0) >= 2

    await eventually(both_delivered)
    assert await status_of(engine, order_no) is S.PAID
    assert [(p.channel, p.status, p.idem_key) for p in await payments_of(engine, order_no)] == [
        ("mockpay", "applied", f"pay:{order_no}:paid")
    ]


async def test_payments_sync_applies_a_payment_whose_notification_was_lost(
    one_order, clean_faults, client, token, put_product, product_id, engine, consumer
):
    live = clean_faults
    order_no = await one_order("syncer", stock=2)
    await _paid_with_the_notification_lost(live, token, "syncer", order_no, "altpay")
    await asyncio.sleep(0.3)
    assert await status_of(engine, order_no) is S.PENDING_PAYMENT
    script = str(Path(sys.executable).with_name("flashsale"))
    done = await asyncio.to_thread(
        subprocess.run,
        [script, "payments", "sync", order_no],
        env={**os.environ, **environment(live.settings)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert [json.loads(line) for line in done.stdout.splitlines()] == [
        {"channel": "altpay", "status": "paid", "applied": "paid"}
    ]
    assert await status_of(engine, order_no) is S.PAID


async def test_refunds_go_through_the_channel_and_restock_only_when_it_confirms(
    one_order, clean_faults, client, token, admin, put_product, product_id, engine, redis, settings, consumer
):
    live = clean_faults
    order_no = await one_order("refundee", stock=1)
    assert (await _pay(live, token, "refundee", order_no, "mockpay")).status_code == 200
    assert (await live.buyer_pays("mockpay", order_no)).status_code == 200
    await _becomes(engine, order_no, S.PAID)

    await live.faults(fail_refunds=1.0)
    refund = f"/api/v1/admin/orders/{order_no}/refund"
    first = await live.api.post(refund, json={"restock": True}, headers=admin)
    assert first.status_code == 200 and first.json()["channel"] == "mockpay"
    await _becomes(engine, order_no, S.PAID)  # refund_failed came back
    assert await inventory(engine, product_id) == (0, 1)

    await live.faults()
    second = await live.api.post(refund, json={"restock": True}, headers=admin)
    assert second.json()["refund_no"] == f"{order_no}R2"
    await _becomes(engine, order_no, S.REFUNDED)
    assert await inventory(engine, product_id) == (1, 0)
    assert (await redis_state(redis, settings, product_id))["stock"] == "1"
    events = [(p.event, p.status) for p in await payments_of(engine, order_no)]
    assert events == [("paid", "applied"), ("refund_failed", "applied"), ("refunded", "applied")]
    today = datetime.now(UTC).date().isoformat()
    bill = (await live.sim.get("/mockpay/bill", params={"date": today})).json()["transactions"]
    assert [t["type"] for t in bill if t["order_no"] == order_no] == ["payment", "refund"]


async def test_a_refund_the_channel_does_not_answer_leaves_the_order_paid(
    one_order, clean_faults, client, token, admin, put_product, product_id, engine, settings, consumer
):
    """The order's payment is recorded at deadpay (a channel whose URL nobody answers on): the
    refund cannot reach it, so the order is paid again and the answer is 503."""
    from tests.support import notify

    live = clean_faults
    order_no = await one_order("dead-refund", stock=1)
    paid = await notify(client, settings, order_no, txn=f"P-{order_no}")
    assert paid.json()["result"] == "paid"
    async with engine.begin() as conn:  # the payment came from a channel with no URL here: as if deadpay
        await conn.execute(text("UPDATE payments SET channel = 'deadpay' WHERE order_no = :o"), {"o": order_no})
    answer = await live.api.post(f"/api/v1/admin/orders/{order_no}/refund", headers=admin)
    assert answer.status_code == 503 and answer.json()["code"] == "channel_unavailable"
    assert await status_of(engine, order_no) is S.PAID


async def test_a_refund_the_channel_refuses_is_a_final_409_that_leaves_no_trace(
    one_order, clean_faults, client, token, admin, put_product, product_id, engine, settings, consumer
):
    """Paid by a hand-made notification, the order has no payment at mockpay: the simulator
    answers 404 payment_not_found. That is final: 409 refund_refused in the channel's words, no
    Retry-After, the order paid with no refunding step in its history and no refunds row, and
    the API logs the refusal. Asking again is refused the same way, and still leaves nothing."""
    from tests.support import notify

    live = clean_faults
    order_no = await one_order("refused-refund", stock=1)
    assert (await notify(client, settings, order_no, txn=f"P-{order_no}")).json()["result"] == "paid"
    route = f"/api/v1/admin/orders/{order_no}/refund"
    for _ in range(2):
        answer = await live.api.post(route, json={"restock": True}, headers=admin)
        assert answer.status_code == 409, answer.text
        assert answer.headers["content-type"] == "application/problem+json"
        problem = answer.json()
        assert problem["code"] == "refund_refused" and "retry-after" not in answer.headers
        assert "payment_not_found" in problem["detail"] and f"no payment for {order_no}" in problem["detail"]
    assert await status_of(engine, order_no) is S.PAID
    history = (await client.get(f"/api/v1/orders/{order_no}", headers=token("refused-refund"))).json()["history"]
    assert [entry["to"] for entry in history] == ["pending_payment", "paid"]
    async with engine.connect() as conn:
        rows = (await conn.execute(text("SELECT COUNT(*) FROM refunds WHERE order_no = :o"), {"o": order_no})).scalar()
    assert rows == 0

    def refusals() -> list[dict]:
        lines = [json.loads(line) for line in live.api_log.read_text().splitlines() if line.startswith("{")]
        return [line for line in lines if line.get("event") == "refund_refused" and line.get("order_no") == order_no]

    logged = refusals()
    assert len(logged) == 2 and logged[0]["channel"] == "mockpay" and logged[0]["code"] == "payment_not_found"


async def test_the_fault_knobs_duplicate_drop_and_reorder(
    clean_faults, client, token, put_product, product_id, engine, consumer
):
    live = clean_faults
    await put_product(product_id, stock=3, limit=1)
    dup, dropped, reordered = await buy_and_settle(client, token, engine, product_id, ["k-dup", "k-drop", "k-re"])
    for user, order_no in (("k-dup", dup), ("k-drop", dropped), ("k-re", reordered)):
        assert (await _pay(live, token, user, order_no, "mockpay")).status_code == 200
    before = (await live.sim.get("/faults")).json()["stats"]

    await live.faults(duplicate=1.0)
    await live.buyer_pays("mockpay", dup)
    await _becomes(engine, dup, S.PAID)
    await live.faults(drop=1.0)
    await live.buyer_pays("mockpay", dropped)
    await live.faults(reorder=1.0)
    await live.buyer_pays("mockpay", reordered)
    await _becomes(engine, reordered, S.PAID)  # held back at most a second, then sent
    await asyncio.sleep(0.3)
    stats = (await live.sim.get("/faults")).json()["stats"]
    delta = {k: stats.get(k, 0) - before.get(k, 0) for k in ("sent", "dropped", "duplicated", "reordered")}
    assert delta == {"sent": 3, "dropped": 1, "duplicated": 1, "reordered": 1}
    assert await status_of(engine, dropped) is S.PENDING_PAYMENT
    assert len(await payments_of(engine, dup)) == 1


async def test_a_hundred_orders_start_paying_at_once(
    clean_faults, client, token, put_product, product_id, engine, consumer
):
    live = clean_faults
    await put_product(product_id, stock=100, limit=1)
    users = [f"crowd-{n}" for n in range(100)]
    order_nos = await buy_and_settle(client, token, engine, product_id, users)
    channels = ["mockpay", "altpay"]
    answers = await asyncio.gather(
        *(_pay(live, token, user, o, channels[n % 2]) for n, (user, o) in enumerate(zip(users, order_nos, strict=True)))
    )
    assert Counter(a.status_code for a in answers) == {200: 100}, [a.text for a in answers if a.status_code != 200]
    assert len({a.json()["channel_txn_id"] for a in answers}) == 100
    async with engine.connect() as conn:
        query = text("SELECT status, COUNT(*) FROM payment_attempts WHERE order_no IN :o GROUP BY status")
        counts = dict((await conn.execute(query.bindparams(bindparam("o", expanding=True)), {"o": order_nos})).all())
    assert counts == {"open": 100}


async def test_forty_clicks_on_two_channels_leave_one_open_attempt_and_a_cancel_closes_both(
    one_order, clean_faults, client, token, put_product, product_id, engine, consumer
):
    live = clean_faults
    order_no = await one_order("clicker", stock=2)
    answers = await asyncio.gather(
        *(_pay(live, token, "clicker", order_no, ("mockpay", "altpay")[n % 2]) for n in range(40))
    )
    codes = Counter(a.status_code if a.status_code == 200 else a.json()["code"] for a in answers)
    assert set(codes) <= {200, "payment_in_progress"} and codes[200] >= 1, codes
    assert {a.json()["channel_txn_id"] for a in answers if a.status_code == 200} <= {
        (await live.sim.get(f"/{c}/payments/{order_no}")).json().get("channel_txn_id") for c in ("mockpay", "altpay")
    }
    async with engine.connect() as conn:
        query = text("SELECT status FROM payment_attempts WHERE order_no = :o")
        statuses = Counter((await conn.execute(query, {"o": order_no})).scalars())
    assert statuses["open"] == 1

    cancelled = await client.post(f"/api/v1/orders/{order_no}/cancel", headers=token("clicker"))
    assert cancelled.status_code == 409  # the in-process API has no channel URLs: it cannot close them
    cancelled = await live.api.post(f"/api/v1/orders/{order_no}/cancel", headers=token("clicker"))
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    for channel in ("mockpay", "altpay"):
        assert (await live.sim.get(f"/{channel}/payments/{order_no}")).json()["status"] == "closed"


async def test_a_buyer_cannot_cancel_an_order_paid_at_its_channel(
    one_order, clean_faults, client, token, put_product, product_id, engine, consumer
):
    live = clean_faults
    order_no = await one_order("regretful", stock=2)
    await _paid_with_the_notification_lost(live, token, "regretful", order_no, "mockpay")
    refused = await live.api.post(f"/api/v1/orders/{order_no}/cancel", headers=token("regretful"))
    assert refused.status_code == 409 and refused.json()["code"] == "order_not_cancellable"
    assert "retry-after" not in refused.headers
    assert await status_of(engine, order_no) is S.PAID


async def test_the_buyer_pays_with_the_channel_pay_command(
    one_order, clean_faults, client, token, put_product, product_id, engine, consumer
):
    live = clean_faults
    order_no = await one_order("cli-payer")
    assert (await _pay(live, token, "cli-payer", order_no, "altpay")).status_code == 200
    script = str(Path(sys.executable).with_name("flashsale"))
    env = {**os.environ, **environment(live.settings)}

    def pay(channel: str) -> subprocess.CompletedProcess:
        args = [script, "channel", "pay", order_no, "--channel", channel]
        return subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)

    unknown = await asyncio.to_thread(pay, "mockpay")  # no payment of this order at mockpay
    assert unknown.returncode == 1 and "payment_not_found" in unknown.stdout
    done = await asyncio.to_thread(pay, "altpay")
    assert done.returncode == 0 and '"status":"paid"' in done.stdout
    await _becomes(engine, order_no, S.PAID)
