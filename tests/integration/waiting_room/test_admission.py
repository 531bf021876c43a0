"""The purchase on a waiting-room product: the admission is checked and consumed in the reserve
call, the room admits by the stock left, tells everyone sold_out when it is gone, and reopens for
units that come back (docs/ARCHITECTURE.md, "Waiting room")."""

from __future__ import annotations

import asyncio
import math
from collections import Counter

from service.model.waiting_room import RoomPace
from tests.integration.waiting_room.test_join import QUEUE, as_told, join, lapse, poll
from tests.support import eventually, redis_state, rows_at_least


async def purchase(client, headers, product_id: int, admission: str | None, key: str | None = None, quantity=1):
    if admission is not None:
        headers = {**headers, "Admission-Token": admission}
    if key is not None:
        headers = {**headers, "Idempotency-Key": key}
    return await client.post("/api/v1/orders", json={"product_id": product_id, "quantity": quantity}, headers=headers)


async def test_a_purchase_without_a_valid_admission_is_428_with_the_queue_and_leaves_no_trace(
    client, put_product, product_id, token, redis, settings, store
):
    await put_product(product_id, stock=5, limit=2, waiting_room=True)
    mine, other = token("wr-buyer"), token("wr-other")
    admitted = (await join(client, mine, product_id)).json()
    someone_elses = (await join(client, other, product_id)).json()["admission_token"]
    assert admitted["state"] == "admitted" and someone_elses
    before = await redis_state(redis, settings, product_id)
    for admission in (None, "never-given", "x" * 65, someone_elses):
        answer = await purchase(client, mine, product_id, admission)
        assert answer.status_code == 428, answer.text
        body = answer.json()
        assert (body["code"], body["queue"]) == ("admission_required", QUEUE.format(product_id))
    # Expired: what the admission's expiry does later, now.
    keys = store.product_keys(product_id)
    await redis.zadd(keys.room_admitted, {"wr-buyer": 1})
    answer = await purchase(client, mine, product_id, admitted["admission_token"])
    assert (answer.status_code, answer.json()["code"]) == (428, "admission_required")
    assert await redis_state(redis, settings, product_id) == before


async def test_an_admission_buys_once_and_a_replay_answers_the_first_result(client, put_product, product_id, token):
    await put_product(product_id, stock=5, limit=2, waiting_room=True)
    buyer = token("wr-once")
    admission = (await join(client, buyer, product_id)).json()["admission_token"]
    # Ten purchases with the same admission at once, each under its own key: one takes it.
    answers = await asyncio.gather(*(purchase(client, buyer, product_id, admission, f"k{i}") for i in range(10)))
    codes = Counter(answer.status_code for answer in answers)
    assert codes == {202: 1, 428: 9}, [answer.text for answer in answers]
    first = next(answer for answer in answers if answer.status_code == 202)
    key = next(f"k{i}" for i, answer in enumerate(answers) if answer.status_code == 202)
    replay = await purchase(client, buyer, product_id, admission, key)
    assert (replay.status_code, replay.json()) == (202, first.json())
    # Without an Idempotency-Key the admission is the key: a retry answers the same order.
    second = (await join(client, buyer, product_id)).json()
    assert second["state"] == "admitted" and second["admission_token"] != admission
    keyless = await purchase(client, buyer, product_id, second["admission_token"])
    again = await purchase(client, buyer, product_id, second["admission_token"])
    assert (keyless.status_code, again.status_code) == (202, 202)
    assert keyless.json()["order_no"] == again.json()["order_no"] != first.json()["order_no"]
    gone = await poll(client, buyer, product_id)
    assert (gone.status_code, gone.json()["code"]) == (404, "not_in_queue")


async def test_a_stampede_sells_exactly_the_stock_each_purchase_admitted_and_everyone_else_hears_sold_out(
    client, put_product, product_id, token, settings, store
):
    stock, crowd = 30, 400
    await put_product(product_id, stock=stock, limit=1, waiting_room=True)
    users = [f"wr-stampede-{i}" for i in range(crowd)]
    headers = {user: token(user) for user in users}
    # Buyers with no admission push at the purchase route at the same time: none gets in.
    pushed = await asyncio.gather(*(purchase(client, headers[user], product_id, None) for user in users))
    assert Counter(answer.status_code for answer in pushed) == {428: crowd}

    await asyncio.gather(*(join(client, headers[user], product_id) for user in users))
    accepted: dict[str, str] = {}
    for _ in range(50):  # rounds of: everyone not served polls (as told), the admitted buy at once
        await as_told(settings)
        remaining = [user for user in users if user not in accepted]
        bodies = [
            answer.json() for answer in await asyncio.gather(*(poll(client, headers[u], product_id) for u in remaining))
        ]
        if all(body["state"] == "sold_out" for body in bodies):
            break
        admitted = {
            user: body["admission_token"]
            for user, body in zip(remaining, bodies, strict=True)
            if body["state"] == "admitted"
        }
        bought = await asyncio.gather(*(purchase(client, headers[u], product_id, t) for u, t in admitted.items()))
        for user, answer in zip(admitted, bought, strict=True):
            if answer.status_code == 202:
                accepted[user] = answer.json()["order_no"]
            else:
                assert (answer.status_code, answer.json()["code"]) == (409, "sold_out"), answer.text
    assert len(accepted) == stock and len(set(accepted.values())) == stock
    final = await asyncio.gather(*(poll(client, headers[user], product_id) for user in users if user not in accepted))
    assert Counter(answer.json()["state"] for answer in final) == {"sold_out": crowd - stock}
    counters = await store.rooms.counters(product_id)
    assert counters["used"] == stock


async def test_admission_never_exceeds_the_bound_of_the_units_left_at_any_call(
    client, put_product, product_id, token, settings, store
):
    """Every reply of the script says, at one instant, how many were admitted in that call and
    how many hold an admission after it: no call admits past ceil(units left x factor)."""
    stock, crowd = 12, 300
    factor = settings.waiting_room.admit_factor
    await put_product(product_id, stock=stock, limit=1, waiting_room=True)

    async def visit(user: str, join_it: bool):
        return await store.rooms.visit(product_id, user, join=join_it, pace=RoomPace(factor, 60_000, 1000, 5000, 20, 0))

    visits = await asyncio.gather(*(visit(f"wr-bound-{i}", True) for i in range(crowd)))
    bound = math.ceil(stock * factor)
    assert sum(v.admitted for v in visits) == bound
    assert all(v.outstanding <= bound for v in visits)
    assert Counter(v.state.value for v in visits) == {"admitted": bound, "waiting": crowd - bound}
    tokens = [v.token for v in visits if v.token]
    assert len(set(tokens)) == bound


async def test_units_that_come_back_and_expired_admissions_reopen_admission_in_line_order(
    client, put_product, product_id, token, redis, store, settings
):
    await put_product(product_id, stock=2, limit=1, waiting_room=True)
    bound = math.ceil(2 * settings.waiting_room.admit_factor)
    users = [f"wr-back-{i}" for i in range(bound + 4)]
    for user in users:  # one by one: arrival order is line order
        await join(client, token(user), product_id)
    await as_told(settings)
    first = [(await poll(client, token(user), product_id)).json() for user in users]
    assert [body["state"] for body in first] == ["admitted"] * bound + ["waiting"] * 4
    for user, body in zip(users[:2], first, strict=False):
        assert (await purchase(client, token(user), product_id, body["admission_token"])).status_code == 202
    assert {(await poll(client, token(user), product_id)).json()["state"] for user in users[2:]} == {"sold_out"}

    # product set with one unit more: the next in line are admitted, in line order.
    await put_product(product_id, stock=3, limit=1, waiting_room=True)
    reopened = max(math.ceil(1 * settings.waiting_room.admit_factor), 1)  # users[2] still holds one
    await as_told(settings)
    states = [(await poll(client, token(user), product_id)).json()["state"] for user in users[2:]]
    assert states == ["admitted"] * reopened + ["waiting"] * (len(users) - 2 - reopened)
    # An admission that expires: its holder's place goes to the next in line.
    holder = users[2]
    await lapse(redis, store.product_keys(product_id), holder)
    await as_told(settings)
    states = [(await poll(client, token(user), product_id)).json()["state"] for user in users[3:]]
    assert states == ["admitted"] * reopened + ["waiting"] * (len(users) - 3 - reopened)
    gone = await poll(client, token(holder), product_id)
    assert (gone.status_code, gone.json()["code"]) == (404, "not_in_queue")
    assert (await store.rooms.counters(product_id))["expired"] == 1
    rejoined = (await join(client, token(holder), product_id)).json()
    # A new place at the back; the one left stays taken (no other buyer's place moves).
    assert (rejoined["state"], rejoined["position"]) == ("waiting", len(users) + 1)


async def test_a_sold_out_room_answers_from_the_processs_flag_without_redis(
    client, put_product, product_id, token, redis, store
):
    """Once Redis said sold_out, the process's flag answers every poll and join (as it answers the
    keyless purchases) until a restock announcement: proven by removing the sale from Redis, which
    would make the script answer "not loaded"."""
    await put_product(product_id, stock=1, limit=1, waiting_room=True)
    first = (await join(client, token("wr-flag-0"), product_id)).json()
    await join(client, token("wr-flag-1"), product_id)
    assert (await purchase(client, token("wr-flag-0"), product_id, first["admission_token"])).status_code == 202
    assert (await poll(client, token("wr-flag-1"), product_id)).json()["state"] == "sold_out"
    sale = store.product_keys(product_id).sale
    kept = await redis.hgetall(sale)
    await redis.delete(sale)
    try:
        answers = await asyncio.gather(
            *(join(client, token(f"wr-flag-{i}"), product_id) for i in range(1, 60)),
            poll(client, token("wr-flag-1"), product_id),
        )
        assert {(answer.status_code, answer.json()["state"], answer.json()["units_left"]) for answer in answers} == {
            (200, "sold_out", 0)
        }
    finally:
        await redis.hset(sale, mapping=kept)


async def test_a_cancelled_order_reopens_admission_for_the_next_in_line(
    client, put_product, product_id, token, engine, consumer, settings
):
    """Units back from a cancel (restock.lua) raise the bound: the next poll admits the next
    waiting buyer, who buys the unit; the sold-out flag the poll raised was dropped by the restock."""
    await put_product(product_id, stock=1, limit=1, waiting_room=True)
    first = (await join(client, token("wr-cancel-0"), product_id)).json()
    # The bound is ceil(1 x factor): the next one or two may be admitted too; the last waits.
    crowd = [f"wr-cancel-{i}" for i in range(1, 6)]
    for user in crowd:
        await join(client, token(user), product_id)
    bought = await purchase(client, token("wr-cancel-0"), product_id, first["admission_token"])
    assert bought.status_code == 202
    assert {(await poll(client, token(user), product_id)).json()["state"] for user in crowd} == {"sold_out"}
    await eventually(lambda: rows_at_least(engine, product_id, 1))

    cancelled = await client.post(f"/api/v1/orders/{bought.json()['order_no']}/cancel", headers=token("wr-cancel-0"))
    assert cancelled.status_code == 200, cancelled.text

    async def someone_admitted():
        # A poll before the buyer is due answers 429 (docs/ARCHITECTURE.md, waiting room): not yet.
        answers = [await poll(client, token(user), product_id) for user in crowd]
        tickets = [answer.json() if answer.status_code == 200 else {"state": "early"} for answer in answers]
        found = [(user, t) for user, t in zip(crowd, tickets, strict=True) if t["state"] == "admitted"]
        return found if len(found) >= bound else []

    # Before: ceil(factor) admitted, the one who bought among them. After: one more, in line order.
    bound = math.ceil(settings.waiting_room.admit_factor)
    admitted = await eventually(someone_admitted)
    assert [user for user, _ in admitted] == crowd[:bound]
    newest = admitted[-1][1]["admission_token"]
    again = await purchase(client, token(crowd[bound - 1]), product_id, newest)
    assert again.status_code == 202, again.text
