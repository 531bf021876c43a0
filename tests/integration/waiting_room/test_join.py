"""Joining and polling a product's waiting room (docs/ARCHITECTURE.md, "Waiting room")."""

from __future__ import annotations

import asyncio
import math
from collections import Counter

QUEUE = "/api/v1/products/{}/queue"


async def join(client, headers, product_id: int):
    return await client.post(QUEUE.format(product_id), headers=headers)


async def poll(client, headers, product_id: int):
    return await client.get(QUEUE.format(product_id) + "/me", headers=headers)


async def lapse(redis, keys, user: str) -> None:
    """What an admission's expiry does later, now: it expires at ms 1, the room's first expiry
    (``lua/queue.lua`` looks for expired admissions from then on)."""
    await redis.zadd(keys.room_admitted, {user: 1})
    await redis.hset(keys.room, "expiry", 1)


async def as_told(settings) -> None:
    """Waiting buyers come back no sooner than told (sooner is answered 429, an admission is told
    no sooner): the suite's poll_max_ms."""
    await asyncio.sleep(settings.waiting_room.poll_max_ms / 1000)


async def test_the_setting_is_off_by_default_and_shown_in_product_info(client, put_product, product_id, token):
    info = await put_product(product_id, stock=3)
    shown = (await client.get(f"/api/v1/products/{product_id}")).json()
    assert shown["waiting_room"] is False
    answer = await join(client, token("wr-off"), product_id)
    assert (answer.status_code, answer.json()["code"]) == (409, "waiting_room_off")
    await put_product(product_id, stock=3, waiting_room=True)
    assert (await client.get(f"/api/v1/products/{product_id}")).json()["waiting_room"] is True
    assert info["product_id"] == product_id


async def test_a_room_needs_redis_mode_and_one_bucket(client, admin, new_product_id):
    for fields in ({"stock_mode": "database"}, {"stock_mode": "redis", "buckets": 4}):
        body = {"stock": 5, "per_user_limit": 1, "waiting_room": True, **fields}
        answer = await client.put(f"/api/v1/admin/products/{new_product_id()}", json=body, headers=admin)
        assert (answer.status_code, answer.json()["errors"][0]["field"]) == (400, "waiting_room"), answer.text


async def test_a_crowd_joining_at_once_gets_one_ticket_each_and_admission_stays_under_the_bound(
    client, put_product, product_id, token, settings
):
    stock, crowd = 40, 600
    await put_product(product_id, stock=stock, limit=1, waiting_room=True)
    users = [f"wr-crowd-{i}" for i in range(crowd)]
    # Each buyer joins three times at once (ten tabs, ten scripts): one place each.
    answers = await asyncio.gather(*(join(client, token(user), product_id) for user in users for _ in range(3)))
    assert {answer.status_code for answer in answers} == {200}
    bodies = [answer.json() for answer in answers]
    tickets: dict[str, set[str]] = {}
    admissions: dict[str, set[str]] = {}
    for user, body in zip((user for user in users for _ in range(3)), bodies, strict=True):
        tickets.setdefault(user, set()).add(body["ticket"])
        admissions.setdefault(user, set()).add(body["admission_token"] or "")
    assert all(len(held) == 1 for held in tickets.values())
    # Nobody admitted twice at once: a buyer's three answers carry one admission at most.
    assert all(len(held - {""}) <= 1 for held in admissions.values())
    assert len({next(iter(held)) for held in tickets.values()}) == crowd

    bound = math.ceil(stock * settings.waiting_room.admit_factor)
    await as_told(settings)
    final = [(await poll(client, token(user), product_id)).json() for user in users]
    states = Counter(body["state"] for body in final)
    assert states == {"admitted": bound, "waiting": crowd - bound}
    waiting = sorted((body for body in final if body["state"] == "waiting"), key=lambda body: body["position"])
    assert [body["position"] for body in waiting] == list(range(bound + 1, crowd + 1))
    assert [body["ahead"] for body in waiting] == list(range(crowd - bound))
    admitted = [body for body in final if body["state"] == "admitted"]
    assert len({body["admission_token"] for body in admitted}) == bound
    assert sorted(body["position"] for body in admitted) == list(range(1, bound + 1))
    assert all(body["units_left"] == stock for body in final)
    again = await join(client, token(users[-1]), product_id)
    assert (again.json()["ticket"], again.json()["position"]) == (waiting[-1]["ticket"], crowd)
    assert again.headers["Retry-After"] == str(math.ceil(again.json()["poll_after_ms"] / 1000))


async def test_a_look_by_a_buyer_without_a_place_is_404(client, put_product, product_id, token):
    await put_product(product_id, stock=3, waiting_room=True)
    answer = await poll(client, token("wr-nobody"), product_id)
    assert (answer.status_code, answer.json()["code"]) == (404, "not_in_queue")
    missing = await join(client, token("wr-nobody"), product_id + 100_000)
    assert (missing.status_code, missing.json()["code"]) == (404, "product_not_found")
