"""``/metrics`` per product: the line, admissions, tokens outstanding and expired, the wait until
admitted (docs/OPERATIONS.md)."""

from __future__ import annotations

import asyncio
import math

from prometheus_client.parser import text_string_to_metric_families

from service import metrics, metrics_readings
from tests.integration.waiting_room.test_join import as_told, join, lapse, poll


def _samples(text: str, product_id: int) -> dict[str, float]:
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("product_id") == str(product_id) and sample.name.startswith("flashsale_waiting_room"):
                key = sample.name + (f"{{le={sample.labels['le']}}}" if "le" in sample.labels else "")
                found[key] = sample.value
    return found


async def test_metrics_show_the_line_admissions_outstanding_expired_and_waits(
    client, put_product, product_id, token, redis, store, settings
):
    stock, crowd = 4, 50
    await put_product(product_id, stock=stock, limit=1, waiting_room=True)
    bound = math.ceil(stock * settings.waiting_room.admit_factor)
    users = [f"wr-metrics-{i}" for i in range(crowd)]
    await asyncio.gather(*(join(client, token(user), product_id) for user in users))
    await as_told(settings)
    tickets = [(await poll(client, token(user), product_id)).json() for user in users]
    holder = next(user for user, ticket in zip(users, tickets, strict=True) if ticket["state"] == "admitted")
    await lapse(redis, store.product_keys(product_id), holder)
    await poll(client, token(users[-1]), product_id)

    metrics.flush()
    found = _samples((await client.get("/metrics")).text, product_id)
    assert found["flashsale_waiting_room_admissions_total"] == bound + 1
    assert found["flashsale_waiting_room_admissions_expired_total"] == 1
    assert found["flashsale_waiting_room_admissions_outstanding"] == bound
    assert found["flashsale_waiting_room_waiting_buyers"] == crowd - bound - 1
    assert found["flashsale_waiting_room_wait_seconds_count"] == bound + 1
    room = (await asyncio.to_thread(metrics_readings.waiting_rooms))[str(product_id)]
    assert (room["admitted"], room["expired"], room["outstanding"]) == (bound + 1, 1, bound)
    assert room["wait_p50_seconds"] is not None and 0 <= room["wait_p50_seconds"] <= room["wait_p99_seconds"]


async def test_the_gauges_equal_redis_after_purchases_and_a_sold_out_room(
    client, put_product, product_id, token, redis, store, settings
):
    """Purchases change the admissions outstanding and the units held: their answers set the
    gauges, so after the last unit (when polls are answered by the sold-out flag, without Redis)
    the gauges still equal what Redis holds."""
    stock, crowd = 3, 8
    await put_product(product_id, stock=stock, limit=1, waiting_room=True)
    users = [f"wr-gauge-{i}" for i in range(crowd)]
    for user in users:  # one by one: the first three are admitted, each holding a unit
        await join(client, token(user), product_id)

    async def gauges() -> tuple[float, float, float]:
        metrics.flush()
        found = _samples((await client.get("/metrics")).text, product_id)
        return (
            found["flashsale_waiting_room_admissions_outstanding"],
            found["flashsale_waiting_room_units_held"],
            found["flashsale_waiting_room_waiting_buyers"],
        )

    async def in_redis() -> tuple[int, int, int]:
        counters = await store.rooms.counters(product_id)
        return counters["outstanding"], counters["held"], counters["waiting"]

    assert await gauges() == await in_redis() == (stock, stock, crowd - stock)
    tickets = [(await join(client, token(user), product_id)).json() for user in users[:stock]]
    for user, ticket in zip(users[:stock], tickets, strict=True):
        headers = {**token(user), "Admission-Token": ticket["admission_token"]}
        answer = await client.post("/api/v1/orders", json={"product_id": product_id, "quantity": 1}, headers=headers)
        assert answer.status_code == 202, answer.text
        assert await gauges() == await in_redis()
    assert await in_redis() == (0, 0, crowd - stock)
    await as_told(settings)
    assert {(await poll(client, token(user), product_id)).json()["state"] for user in users[stock:]} == {"sold_out"}
    assert await gauges() == await in_redis() == (0, 0, crowd - stock)
