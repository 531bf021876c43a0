"""The per-user limit backed in MySQL (Redis alone may forget it): Redis forgetting a buyer's quota
(eviction, failover, FLUSHALL) never lets an order over the limit into MySQL; the extra order is a
final ``rejected``/``limit_exceeded`` row its buyer can read. On the real Redis, RabbitMQ,
MariaDB and consumer."""

from __future__ import annotations

import asyncio

from service.domain.fulfilment.order_writer import Outcome, write_orders
from tests.support import buy, eventually, inventory, message_for, order_rows, quota_rows, rows_are

LIMIT_EXCEEDED = (7, "limit_exceeded")


async def held_by_user(engine, product_id: int) -> dict[str, int]:
    """Units each user holds in MySQL's orders (every status but cancelled and rejected)."""
    held: dict[str, int] = {}
    for row in await order_rows(engine, product_id):
        if row.status not in (4, 7):
            held[row.user_id] = held.get(row.user_id, 0) + row.quantity
    return held


async def test_a_batch_with_two_orders_of_one_user_crossing_the_limit(engine, put_product, product_id):
    await put_product(product_id, stock=10, limit=2)
    batch = [
        message_for(product_id, "crosser", 900001),
        message_for(product_id, "other", 900002),
        message_for(product_id, "crosser", 900003),
        message_for(product_id, "crosser", 900004),  # the third unit: over the limit of 2
        message_for(product_id, "late", 900005, quantity=2),
    ]
    outcomes = await write_orders(engine, batch)
    assert outcomes == [Outcome.APPLIED, Outcome.APPLIED, Outcome.APPLIED, Outcome.REJECTED, Outcome.APPLIED]
    rows = {row.order_no: row for row in await order_rows(engine, product_id)}
    assert (rows[batch[3].order_no].status, rows[batch[3].order_no].reason) == LIMIT_EXCEEDED
    assert await inventory(engine, product_id) == (5, 5)  # the refused unit was not taken
    assert await quota_rows(engine, product_id) == {"crosser": 2, "other": 1, "late": 2}
    assert await held_by_user(engine, product_id) == {"crosser": 2, "other": 1, "late": 2}

    # A later batch meets the count the first one left in MySQL.
    again = [message_for(product_id, "crosser", 900006), message_for(product_id, "other", 900007)]
    assert await write_orders(engine, again) == [Outcome.REJECTED, Outcome.APPLIED]
    assert await inventory(engine, product_id) == (4, 6)
    assert await quota_rows(engine, product_id) == {"crosser": 2, "other": 2, "late": 2}


async def test_an_order_refused_for_the_limit_leaves_its_units_to_the_orders_behind_it(engine, put_product, product_id):
    await put_product(product_id, stock=2, limit=1)
    batch = [
        message_for(product_id, "first", 900011),
        message_for(product_id, "first", 900012),  # over the limit: must not take the last unit
        message_for(product_id, "second", 900013),
        message_for(product_id, "third", 900014),  # no unit left
    ]
    outcomes = await write_orders(engine, batch)
    assert outcomes == [Outcome.APPLIED, Outcome.REJECTED, Outcome.APPLIED, Outcome.REJECTED]
    rows = {row.order_no: (row.status, row.reason) for row in await order_rows(engine, product_id)}
    assert [rows[order.order_no] for order in batch] == [(0, None), LIMIT_EXCEEDED, (0, None), (7, "sold_out")]
    assert await inventory(engine, product_id) == (0, 2)
    assert await quota_rows(engine, product_id) == {"first": 1, "second": 1, "third": 0}


async def test_buyers_whose_redis_quota_is_deleted_mid_sale_never_end_over_the_limit(
    client, token, admin, put_product, product_id, engine, redis, store, consumer
):
    users = [f"q{i}" for i in range(12)]
    limit = 2
    await put_product(product_id, stock=100, limit=limit)

    async def buy_each(count: int) -> list:
        answers = await asyncio.gather(*(buy(client, token(u), product_id) for u in users for _ in range(count)))
        assert {answer.status_code for answer in answers} == {202}, [a.text for a in answers if a.status_code != 202]
        return answers

    first = await buy_each(limit)  # everyone at the limit
    await eventually(lambda: rows_are(engine, product_id, len(first)))
    refused = await buy(client, token(users[0]), product_id)
    assert (refused.status_code, refused.json()["code"]) == (409, "limit_exceeded")  # Redis still knows

    keys = store.product_keys(product_id)
    assert await redis.delete(keys.quota) == 1  # Redis loses every buyer's quota mid-sale
    extra = await buy_each(1)  # Redis lets each buyer through once more: 202
    await eventually(lambda: rows_are(engine, product_id, len(first) + len(extra)))

    rows = {row.order_no: row for row in await order_rows(engine, product_id)}
    assert all((rows[a.json()["order_no"]].status, rows[a.json()["order_no"]].reason) == LIMIT_EXCEEDED for a in extra)
    assert await held_by_user(engine, product_id) == dict.fromkeys(users, limit)
    assert await inventory(engine, product_id) == (100 - limit * len(users), limit * len(users))
    assert consumer.counts.get("rejected") == len(users)

    # The buyer reads the final outcome of the order the 202 named.
    answer = extra[0].json()
    seen = await client.get(f"/api/v1/orders/{answer['order_no']}", headers=token(users[0]))
    assert seen.status_code == 200
    assert (seen.json()["status"], seen.json()["reason"]) == ("rejected", "limit_exceeded")

    # The refused orders' reservations are given back as for every rejection (realignment):
    # Redis stock and quotas come back from MySQL.
    realigned = await client.post(f"/api/v1/admin/realign?product_id={product_id}", headers=admin)
    assert realigned.status_code == 200, realigned.text
    assert await store.stock.units(product_id) == 100 - limit * len(users)
    assert await store.stock.quota(product_id) == dict.fromkeys(users, limit)


async def test_a_cancel_gives_the_mysql_count_back_and_the_buyer_may_buy_again(
    client, token, put_product, product_id, engine, consumer
):
    await put_product(product_id, stock=10, limit=1)
    first = await buy(client, token("changes-mind"), product_id)
    assert first.status_code == 202
    await eventually(lambda: rows_are(engine, product_id, 1))
    assert await quota_rows(engine, product_id) == {"changes-mind": 1}
    cancelled = await client.post(f"/api/v1/orders/{first.json()['order_no']}/cancel", headers=token("changes-mind"))
    assert cancelled.status_code == 200, cancelled.text
    assert await quota_rows(engine, product_id) == {"changes-mind": 0}

    again = await buy(client, token("changes-mind"), product_id)
    assert again.status_code == 202
    await eventually(lambda: rows_are(engine, product_id, 2))
    statuses = {row.order_no: (row.status, row.reason) for row in await order_rows(engine, product_id)}
    assert statuses[again.json()["order_no"]] == (0, None)
    assert await quota_rows(engine, product_id) == {"changes-mind": 1}


async def test_database_mode_counts_in_the_same_table(client, token, put_product, product_id, engine):
    await put_product(product_id, stock=10, limit=2, stock_mode="database")
    assert (await buy(client, token("db-buyer"), product_id, quantity=2)).status_code == 201
    refused = await buy(client, token("db-buyer"), product_id)
    assert (refused.status_code, refused.json()["code"]) == (409, "limit_exceeded")
    assert await quota_rows(engine, product_id) == {"db-buyer": 2}  # the refusal rolled its count back

    # A consumer-written order of the same user meets the count the database mode wrote.
    assert await write_orders(engine, [message_for(product_id, "db-buyer", 900021)]) == [Outcome.REJECTED]
    assert await inventory(engine, product_id) == (8, 2)


async def test_users_whose_ids_differ_only_in_case_count_apart(engine, put_product, product_id):
    # The quota rows are read back joined from the batch's rows: in the tables' binary collation.
    await put_product(product_id, stock=10, limit=1)
    batch = [
        message_for(product_id, "Buyer", 900031),
        message_for(product_id, "buyer", 900032),
        message_for(product_id, "BUYER", 900033),
        message_for(product_id, "buyer", 900034),  # buyer's second unit: over the limit of 1
    ]
    outcomes = await write_orders(engine, batch)
    assert outcomes == [Outcome.APPLIED, Outcome.APPLIED, Outcome.APPLIED, Outcome.REJECTED]
    assert await quota_rows(engine, product_id) == {"Buyer": 1, "buyer": 1, "BUYER": 1}
    assert await inventory(engine, product_id) == (7, 3)
