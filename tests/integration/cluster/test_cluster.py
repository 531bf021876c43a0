"""Every path of the service on a real three-master Redis Cluster (``FLASHSALE_REDIS__CLUSTER``):
purchases of products spread over all masters under real concurrency, replays, the order and
product views, the consumer's claim, realignment of every product, cancel/pay/sweep, order-number
minting over several shards and seconds, readiness, and the test isolation's teardown."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx
import pytest
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError

from db.models import OrderStatus as S
from service import metrics
from service.adapters.redis.client import _Tuned
from service.adapters.redis.eviction import EvictionPolicy
from service.adapters.redis.stores import RedisStores, make_stores
from service.api.tokens import issue_token
from service.domain.order_numbers.format import REDIS_SHARDS
from service.domain.order_numbers.minter import OrderNumberMinter, ShardGenerations, ShardLease
from service.domain.orders.lifecycle import expire_unpaid
from service.domain.stock.realign import Realigner
from service.domain.stock.recovery import Recovery
from service.failures import StoreUnavailable
from service.model.stock import ReserveRequest
from service.settings import Settings
from service.startup import DependencyUnreachable, check_dependencies
from tests.integration.waiting_room.test_room_metrics import _samples
from tests.support import buy, eventually, flashsale_process, inventory, notify, order_rows, status_of
from toolkit.sale.isolation import environment, free_port, isolated_settings
from toolkit.sale.stores import tear_down

_next_id = iter(range(5000, 100_000))


def _headers(settings: Settings, user: str, admin: bool = False) -> dict[str, str]:
    return {"Authorization": f"Bearer {issue_token(settings.auth.jwt_secret, user, admin)}"}


async def _one_product_per_master(redis: RedisCluster, store: RedisStores) -> list[int]:
    """Fresh product ids whose slots lie on three different masters."""
    await redis.initialize()
    chosen: dict[str, int] = {}
    while len(chosen) < len(redis.get_primaries()):
        product_id = next(_next_id)
        node = redis.get_node_from_key(store.product_keys(product_id).stock)
        chosen.setdefault(node.name, product_id)
    return sorted(chosen.values())


async def _put(client, settings: Settings, product_id: int, stock: int, limit: int = 1, **fields: object) -> None:
    body = {"stock": stock, "per_user_limit": limit, "price": 1500, "stock_mode": "redis", **fields}
    response = await client.put(
        f"/api/v1/admin/products/{product_id}", json=body, headers=_headers(settings, "admin", admin=True)
    )
    assert response.status_code == 200, response.text


async def test_300_concurrent_buyers_over_three_masters_get_exactly_the_stock(
    cluster_client, cluster_settings, cluster_redis, cluster_store, cluster_engine, cluster_consumer
):
    products = await _one_product_per_master(cluster_redis, cluster_store)
    for product_id in products:
        await _put(cluster_client, cluster_settings, product_id, stock=40)

    buyers = [(product_id, f"b{product_id}-{i}") for product_id in products for i in range(100)]
    responses = await asyncio.gather(
        *(buy(cluster_client, _headers(cluster_settings, user), pid) for pid, user in buyers)
    )

    per_product = Counter((pid, r.status_code) for (pid, _), r in zip(buyers, responses, strict=True))
    for product_id in products:
        assert per_product[(product_id, 202)] == 40 and per_product[(product_id, 409)] == 60
    assert {r.json()["code"] for r in responses if r.status_code == 409} == {"sold_out"}
    accepted = [r.json()["order_no"] for r in responses if r.status_code == 202]
    assert len(set(accepted)) == 120

    for product_id in products:
        rows = await eventually(lambda pid=product_id: _rows_when(cluster_engine, pid, 40))
        assert len(rows) == 40
        assert await inventory(cluster_engine, product_id) == (0, 40)
        assert await cluster_store.stock.units(product_id) == 0

    reports = await Realigner(cluster_engine, cluster_store, grace_seconds=0).realign_all()
    mine = [r for r in reports if r.product_id in products]
    assert [(r.mysql_stock, r.redis_stock_after, r.in_flight, r.drift) for r in mine] == [(0, 0, 0, 0)] * 3


async def test_a_hot_product_split_over_three_buckets_on_three_masters_sells_exactly_the_stock(
    cluster_client, cluster_settings, cluster_redis, cluster_store, cluster_engine, cluster_consumer
):
    await cluster_redis.initialize()
    product_id = next(_next_id)
    while len({cluster_redis.get_node_from_key(_bucket_key(cluster_store, product_id, b)).name for b in range(3)}) < 3:
        product_id = next(_next_id)
    body = {"stock": 60, "per_user_limit": 1, "price": 1500, "stock_mode": "redis", "buckets": 3}
    admin = _headers(cluster_settings, "admin", admin=True)
    assert (await cluster_client.put(f"/api/v1/admin/products/{product_id}", json=body, headers=admin)).is_success

    buyers = [f"hot{product_id}-{i}" for i in range(300)]
    responses = await asyncio.gather(*(buy(cluster_client, _headers(cluster_settings, u), product_id) for u in buyers))
    accepted = sum(1 for r in responses if r.status_code == 202)
    late = iter(f"late{product_id}-{i}" for i in range(1000))
    while accepted < 60:  # units a 503 ("rebalanced, retry") left in other buckets
        answers = await asyncio.gather(
            *(buy(cluster_client, _headers(cluster_settings, next(late)), product_id) for _ in range(6))
        )
        accepted += sum(1 for r in answers if r.status_code == 202)
        if all(r.status_code == 409 for r in answers):
            break

    assert accepted == 60
    rows = await eventually(lambda: _rows_when(cluster_engine, product_id, 60))
    assert Counter(row.status for row in rows) == {S.PENDING_PAYMENT: 60}
    assert await inventory(cluster_engine, product_id) == (0, 60)
    assert await cluster_store.stock.units(product_id, buckets=3) == 0


async def test_waiting_rooms_on_three_masters_admit_sell_exactly_the_stock_and_answer_sold_out(
    cluster_client, cluster_settings, cluster_redis, cluster_store
):
    """lua/queue.lua and the admission consumed in lua/reserve.lua, in each product's slot."""
    products = await _one_product_per_master(cluster_redis, cluster_store)
    for product_id in products:
        await _put(cluster_client, cluster_settings, product_id, stock=10, waiting_room=True)
    buyers = [(product_id, f"wr{product_id}-{i}") for product_id in products for i in range(60)]
    room = "/api/v1/products/{}/queue"

    async def visit(pid: int, user: str, join: bool) -> dict:
        headers = _headers(cluster_settings, user)
        if join:
            return (await cluster_client.post(room.format(pid), headers=headers)).json()
        return (await cluster_client.get(room.format(pid) + "/me", headers=headers)).json()

    await asyncio.gather(*(visit(pid, user, True) for pid, user in buyers))
    sold: Counter[int] = Counter()
    for _ in range(20):
        await asyncio.sleep(cluster_settings.waiting_room.poll_max_ms / 1000)  # polls come when told
        tickets = await asyncio.gather(*(visit(pid, user, False) for pid, user in buyers))
        admitted = [
            (pid, user, ticket["admission_token"])
            for (pid, user), ticket in zip(buyers, tickets, strict=True)
            if ticket.get("state") == "admitted"
        ]
        if not admitted:
            break
        answers = await asyncio.gather(
            *(
                cluster_client.post(
                    "/api/v1/orders",
                    json={"product_id": pid, "quantity": 1},
                    headers={**_headers(cluster_settings, user), "Admission-Token": token},
                )
                for pid, user, token in admitted
            )
        )
        bought = {
            (pid, user) for (pid, user, _), answer in zip(admitted, answers, strict=True) if answer.status_code == 202
        }
        sold.update(pid for pid, _ in bought)
        buyers = [buyer for buyer in buyers if buyer not in bought]
    assert sold == dict.fromkeys(products, 10)
    tickets = await asyncio.gather(*(visit(pid, user, False) for pid, user in buyers))
    assert {ticket["state"] for ticket in tickets} == {"sold_out"} and len(tickets) == 3 * 50
    # The gauges equal Redis after the last purchase (its answer set them): nothing admitted or held.
    metrics.flush()
    text = (await cluster_client.get("/metrics")).text
    for product_id in products:
        counters = await cluster_store.rooms.counters(product_id)
        found = _samples(text, product_id)
        gauges = (found["flashsale_waiting_room_admissions_outstanding"], found["flashsale_waiting_room_units_held"])
        assert gauges == (counters["outstanding"], counters["held"]) == (0, 0)
    refused = await buy(cluster_client, _headers(cluster_settings, "wr-none"), products[0])
    assert (refused.status_code, refused.json()["code"]) == (409, "sold_out")


def _bucket_key(store: RedisStores, product_id: int, bucket: int) -> str:
    return store.product_keys(product_id, bucket).stock


async def test_replay_order_view_and_product_view_on_every_master(
    cluster_client, cluster_settings, cluster_redis, cluster_store, cluster_engine, cluster_consumer
):
    products = await _one_product_per_master(cluster_redis, cluster_store)
    for product_id in products:
        await _put(cluster_client, cluster_settings, product_id, stock=5, limit=2)
        headers = _headers(cluster_settings, f"replayer{product_id}")
        first = await buy(cluster_client, headers, product_id, key=f"k{product_id}")
        again = await buy(cluster_client, headers, product_id, key=f"k{product_id}")
        assert first.status_code == again.status_code == 202, first.text
        assert again.json()["order_no"] == first.json()["order_no"]
        order = await cluster_client.get(f"/api/v1/orders/{first.json()['order_no']}", headers=headers)
        assert order.status_code == 200, order.text
        product = await cluster_client.get(f"/api/v1/products/{product_id}")
        assert product.status_code == 200, product.text
        await eventually(lambda pid=product_id: _rows_when(cluster_engine, pid, 1))
        assert await inventory(cluster_engine, product_id) == (4, 1)


async def test_sold_out_flag_is_lowered_by_a_restock_announced_on_another_master(
    cluster_client, cluster_settings, cluster_redis, cluster_store, cluster_engine, cluster_consumer
):
    product_id = (await _one_product_per_master(cluster_redis, cluster_store))[-1]
    await _put(cluster_client, cluster_settings, product_id, stock=1)
    bought = await buy(cluster_client, _headers(cluster_settings, "first"), product_id)
    assert bought.status_code == 202
    assert (await buy(cluster_client, _headers(cluster_settings, "second"), product_id)).status_code == 409
    await eventually(lambda: _rows_when(cluster_engine, product_id, 1))
    order_no = bought.json()["order_no"]
    cancelled = await cluster_client.post(
        f"/api/v1/orders/{order_no}/cancel", headers=_headers(cluster_settings, "first")
    )
    assert cancelled.status_code == 200, cancelled.text

    async def third_buys() -> bool:
        return (await buy(cluster_client, _headers(cluster_settings, "third"), product_id)).status_code == 202

    await eventually(third_buys)


async def test_pay_cancel_and_sweep_on_the_cluster(
    cluster_client, cluster_settings, cluster_redis, cluster_store, cluster_engine, cluster_consumer
):
    products = await _one_product_per_master(cluster_redis, cluster_store)
    order_nos: list[tuple[int, str, str]] = []
    for product_id in products:
        await _put(cluster_client, cluster_settings, product_id, stock=3)
        for user in ("payer", "canceller", "sleeper"):
            response = await buy(cluster_client, _headers(cluster_settings, f"{user}{product_id}"), product_id)
            assert response.status_code == 202, response.text
            order_nos.append((product_id, user, response.json()["order_no"]))
        await eventually(lambda pid=product_id: _rows_when(cluster_engine, pid, 3))

    for product_id, user, order_no in order_nos:
        if user == "payer":
            paid = await notify(cluster_client, cluster_settings, order_no, txn=f"t{order_no}")
            assert paid.status_code == 200, paid.text
        elif user == "canceller":
            headers = _headers(cluster_settings, f"{user}{product_id}")
            cancelled = await cluster_client.post(f"/api/v1/orders/{order_no}/cancel", headers=headers)
            assert cancelled.status_code == 200, cancelled.text
    await asyncio.sleep(2.1)  # the window below is 1 s; created_at has one-second precision
    swept = [await expire_unpaid(cluster_engine, cluster_store, window_seconds=1, product_id=pid) for pid in products]
    assert swept == [1, 1, 1]
    expected = {"payer": S.PAID, "canceller": S.CANCELLED, "sleeper": S.CANCELLED}
    for _, user, order_no in order_nos:
        assert await status_of(cluster_engine, order_no) is expected[user]
    for product_id in products:
        assert await inventory(cluster_engine, product_id) == (2, 1)
        assert await cluster_store.stock.units(product_id) == 2


async def test_minting_over_several_shards_and_seconds_is_unique(cluster_settings, cluster_engine, cluster_store):
    leases = [ShardLease(cluster_store, 30) for _ in range(6)]
    minters = [
        OrderNumberMinter(
            cluster_store, lease, cluster_settings.orders.order_no_prefix, ShardGenerations(cluster_engine), block=7
        )
        for lease in leases
    ]
    try:
        for lease in leases:
            await lease.start()
        shards = {lease.shard for lease in leases}
        assert len(shards) == 6 and all(shard is not None and shard < REDIS_SHARDS for shard in shards)
        minted: list[str] = []
        for _ in range(3):  # three different seconds: the sequence keys move between slots each second
            minted += await asyncio.gather(*(minter.take() for minter in minters for _ in range(50)))
            await asyncio.sleep(1.05)
        assert len(minted) == len(set(minted)) == 900
    finally:
        for lease in leases:
            await lease.stop()


async def test_readiness_asks_every_master(cluster_client, cluster_redis):
    response = await cluster_client.get("/api/v1/health/ready")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["redis"] is True and body["redis_maxmemory_policy"] == "noeviction"

    last = cluster_redis.get_primaries()[-1]  # one master of the test's own cluster evicts: not ready
    await cluster_redis.config_set("maxmemory-policy", "allkeys-lru", target_nodes=last)
    try:
        assert await EvictionPolicy(cluster_redis).check(force=True) == "allkeys-lru"
    finally:
        await cluster_redis.config_set("maxmemory-policy", "noeviction", target_nodes=last)
    assert await EvictionPolicy(cluster_redis).check(force=True) == "noeviction"


async def test_tear_down_unlinks_keys_of_every_slot(cluster_settings, cluster_redis):
    settings = isolated_settings(cluster_settings, "tc_teardown_probe")  # its own database and queues
    keys = [f"tc_teardown_probe:{{p:{n}}}:stock" for n in range(50)]
    for key in keys:
        await cluster_redis.set(key, 1)
    assert len({cluster_redis.get_node_from_key(key).name for key in keys}) == 3
    await tear_down(settings)
    assert await cluster_redis.exists(*keys) == 0


async def _rows_when(engine, product_id: int, count: int):
    rows = await order_rows(engine, product_id)
    return rows if len(rows) >= count else None


async def test_every_node_connects_with_the_tuned_connection(cluster_redis):
    """Health check with one re-open and hiredis packing (``_Tuned`` in service/adapters/redis/client.py) on
    every node the cluster client discovered, not only the one it started from."""
    await cluster_redis.ping(target_nodes=RedisCluster.ALL_NODES)
    nodes = cluster_redis.get_nodes()
    assert len(nodes) == 3
    assert all(issubclass(node.connection_class, _Tuned) for node in nodes)
    assert all(isinstance(connection, _Tuned) for node in nodes for connection in node._connections)


async def test_an_unreachable_cluster_is_a_redis_connection_error_naming_the_url(settings):
    """redis-py raises RedisClusterException (no RedisError) when no node answers: the start-up
    check must still say which variable and where, and the purchase path must see Redis unavailable
    (a Redis ConnectionError, translated at the adapter's boundary)."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    nowhere = settings.model_copy(update={"redis": settings.redis.model_copy(update={"url": url, "cluster": True})})
    with pytest.raises(DependencyUnreachable, match="FLASHSALE_REDIS__URL: cannot reach Redis at 127.0.0.1"):
        await check_dependencies(nowhere, amqp=False, mysql=False)
    store = make_stores(nowhere)
    try:
        with pytest.raises(StoreUnavailable) as raised:
            await store.reservations.reserve(ReserveRequest(1, "r", "u", 1, "FS0", "a"))
        assert isinstance(raised.value.__cause__, RedisConnectionError)
    finally:
        await store.aclose()


def _cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    flashsale = str(Path(sys.executable).with_name("flashsale"))
    env = {**os.environ, **environment(settings)}
    return subprocess.run([flashsale, *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
async def test_the_commands_run_on_the_cluster(cluster_settings, cluster_redis, cluster_store, cluster_engine):
    """``serve --workers 2`` (two shards, recovery on), ``consume``, ``product set`` of products on
    every master, ``realign``, ``sweep`` and ``dlq list`` as processes on the cluster."""
    settings = cluster_settings.model_copy(
        update={"realign": cluster_settings.realign.model_copy(update={"auto_seconds": 1.0})}
    )
    products = await _one_product_per_master(cluster_redis, cluster_store)
    for product_id in products:
        done = await asyncio.to_thread(
            _cli, settings, "product", "set", str(product_id), "--stock", "7", "--stock-mode", "redis", "--json"
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert await cluster_store.stock.units(product_id) == 7
    port = free_port()
    async with (
        flashsale_process(settings, f"http://127.0.0.1:{port}/api/v1/health/ready", "serve", "--port", str(port),
                          "--workers", "2"),
        flashsale_process(settings, f"http://127.0.0.1:{port}/api/v1/health/ready", "consume"),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http,
    ):  # fmt: skip
        ready = (await http.get("/api/v1/health/ready")).json()
        assert ready["ready"] is True  # two shards for the workers (and one for the in-process API of other tests)
        assert ready["shards_leased"] >= 2 and ready["shards_free"] == REDIS_SHARDS - ready["shards_leased"]
        for product_id in products:
            responses = await asyncio.gather(
                *(buy(http, _headers(settings, f"cli{product_id}-{i}"), product_id) for i in range(20))
            )
            assert Counter(r.status_code for r in responses) == {202: 7, 409: 13}
        for product_id in products:
            await eventually(lambda pid=product_id: _rows_when(cluster_engine, pid, 7))
    for args in (("realign", "--json"), ("sweep", "--json"), ("dlq", "list", "--json")):
        done = await asyncio.to_thread(_cli, settings, *args)
        assert done.returncode == 0, (args, done.stderr[-2000:])
    for product_id in products:
        assert await inventory(cluster_engine, product_id) == (0, 7)
        assert await cluster_store.stock.units(product_id) == 0


@pytest.mark.slow
def test_a_small_sale_on_the_cluster_holds_every_invariant(cluster_url):
    """``flashsale sale --redis-cluster URL --buckets 3`` (payments, sweep and resale included)."""
    flashsale = str(Path(sys.executable).with_name("flashsale"))
    small = ["--stock", "30", "--requests", "400", "--users", "150", "--concurrency", "32", "--noop-requests", "0"]
    result = subprocess.run(
        [flashsale, "sale", "--json", "--redis-cluster", cluster_url, "--buckets", "3", *small, "--pay-share", "0.5"]
        + ["--payment-window", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "FLASHSALE_DB__POOL_SIZE": "4", "FLASHSALE_DB__MAX_OVERFLOW": "4"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["ok"] is True and len(report["invariants"]) == 9
    assert all(check["ok"] for check in report["invariants"].values())


async def test_recovery_reloads_products_redis_lost_on_every_master_under_its_lock(
    cluster_client, cluster_settings, cluster_redis, cluster_store, cluster_engine
):
    """The API's self-healing pass (service/domain/stock/recovery.py): its lock is one key, then one
    product at a time; a second process's pass loses the lock meanwhile."""
    products = await _one_product_per_master(cluster_redis, cluster_store)
    for product_id in products:
        await _put(cluster_client, cluster_settings, product_id, stock=9)
        keys = cluster_store.product_keys(product_id)
        await cluster_redis.unlink(keys.stock, keys.sale, keys.units)  # one slot per product: as Redis lost them
        assert await cluster_store.stock.units(product_id) is None
    realigner = Realigner(cluster_engine, cluster_store, grace_seconds=60)
    first, second = Recovery(realigner, cluster_store, 60), Recovery(realigner, cluster_store, 60)
    for product_id in products:
        first.not_loaded(product_id)
    assert await cluster_store.leases.lock("recovery").acquire("another-process", 10_000)
    assert await first.run_once() is False  # the lock is held elsewhere
    assert await cluster_store.leases.lock("recovery").release("another-process")
    assert await first.run_once() is True
    assert first.repairing == set()
    assert [await cluster_store.stock.units(product_id) for product_id in products] == [9, 9, 9]
    assert await second.run_once() is True  # the lock was given back


async def test_a_master_that_lost_its_scripts_gets_them_back(
    cluster_client, cluster_settings, cluster_redis, cluster_store
):
    """SCRIPT FLUSH on one master of the test's own cluster: the reserve on that master loads its
    script again (NOSCRIPT), and readiness loads every script there."""
    products = await _one_product_per_master(cluster_redis, cluster_store)
    for product_id in products:
        await _put(cluster_client, cluster_settings, product_id, stock=5)
    node = cluster_redis.get_node_from_key(cluster_store.product_keys(products[0]).stock)
    await cluster_redis.execute_command("SCRIPT FLUSH", target_nodes=node)
    response = await buy(cluster_client, _headers(cluster_settings, "after-flush"), products[0])
    assert response.status_code == 202, response.text
    await cluster_redis.execute_command("SCRIPT FLUSH", target_nodes=node)
    assert (await cluster_client.get("/api/v1/health/ready")).status_code == 200
    shas = cluster_store.scripts.shas
    assert all(await cluster_redis.execute_command("SCRIPT EXISTS", *shas, target_nodes=node))
