"""Who made each status change (an order's audit trail: time, operator, reason):
``order_status_log.actor``, shown in the order's ``history``."""

from __future__ import annotations

from db.models import OrderStatus as S
from service.domain.orders.lifecycle import expire_unpaid
from tests.support import buy, buy_and_settle, eventually, notify, status_of


async def _history(client, headers, order_no: str) -> list[tuple[str, str | None]]:
    answer = await client.get(f"/api/v1/orders/{order_no}", headers=headers)
    assert answer.status_code == 200, answer.text
    return [(entry["to"], entry["actor"]) for entry in answer.json()["history"]]


async def test_each_status_change_names_who_made_it(
    client, token, admin, put_product, new_product_id, engine, store, settings, consumer
):
    queued, direct = new_product_id(), new_product_id()
    await put_product(queued, stock=5, limit=1)
    cancelled, refunded, swept = await buy_and_settle(client, token, engine, queued, ["ac-1", "ac-2", "ac-3"])

    assert (await client.post(f"/api/v1/orders/{cancelled}/cancel", headers=token("ac-1"))).status_code == 200
    assert (await notify(client, settings, refunded, txn=f"pay-{refunded}")).json()["result"] == "paid"
    assert (await client.post(f"/api/v1/admin/orders/{refunded}/refund", headers=admin)).status_code == 200
    done = await notify(client, settings, refunded, txn=f"refund-{refunded}", event="refunded")
    assert done.json()["order_status"] == "refunded"

    async def sweep() -> bool:
        await expire_unpaid(engine, store, window_seconds=0, product_id=queued)
        return await status_of(engine, swept) is S.CANCELLED

    await eventually(sweep)  # created_at has one-second precision: the sweep sees it a second later

    await put_product(direct, stock=5, limit=1, stock_mode="database")
    bought = await buy(client, token("ac-4"), direct)
    assert bought.status_code == 201

    assert await _history(client, token("ac-1"), cancelled) == [
        ("pending_payment", "system:consumer"),
        ("cancelled", "buyer:ac-1"),
    ]
    assert await _history(client, token("ac-2"), refunded) == [
        ("pending_payment", "system:consumer"),
        ("paid", "channel:mockpay"),
        ("refunding", "admin:admin"),
        ("refunded", "channel:mockpay"),
    ]
    assert await _history(client, token("ac-3"), swept) == [
        ("pending_payment", "system:consumer"),
        ("cancelled", "system:sweep"),
    ]
    assert await _history(client, token("ac-4"), bought.json()["order_no"]) == [("pending_payment", "buyer:ac-4")]
