"""Realignment with a big journal (one Lua call over 200k entries once blocked Redis for 1.04 s,
docs/BENCHMARKS.md): bounded work per Lua call, the same exact
result as the full pass, and overdue reservations re-published once per back-off period."""

from __future__ import annotations

import asyncio

import pytest

from service.adapters.broker import Publisher
from service.adapters.redis.reservations import new_attempt
from service.domain.fulfilment.order_writer import apply_order
from service.domain.order_numbers.format import compose_order_no
from service.domain.purchase.request_id import mint_request_id
from service.domain.stock import realign as realign_module
from service.domain.stock.realign import FULL_PASS_MAX_ENTRIES, Realigner
from service.model.order_message import OrderMessage
from service.model.stock import ReserveRequest
from tests.support import inventory


async def _reserve(store, product_id: int, count: int, tag: int) -> list[OrderMessage]:
    """``count`` reservations of one unit each through the real reserve script."""
    messages = []
    for i in range(count):
        request_id = mint_request_id()
        order_no = compose_order_no("FS", "20261130000003", tag, (product_id % 100) * 10_000 + i)
        reservation = await store.reservations.reserve(
            ReserveRequest(product_id, request_id, f"u{i}", 1, order_no, new_attempt())
        )
        assert reservation.outcome == "reserved"
        messages.append(OrderMessage(request_id, order_no, f"u{i}", product_id, 1, reservation.reserved_at_ms, 1500))
    return messages


async def test_a_big_journal_is_realigned_incrementally_and_exactly(
    engine, redis, store, put_product, product_id, monkeypatch
):
    entries = FULL_PASS_MAX_ENTRIES + 300
    await put_product(product_id, stock=entries + 50, limit=1)
    keys = store.product_keys(product_id)
    messages = await _reserve(store, product_id, entries, 93)
    for message in messages[:250]:  # consumers wrote some of them
        await apply_order(engine, message)
    await redis.set(keys.stock, 7)  # and Redis drifted

    calls: list[str] = []
    original = store.stock.realign

    async def observed(*args, **kwargs):
        calls.append("incremental" if kwargs["resolved"] is None else "full")
        return await original(*args, **kwargs)

    monkeypatch.setattr(store.stock, "realign", observed)
    dry = await Realigner(engine, store, 60).realign(product_id, dry_run=True)
    report = await Realigner(engine, store, 60).realign(product_id)
    assert calls == ["incremental", "incremental"]
    mysql_stock, _ = await inventory(engine, product_id)
    expected = mysql_stock - (entries - 250)
    assert (dry.redis_stock_after, dry.in_flight, dry.in_flight_units, dry.resolved_dropped) == (
        expected,
        entries - 250,
        entries - 250,
        250,
    )
    assert (report.redis_stock_before, report.redis_stock_after, report.in_flight, report.resolved_dropped) == (
        7,
        expected,
        entries - 250,
        250,
    )
    assert await redis.get(keys.stock) == str(expected)
    assert await redis.hlen(keys.journal) == entries - 250
    assert await redis.get(keys.units) == str(entries - 250)

    # The full pass (one Lua call over the whole journal) comes to the same numbers.
    monkeypatch.setattr(realign_module, "FULL_PASS_MAX_ENTRIES", 10**9)
    await redis.set(keys.stock, 7)
    full = await Realigner(engine, store, 60).realign(product_id)
    assert calls[-1] == "full"
    assert (full.redis_stock_after, full.in_flight) == (expected, entries - 250)
    assert await redis.get(keys.units) == str(entries - 250)


@pytest.mark.parametrize("journal", ["small", "big"])
async def test_an_overdue_reservation_is_republished_once_per_back_off_not_once_per_pass(
    engine, store, settings, put_product, product_id, journal, monkeypatch
):
    """Guards: with consumers lagging behind, every pass published every overdue entry again
    (2,640 messages for 441 orders)."""
    if journal == "big":
        monkeypatch.setattr(realign_module, "FULL_PASS_MAX_ENTRIES", 2)
    await put_product(product_id, stock=10, limit=1)
    await _reserve(store, product_id, 3, 92)
    publisher = Publisher(settings.amqp)
    await publisher.connect()
    try:
        realigner = Realigner(engine, store, grace_seconds=0.2, publisher=publisher)
        await asyncio.sleep(0.3)  # past the grace period
        passes = [(await realigner.realign(product_id)).republished for _ in range(5)]
        # A second realignment job (another process) does not publish them again either.
        other = await Realigner(engine, store, grace_seconds=0.2, publisher=publisher).realign(product_id)
    finally:
        await publisher.close()
    assert passes == [3, 0, 0, 0, 0] and other.republished == 0
