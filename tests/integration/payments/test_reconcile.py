"""Reconciliation against the simulator's daily bill, one test per kind of mismatch."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from db.models import OrderStatus as S
from service.bootstrap import open_job, opened
from tests.support import eventually, notify, payments_of, status_of
from toolkit.sale.isolation import environment

pytestmark = pytest.mark.slow


def _today():
    return datetime.now(UTC).date()


async def _mismatches(live, order_no: str, channel: str, *, apply: bool = False) -> list[tuple]:
    async with opened(open_job(live.settings, publish=False)) as resources:
        report = await resources.reconciler.reconcile(_today(), channel, apply=apply)
    [one] = report.channels
    assert one.error is None
    return [(m.kind, m.channel_amount, m.our_amount, m.fixed) for m in one.mismatches if m.order_no == order_no]


async def _paid_at_channel(live, token, user: str, order_no: str, channel: str = "mockpay") -> str:
    """Start the payment through the API and let the buyer pay; the channel's transaction id."""
    started = await live.api.post(f"/api/v1/orders/{order_no}/pay", json={"channel": channel}, headers=token(user))
    assert started.status_code == 200, started.text
    assert (await live.buyer_pays(channel, order_no)).status_code == 200
    return started.json()["channel_txn_id"]


async def test_a_payment_missing_here_is_reported_then_applied(
    one_order, clean_faults, client, token, put_product, product_id, engine, consumer
):
    live = clean_faults
    order_no = await one_order("rc-missing", stock=2)
    await live.faults(drop=1.0)
    await _paid_at_channel(live, token, "rc-missing", order_no)
    assert await _mismatches(live, order_no, "mockpay") == [("missing_here", 1500, None, None)]
    assert await status_of(engine, order_no) is S.PENDING_PAYMENT
    assert await _mismatches(live, order_no, "mockpay", apply=True) == [("missing_here", 1500, None, "paid")]
    assert await status_of(engine, order_no) is S.PAID
    assert await _mismatches(live, order_no, "mockpay") == []
    history = (await client.get(f"/api/v1/orders/{order_no}", headers=token("rc-missing"))).json()["history"]
    assert [(entry["to"], entry["actor"]) for entry in history][-1] == ("paid", "system:reconciliation")


async def test_a_payment_the_channel_never_made_is_missing_at_the_channel(
    one_order, clean_faults, client, token, put_product, product_id, engine, settings, consumer
):
    live = clean_faults
    order_no = await one_order("rc-forged", stock=2)
    assert (await notify(client, settings, order_no, txn=f"FORGED-{order_no}")).json()["result"] == "paid"
    assert await _mismatches(live, order_no, "mockpay", apply=True) == [("missing_at_channel", None, 1500, None)]


async def test_different_amounts_on_both_sides_are_an_amount_mismatch(
    one_order, clean_faults, client, token, put_product, product_id, engine, settings, consumer
):
    live = clean_faults
    order_no = await one_order("rc-amount", stock=2)
    await live.faults(drop=1.0)
    txn = await _paid_at_channel(live, token, "rc-amount", order_no)
    recorded = await notify(client, settings, order_no, txn=txn, amount=1)
    assert recorded.json()["result"] == "amount_mismatch"
    # The mismatched payment is also money owed back until it is settled.
    assert await _mismatches(live, order_no, "mockpay") == [
        ("amount_mismatch", 1500, 1, None),
        ("owed_back", None, 1, None),
    ]


async def test_a_second_payment_is_owed_back_until_its_channel_refunds_it(
    one_order, clean_faults, client, token, put_product, product_id, engine, consumer
):
    live = clean_faults
    order_no = await one_order("rc-twice", stock=2)
    await _paid_at_channel(live, token, "rc-twice", order_no, "mockpay")
    await eventually(lambda: _is_paid(engine, order_no))
    # The buyer also pays at altpay, outside our pay route (an old payment page, say).
    created = await live.sim.post(
        "/altpay/payments",
        json={"order_no": order_no, "amount": 1500, "currency": "CNY", "notify_url": live.settings.payment.notify_url},
    )
    assert created.status_code == 200
    assert (await live.buyer_pays("altpay", order_no)).status_code == 200

    async def recorded_twice():
        return len(await payments_of(engine, order_no)) == 2

    await eventually(recorded_twice)
    assert await _mismatches(live, order_no, "altpay") == [("owed_back", None, 1500, None)]
    assert await _mismatches(live, order_no, "mockpay") == []

    refund = {"refund_no": f"OPS-{order_no}", "order_no": order_no, "amount": 1500}
    assert (await live.sim.post("/altpay/refunds", json=refund)).status_code == 202

    async def settled():
        return ("altpay", "refunded") in [(p.channel, p.status) for p in await payments_of(engine, order_no)]

    await eventually(settled)
    assert await _mismatches(live, order_no, "altpay") == []
    assert await status_of(engine, order_no) is S.PAID


async def _is_paid(engine, order_no: str) -> bool:
    return await status_of(engine, order_no) is S.PAID


async def test_the_reconcile_command(clean_faults):
    live = clean_faults
    script = str(Path(sys.executable).with_name("flashsale"))
    env = {**os.environ, **environment(live.settings)}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([script, "reconcile", *args], env=env, capture_output=True, text=True, timeout=60)

    day = _today().isoformat()
    done = await asyncio.to_thread(run, "--date", day, "--channel", "altpay", "--json")
    report = json.loads(done.stdout)
    assert report["date"] == day and [c["channel"] for c in report["channels"]] == ["altpay"]
    assert done.returncode == (0 if report["clean"] else 1)
    table = await asyncio.to_thread(run, "--date", day)
    assert "mockpay:" in table.stdout and "altpay:" in table.stdout
    unknown = await asyncio.to_thread(run, "--date", day, "--channel", "nopay")
    assert unknown.returncode == 2 and "unknown channel" in unknown.stderr
