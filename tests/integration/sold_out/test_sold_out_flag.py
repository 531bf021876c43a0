"""The API's per-process sold-out flags on the real servers: a returned unit reaches every API
process, nothing oversells while the flags flip, replays still answer their 202.

Two API apps (two ``create_app`` instances, each with its own Redis, MySQL and RabbitMQ
connections, shard lease, flags and restock subscription) stand for two API processes. Their
flags live 60 s here, so a flag that goes away within the test was cleared by an announcement,
not by its TTL.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections import Counter
from contextlib import AsyncExitStack
from dataclasses import dataclass

import httpx
import pytest
from sqlalchemy import text

from service.api.app import create_app
from service.domain.orders.lifecycle import expire_unpaid
from service.domain.purchase.sold_out import FlagAnswer, SoldOutFlags
from service.domain.stock.realign import Realigner
from service.model.stock import ReserveRequest
from tests.support import buy, eventually, inventory, order_rows, rows_at_least, running_consumer, serving

LONG_TTL = 60.0
ANNOUNCEMENT_PATIENCE = 10.0
"""Far below LONG_TTL: a flag cleared within it was cleared by an announcement."""


@dataclass
class Api:
    """One API "process": its HTTP client and its sold-out flags."""

    client: httpx.AsyncClient
    flags: SoldOutFlags
    raised: int = 0  # flags this process raised (sold_out answers from Redis that stuck)


def _count_raised(api: Api) -> None:
    original = api.flags.sold_out

    def counting(*args, **kwargs) -> bool:
        raised = original(*args, **kwargs)
        api.raised += raised
        return raised

    api.flags.sold_out = counting  # type: ignore[method-assign]


@pytest.fixture
async def apis(settings):
    """Two API apps with 60 s flags, both following the restock channel."""
    orders = settings.orders.model_copy(update={"sold_out_flag_seconds": LONG_TTL})
    long_lived = settings.model_copy(update={"orders": orders})
    async with AsyncExitStack() as stack:
        pair = []
        for _ in range(2):
            app = create_app(long_lived)
            client = await stack.enter_async_context(serving(app, timeout=30))
            flags = app.dependencies["worker_resources"].dependency().current.sold_out
            assert isinstance(flags, SoldOutFlags)
            pair.append(Api(client, flags))
        for api in pair:
            await eventually(lambda api=api: _true(api.flags.live))
            _count_raised(api)
        yield pair


async def _true(value: bool) -> bool:
    return value


async def _flag_cleared(flags: SoldOutFlags, product_id: int) -> bool:
    return flags.verdict(product_id, 1) is None


async def _created_before(engine, order_no: str, seconds_ago: int) -> bool:
    async with engine.connect() as conn:
        return bool(
            (
                await conn.execute(
                    text("SELECT COUNT(*) FROM orders WHERE order_no = :o AND created_at < NOW() - INTERVAL :s SECOND"),
                    {"o": order_no, "s": seconds_ago},
                )
            ).scalar()
        )


@pytest.mark.parametrize("give_back", ["cancel", "sweep", "product_set"])
async def test_a_unit_returned_mid_sale_is_bought_again_through_the_other_process(
    apis, admin, token, put_product, product_id, engine, store, consumer, give_back
):
    first, second = apis
    await put_product(product_id, stock=1, limit=1)
    bought = await buy(first.client, token("early"), product_id)
    assert bought.status_code == 202
    order_no = bought.json()["order_no"]
    await eventually(lambda: rows_at_least(engine, product_id, 1))

    refused = await buy(second.client, token("late"), product_id)
    assert refused.status_code == 409 and refused.json()["code"] == "sold_out"
    assert second.flags.verdict(product_id, 1) is FlagAnswer.SOLD_OUT  # the second process is flagged

    if give_back == "cancel":  # through the first process's route
        cancelled = await first.client.post(f"/api/v1/orders/{order_no}/cancel", headers=token("early"))
        assert cancelled.status_code == 200, cancelled.text
    elif give_back == "sweep":  # as `flashsale sweep` would, from a third Redis client
        await eventually(lambda: _created_before(engine, order_no, seconds_ago=1))
        assert await expire_unpaid(engine, store, window_seconds=1) >= 1
    else:  # `product set` raising the stock, through the first process's admin route
        body = {"stock": 2, "per_user_limit": 1, "price": 1500, "stock_mode": "redis"}
        raised = await first.client.put(f"/api/v1/admin/products/{product_id}", json=body, headers=admin)
        assert raised.status_code == 200, raised.text

    started = time.monotonic()
    await eventually(lambda: _flag_cleared(second.flags, product_id), timeout=ANNOUNCEMENT_PATIENCE)
    assert time.monotonic() - started < LONG_TTL
    again = await buy(second.client, token("late"), product_id)
    assert again.status_code == 202, again.text


async def test_nothing_oversells_while_units_come_back_one_by_one_under_a_stampede(
    apis, token, put_product, product_id, engine, store, settings
):
    """200 keyless buyers hammer both processes while an operator raises the stock one unit at a
    time (`product set` from a third process: only the announcements can clear the 60 s flags).
    The orders stay queued during the stampede (realignment counts them in flight) and are drained
    into MySQL afterwards."""
    stock, returned = 30, 12
    await put_product(product_id, stock=stock, limit=1)
    first_wave = await asyncio.gather(*(buy(apis[i % 2].client, token(f"w1-{i}"), product_id) for i in range(stock)))
    assert Counter(r.status_code for r in first_wave) == {202: stock}

    accepted: list[tuple[str, str]] = []
    answers: Counter[str] = Counter()
    done = asyncio.Event()

    async def buyer(n: int) -> None:
        user = f"w2-{n}"
        for attempt in itertools.count():
            if done.is_set():
                return
            response = await buy(apis[(n + attempt) % 2].client, token(user), product_id)
            if response.status_code == 202:
                accepted.append((user, response.json()["order_no"]))
                if len(accepted) >= returned:
                    done.set()
                return
            answers[response.json()["code"]] += 1
            await asyncio.sleep(random.uniform(0.02, 0.08))

    async def give_back_one_by_one() -> None:
        for n in range(1, returned + 1):
            await asyncio.sleep(0.1)
            await put_product(product_id, stock=stock + n, limit=1)

    buyers = [asyncio.create_task(buyer(n)) for n in range(200)]
    try:
        await give_back_one_by_one()
        await asyncio.wait_for(done.wait(), ANNOUNCEMENT_PATIENCE * 3)
    finally:
        done.set()
        await asyncio.gather(*buyers)

    assert len(accepted) == returned  # every returned unit sold again, none twice
    assert set(answers) == {"sold_out"}
    assert apis[0].raised > 0 and apis[1].raised > 0  # the flags did flip in both processes
    async with running_consumer(settings, engine, store):
        await eventually(lambda: rows_at_least(engine, product_id, stock + returned))
    rows = await order_rows(engine, product_id)
    live = [row for row in rows if row.status not in (4, 7)]  # not cancelled, not rejected
    assert len(rows) == len(live) == stock + returned  # every 202 became an applied order
    assert max(Counter(row.user_id for row in live).values()) == 1  # no user over the limit of 1
    assert {row.order_no for row in live} >= {order_no for _, order_no in accepted}
    assert await inventory(engine, product_id) == (0, stock + returned)  # sold == stock put in
    report = await Realigner(engine, store, 60).realign(product_id)
    assert (report.mysql_stock, report.redis_stock_after) == (0, 0)


async def test_a_keyed_replay_of_an_accepted_purchase_still_answers_its_202_while_flagged(
    apis, token, put_product, product_id
):
    api = apis[0]
    await put_product(product_id, stock=1, limit=2)
    body = {"product_id": product_id, "quantity": 1}
    keyed = {**token("keeper"), "Idempotency-Key": "k-1"}
    accepted = await api.client.post("/api/v1/orders", json=body, headers=keyed)
    assert accepted.status_code == 202

    refused = await buy(api.client, token("other"), product_id)
    assert refused.status_code == 409 and refused.json()["code"] == "sold_out"
    assert api.flags.verdict(product_id, 1) is FlagAnswer.SOLD_OUT

    replay = await api.client.post("/api/v1/orders", json=body, headers=keyed)
    assert (replay.status_code, replay.json()) == (202, accepted.json())
    assert replay.headers["location"] == accepted.headers["location"]
    reused = await api.client.post("/api/v1/orders", json={**body, "quantity": 2}, headers=keyed)
    assert reused.status_code == 422 and reused.json()["code"] == "idempotency_key_reused"
    # Answered from the flag exactly as reserve.lua answers: above the limit is a 400, else sold_out
    # (the stock check comes before the user's quota, so a buyer at the limit hears sold_out too).
    over = await buy(api.client, token("other"), product_id, quantity=3)
    assert over.status_code == 400 and over.json()["errors"][0]["field"] == "quantity"
    assert (await buy(api.client, token("keeper"), product_id, quantity=2)).json()["code"] == "sold_out"
    assert (await buy(api.client, token("keeper"), product_id, quantity=2, key="k-2")).json()["code"] == "sold_out"


async def test_the_flags_answer_is_the_answer_redis_gives(apis, token, put_product, product_id):
    """The flag answers with a pre-encoded body, not through the exception handler: a client
    cannot tell it from the answer that went to Redis (keyed requests always do)."""
    api = apis[0]
    await put_product(product_id, stock=0, limit=2)
    for quantity in (1, 3):  # sold_out, and above the per-user limit
        from_redis = await buy(api.client, token("a"), product_id, quantity=quantity, key=f"q{quantity}")
        await buy(api.client, token("a"), product_id, quantity=quantity)  # raises the flag if not yet
        assert api.flags.verdict(product_id, quantity) is not None
        from_flag = await buy(api.client, token("b"), product_id, quantity=quantity)
        assert from_flag.status_code == from_redis.status_code in (400, 409)
        assert from_flag.headers["content-type"] == from_redis.headers["content-type"] == "application/problem+json"
        assert from_flag.json() == from_redis.json()


async def test_every_script_that_puts_stock_back_announces_the_product(
    put_product, product_id, engine, store, redis, settings
):
    """restock, release and a realignment that writes each PUBLISH the product id."""
    await put_product(product_id, stock=2, limit=1)
    pubsub = redis.pubsub()
    await pubsub.subscribe(f"{settings.redis.key_prefix}:restocked")
    try:
        assert (await pubsub.get_message(timeout=5))["type"] == "subscribe"

        reservation = await store.reservations.reserve(
            ReserveRequest(product_id, "r-release", "u", 1, "FS00000000000000000000000000", "a1")
        )
        assert reservation.outcome == "reserved"
        assert await store.reservations.release(product_id, "r-release", "a1") == "released"
        assert await _next_announcement(pubsub) == str(product_id)

        await Realigner(engine, store, 60).realign(product_id)  # writes, stock left to sell
        assert await _next_announcement(pubsub) == str(product_id)
        await Realigner(engine, store, 60).realign(product_id, dry_run=True)  # writes nothing: silent

        assert (
            await store.reservations.restock(product_id, "FS-order-x", "u", 1, 10**9, release_quota=False) == "returned"
        )
        assert await _next_announcement(pubsub) == str(product_id)
        await Realigner(engine, store, 60).realign(product_id)  # stale (the restock is newer): silent
        assert await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2) is None
    finally:
        await pubsub.aclose()


async def _next_announcement(pubsub) -> str:
    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5)
    assert message is not None and message["type"] == "message"
    return message["data"]
