"""Every metric family a clean sale leaves at zero, driven non-zero by a real fault and read back
from a real ``/metrics`` endpoint in the Prometheus text format (parsed by prometheus_client's
own parser): publish failures and releases on the API (the order queue deleted: every publish
comes back unroutable), a poison message dead-lettered and the dead-letter depth on a consumer's
port, a stranded reservation re-published with its drift and units in flight on
``realign --watch``'s port, an unpaid order swept on ``sweep --watch``'s port, and transaction
retries behind a held row lock (consumer and database-mode purchase) on the API's ``/metrics``.

Counted where the event happens (adapter or use case), so the processes count them whichever
entry point ran them: the subprocesses here start from zero, and the in-process checks compare
before and after."""

from __future__ import annotations

import asyncio
import os

import aio_pika
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.adapters.redis.reservations import new_attempt
from service.domain.order_numbers.format import compose_order_no
from service.domain.purchase.database_transaction import DatabasePurchase, buy_in_database
from service.domain.purchase.request_id import mint_request_id
from service.model.order_message import encode_order
from service.model.stock import ReserveRequest
from tests.support import (
    behind_a_row_lock,
    buy,
    eventually,
    flashsale_process,
    message_for,
    own_queues,
    publish_raw,
    rows_at_least,
    running_consumer,
    start_flashsale,
)
from toolkit.sale.isolation import environment, free_port

pytestmark = pytest.mark.slow


def _samples(exposition: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a Prometheus text exposition: (name, labels) -> value."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }


def _get(samples: dict, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 when there is none)."""
    wanted = set(labels.items())
    return sum(value for (sample, have), value in samples.items() if sample == name and wanted <= have)


async def _scrape(url: str) -> dict | None:
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
            response = await http.get(url)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    assert response.headers["content-type"].startswith("text/plain")
    return _samples(response.text)


async def _until(url: str, check) -> dict:
    """Scrape ``url`` until ``check(samples)`` holds (processes flush once a second, the consumer
    samples queue depths every 5 s)."""

    async def scraped():
        samples = await _scrape(url)
        return samples if samples is not None and check(samples) else None

    return await eventually(scraped, timeout=30, interval=0.25)


async def _consumed(connection: aio_pika.abc.AbstractConnection, queue: str) -> bool:
    """True once ``queue`` exists and has a consumer."""
    try:
        async with connection.channel() as channel:
            declared = await channel.declare_queue(queue, passive=True)
    except aio_pika.exceptions.ChannelClosed:
        return False
    return declared.declaration_result.consumer_count >= 1


async def test_publish_failures_releases_and_release_latency_on_the_api_of_flashsale_serve(
    settings, put_product, product_id, token, tmp_path
):
    """``flashsale serve`` (granian, multiprocess metrics) whose order queue is gone: every
    publish comes back unroutable, the reservation is released, the buyer gets ``503``."""
    await put_product(product_id, stock=5, limit=1)
    async with own_queues(settings, "unroutable") as mine:
        directory = tmp_path / "prometheus"
        directory.mkdir()
        env = {**os.environ, **environment(mine), "PROMETHEUS_MULTIPROC_DIR": str(directory)}
        port = free_port()
        api = f"http://127.0.0.1:{port}"
        server = start_flashsale(["serve", "--port", str(port), "--workers", "1"], env)
        try:

            async def ready() -> bool:
                try:
                    async with httpx.AsyncClient(trust_env=False) as http:
                        return (await http.get(f"{api}/api/v1/health/ready")).status_code == 200
                except httpx.HTTPError:
                    return False

            await eventually(ready, timeout=60, interval=0.25)
            connection = await aio_pika.connect(mine.amqp.url)
            try:
                await (await connection.channel()).queue_delete(mine.amqp.queue)
            finally:
                await connection.close()
            async with httpx.AsyncClient(base_url=api, trust_env=False, timeout=30) as http:
                answers = [await buy(http, token(f"pf{i}"), product_id) for i in range(3)]
            assert [(a.status_code, a.json()["code"]) for a in answers] == [(503, "unavailable")] * 3

            def counted(s: dict) -> bool:
                return _get(s, "flashsale_publish_failures_total") == 3

            samples = await _until(f"{api}/metrics", counted)
        finally:
            server.terminate()
            await asyncio.to_thread(server.wait, 30)
    assert _get(samples, "flashsale_reservation_releases_total", outcome="released") == 3
    assert _get(samples, "flashsale_redis_script_duration_seconds_count", script="release") == 3
    assert _get(samples, "flashsale_purchase_outcomes_total", code="unavailable") == 3


async def test_a_poison_message_is_dead_lettered_and_the_dead_letter_depth_shows_on_the_consumer_port(settings):
    async with own_queues(settings, "poison") as mine:
        port = free_port()
        url = f"http://127.0.0.1:{port}/metrics"
        async with flashsale_process(mine, url, "consume", "--metrics-port", str(port)):
            connection = await aio_pika.connect(mine.amqp.url)
            try:
                # /metrics answers before the consumer has bound its queue: a message published
                # earlier is unroutable and gone
                await eventually(lambda: _consumed(connection, mine.amqp.partition_queue(0)), interval=0.1)
                await publish_raw(await connection.channel(), mine, b"{not an order", message_id="poison")
            finally:
                await connection.close()

            def dead(s: dict) -> bool:  # both reach the exposition within a few seconds, apart
                depth = _get(s, "flashsale_queue_depth_messages", queue="dead_letter")
                return depth >= 1 and _get(s, "flashsale_consumer_messages_total", outcome="dead_lettered") >= 1

            samples = await _until(url, dead)
    assert _get(samples, "flashsale_consumer_messages_total", outcome="dead_lettered") == 1
    assert _get(samples, "flashsale_queue_depth_messages", queue="dead_letter") == 1


async def test_a_stranded_reservation_is_republished_and_drift_and_units_in_flight_show_on_realign_port(
    settings, put_product, product_id, store, redis
):
    """A reservation whose message never left the API (reserved, never published) and a Redis
    stock pushed 7 units off: one ``realign --watch`` pass re-publishes the reservation and
    reports the drift and the unit in flight."""
    await put_product(product_id, stock=10, limit=1)
    order_no = compose_order_no("FS", "20261130000004", 99, product_id % 1_000_000)
    reserved = await store.reservations.reserve(
        ReserveRequest(product_id, mint_request_id(), "stranded", 1, order_no, new_attempt())
    )
    assert reserved.outcome == "reserved"
    await redis.set(store.product_keys(product_id).stock, 9 + 7)
    await asyncio.sleep(0.01)  # older than a grace period of 0
    async with own_queues(settings, "republish") as mine:
        quick = mine.model_copy(update={"realign": mine.realign.model_copy(update={"grace_seconds": 0.0})})
        port = free_port()
        url = f"http://127.0.0.1:{port}/metrics"
        argv = ["realign", "--product", str(product_id), "--watch", "60", "--metrics-port", str(port)]
        async with flashsale_process(quick, url, *argv):
            label = str(product_id)
            samples = await _until(url, lambda s: _get(s, "flashsale_realign_republished_total", product_id=label) >= 1)
    assert _get(samples, "flashsale_realign_republished_total", product_id=label) == 1
    assert _get(samples, "flashsale_realign_drift_units", product_id=label) == 7
    assert _get(samples, "flashsale_realign_in_flight_units", product_id=label) == 1


async def test_an_unpaid_order_swept_counts_on_the_sweep_port(settings, put_product, product_id, token, client):
    await put_product(product_id, stock=3, limit=1, stock_mode="database")
    bought = await buy(client, token("sleepy"), product_id)
    assert bought.status_code == 201, bought.text
    # past a payment window of 1 s: created_at and NOW() are whole seconds and the sweep wants
    # created_at < NOW() - 1, so an order is due 2 s after its second began (a sweep that started
    # within 0.8 s after a 1.2 s wait found nothing, and its next pass was 60 s away)
    await asyncio.sleep(2.1)
    short = settings.model_copy(update={"payment": settings.payment.model_copy(update={"window_seconds": 1})})
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    argv = ["sweep", "--product", str(product_id), "--watch", "60", "--metrics-port", str(port)]
    async with flashsale_process(short, url, *argv):
        samples = await _until(url, lambda s: _get(s, "flashsale_sweep_cancelled_total") >= 1)
    assert _get(samples, "flashsale_sweep_cancelled_total") == 1


async def test_transaction_retries_behind_a_held_row_lock_show_on_the_api_metrics(
    settings, client, put_product, new_product_id, engine, store
):
    """The consumer's batch and a database-mode purchase, each behind another transaction's
    lock on the product's inventory row: lock wait timeouts (1205), retried, counted."""

    async def metrics() -> dict:
        response = await client.get("/metrics")
        assert response.status_code == 200
        return _samples(response.text)

    queued, direct = new_product_id(), new_product_id()
    await put_product(queued, stock=3, limit=1)
    await put_product(direct, stock=3, limit=1, stock_mode="database")
    before = await metrics()

    async with own_queues(settings, "retries") as mine:

        async def consume_behind_the_lock(impatient) -> bool:
            async with running_consumer(mine, impatient, store):
                connection = await aio_pika.connect(mine.amqp.url)
                try:
                    channel = await connection.channel()
                    await publish_raw(channel, mine, encode_order(message_for(queued, "waiter", 7)))
                finally:
                    await connection.close()
                return await eventually(lambda: rows_at_least(engine, queued, 1))

        _, consumer_timeouts = await behind_a_row_lock(settings, engine, queued, consume_behind_the_lock)
    purchase = DatabasePurchase("waiter", direct, 1, mint_request_id(), compose_order_no("FS", "20261130000005", 99, 1))
    answer, purchase_timeouts = await behind_a_row_lock(
        settings, engine, direct, lambda impatient: buy_in_database(impatient, purchase)
    )
    assert answer.outcome == "reserved" and consumer_timeouts >= 1 and purchase_timeouts >= 1
    after = await metrics()

    def grew(name: str, **labels: str) -> float:
        return _get(after, name, **labels) - _get(before, name, **labels)

    assert grew("flashsale_consumer_transaction_retries_total") >= 1
    assert grew("flashsale_transaction_retries_total", work="write_orders") >= 1
    assert grew("flashsale_transaction_retries_total", work="buy_in_database") >= 1
