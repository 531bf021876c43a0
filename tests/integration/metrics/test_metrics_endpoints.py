"""``/metrics`` of the real processes: the API's granian workers (multiprocess mode), a consumer
and ``realign --watch``, after a small sale; and the in-process API's families."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess

import httpx
import pytest

from tests.support import eventually, order_rows, start_flashsale
from toolkit.sale.isolation import environment, free_port


def _value(exposition: str, sample: str, default: float | None = None) -> float:
    """Sum of the samples whose name and labels start with ``sample`` (``name{label="v"``);
    ``default`` when there is none (else the test fails)."""
    total, found = 0.0, False
    for line in exposition.splitlines():
        if line.startswith(sample):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    if not found and default is not None:
        return default
    assert found, f"no sample {sample!r}"
    return total


async def test_the_api_exposes_requests_and_purchase_outcomes(client, token, put_product, product_id):
    await put_product(product_id, stock=1, limit=1)
    assert (
        await client.post("/api/v1/orders", json={"product_id": product_id, "quantity": 1}, headers=token("m1"))
    ).status_code == 202
    assert (
        await client.post("/api/v1/orders", json={"product_id": product_id, "quantity": 1}, headers=token("m2"))
    ).status_code == 409
    response = await client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert (
        _value(text, 'flashsale_http_request_duration_seconds_count{method="POST",route="/api/v1/orders",status="202"}')
        >= 1
    )
    assert _value(text, 'flashsale_purchase_outcomes_total{answered_by="redis",code="accepted"}') >= 1
    assert _value(text, 'flashsale_redis_script_duration_seconds_count{script="reserve"}') >= 2
    assert _value(text, "flashsale_publish_confirm_duration_seconds_count") >= 1
    # bounded labels: a route template, never the order number or the user
    assert not re.search(r'route="[^"]*FS\d', text) and "m1" not in text


async def test_every_answer_of_a_route_is_observed_refusals_included(client, token, product_id):
    """The hooks observe what no handler answered: a missing token (the before_request hook), a
    buyer on an admin route (the guard, before the hook) and a body that is not JSON."""
    body = {"product_id": product_id, "quantity": 1}
    answers = [
        await client.post("/api/v1/orders", json=body),
        await client.get("/api/v1/admin/ops", headers=token("not-an-admin")),
        await client.post("/api/v1/orders", content=b"x=1", headers={**token("m3"), "Content-Type": "text/plain"}),
    ]
    assert [answer.status_code for answer in answers] == [401, 403, 415]
    assert all(re.fullmatch(r"[0-9a-f]{17,32}", answer.headers["x-request-id"]) for answer in answers)
    text = (await client.get("/metrics")).text
    for method, route, status in (
        ("POST", "/api/v1/orders", 401),
        ("GET", "/api/v1/admin/ops", 403),
        ("POST", "/api/v1/orders", 415),
    ):
        sample = f'flashsale_http_request_duration_seconds_count{{method="{method}",route="{route}",status="{status}"}}'
        assert _value(text, sample) >= 1


async def _scrape(url: str) -> str | None:
    try:
        async with httpx.AsyncClient(trust_env=False) as http:
            response = await http.get(url)
            return response.text if response.status_code == 200 else None
    except httpx.HTTPError:
        return None


@pytest.mark.slow
async def test_every_process_exposes_its_families_after_a_small_sale(
    settings, engine, put_product, product_id, token, tmp_path
):
    await put_product(product_id, stock=5, limit=1)
    directory = tmp_path / "prometheus"
    directory.mkdir()
    (directory / "counter_999999.db").write_bytes(b"stale")  # an earlier run's: must not count
    env = {**os.environ, **environment(settings), "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    single = {k: v for k, v in env.items() if k != "PROMETHEUS_MULTIPROC_DIR"}  # one process, its own values
    api_port, consumer_port, realign_port = free_port(), free_port(), free_port()
    processes = [
        start_flashsale(["serve", "--port", str(api_port), "--workers", "2"], env),
        start_flashsale(
            ["consume", "--metrics-port", str(consumer_port)],
            {k: v for k, v in env.items() if k != "PROMETHEUS_MULTIPROC_DIR"},
        ),
    ]
    api = f"http://127.0.0.1:{api_port}"
    try:
        await eventually(lambda: _scrape(f"{api}/api/v1/health/ready"), timeout=60, interval=0.25)
        async with httpx.AsyncClient(base_url=api, trust_env=False, timeout=30) as http:
            answers = await asyncio.gather(
                *(
                    http.post("/api/v1/orders", json={"product_id": product_id, "quantity": 1}, headers=token(f"u{i}"))
                    for i in range(40)
                )
            )
            assert sorted(r.status_code for r in answers).count(202) == 5
            for i in range(5):  # after the stampede: the workers' sold-out flags answer
                late = await http.post(
                    "/api/v1/orders", json={"product_id": product_id, "quantity": 1}, headers=token(f"late{i}")
                )
                assert late.status_code == 409
        await eventually(lambda: _rows(engine, product_id, 5))
        processes.append(
            start_flashsale(
                [
                    "realign",
                    "--product",
                    str(product_id),
                    "--watch",
                    "1",
                    "--metrics-port",
                    str(realign_port),
                    "--json",
                ],
                single,
            )
        )

        # each worker hands its sums to the shared files once a second
        text = await eventually(lambda: _flushed(f"{api}/metrics"), timeout=30)
        assert _value(text, 'flashsale_purchase_outcomes_total{answered_by="redis",code="accepted"}') == 5
        assert (
            _value(text, 'flashsale_purchase_outcomes_total{answered_by="redis",code="sold_out"}')
            + _value(text, 'flashsale_purchase_outcomes_total{answered_by="sold_out_flag",code="sold_out"}', 0)
            == 40
        )
        assert _value(text, 'flashsale_http_request_duration_seconds_count{method="POST",route="/api/v1/orders"') == 45
        assert _value(text, 'flashsale_purchase_outcomes_total{answered_by="sold_out_flag",code="sold_out"}') >= 1
        assert _value(text, 'flashsale_redis_script_duration_seconds_count{script="reserve"}') >= 5
        assert _value(text, "flashsale_publish_confirm_duration_seconds_count") == 5
        assert "flashsale_publish_failures_total" in text
        workers = {path.name.rsplit("_", 1)[1] for path in directory.glob("*.db")}
        assert "999999.db" not in workers and len(workers) >= 2  # both workers wrote, the stale file went

        # the consumer, too, hands its local sums to prometheus_client once a second
        consumer_url = f"http://127.0.0.1:{consumer_port}/metrics"
        consumer = await eventually(
            lambda: _counted(consumer_url, "flashsale_reservation_to_row_seconds_count", 5), timeout=30
        )
        assert (
            _value(consumer, 'flashsale_consumer_messages_total{outcome="applied"}') >= 5
        )  # earlier tests may leave some
        assert _value(consumer, "flashsale_consumer_batch_size_orders_sum") >= 5
        assert _value(consumer, "flashsale_reservation_to_row_seconds_count") >= 5
        assert "flashsale_consumer_transaction_retries_total" in consumer
        assert _value(consumer, 'flashsale_queue_depth_messages{queue="orders"}') >= 0
        assert _value(consumer, 'flashsale_queue_depth_messages{queue="dead_letter"}') >= 0

        realign_url = f"http://127.0.0.1:{realign_port}/metrics"
        drift = f'flashsale_realign_drift_units{{product_id="{product_id}"}} 0.0'
        realign = await eventually(lambda: _has(realign_url, drift), timeout=30)
        assert f'flashsale_realign_republished_total{{product_id="{product_id}"}} 0.0' in realign
        assert f'flashsale_realign_in_flight_units{{product_id="{product_id}"}} 0.0' in realign
    finally:
        for process in processes:
            os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                await asyncio.to_thread(process.wait, 30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


async def _rows(engine, product_id: int, count: int) -> bool:
    return len(await order_rows(engine, product_id)) >= count


async def _flushed(url: str) -> str | None:
    text = await _scrape(url)
    if text is None or "http_request_duration_seconds_count" not in text:
        return None
    total = _value(text, 'flashsale_http_request_duration_seconds_count{method="POST",route="/api/v1/orders"')
    return text if total == 45 else None


async def _counted(url: str, sample: str, least: float) -> str | None:
    text = await _scrape(url)
    return text if text is not None and _value(text, sample, 0) >= least else None


async def _has(url: str, sample: str) -> str | None:
    text = await _scrape(url)
    return text if text is not None and sample in text else None
