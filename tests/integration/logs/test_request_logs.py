"""Logs of the real processes: every line JSON (granian's own included), one access-log line per
request with its request id (returned as ``X-Request-ID``), and that id carried with the order
into the consumer's lines, so one grep shows an order's path."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from pathlib import Path

import httpx
import pytest

from tests.support import api_ready, eventually, order_rows, start_flashsale
from toolkit.sale.isolation import environment, free_port

pytestmark = pytest.mark.slow


def _lines(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


async def test_one_grep_follows_an_order_from_the_request_to_the_consumer(
    settings, engine, put_product, product_id, token, tmp_path
):
    await put_product(product_id, stock=3, limit=1)
    env = {**os.environ, **environment(settings)}
    port = free_port()
    api_log, consumer_log = tmp_path / "api.log", tmp_path / "consumer.log"
    processes = [
        start_flashsale(["serve", "--port", str(port), "--workers", "1"], env, api_log),
        start_flashsale(["consume"], env, consumer_log),
    ]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=30) as http:
            await eventually(lambda: api_ready(http), timeout=60, interval=0.25)
            body = {"product_id": product_id, "quantity": 1}
            traced = await http.post(
                "/api/v1/orders", json=body, headers={**token("traced"), "X-Request-ID": "trace-7f3c"}
            )
            assert traced.status_code == 202 and traced.headers["x-request-id"] == "trace-7f3c"
            minted = await http.post("/api/v1/orders", json=body, headers=token("untraced"))
            assert minted.status_code == 202 and re.fullmatch(r"[0-9a-f]{17,32}", minted.headers["x-request-id"])
            bad = await http.post("/api/v1/orders", json=body, headers={**token("x"), "X-Request-ID": "a b"})
            assert bad.headers["x-request-id"] != "a b"  # not 1-128 visible ASCII: a new one is minted
        order = traced.json()
        await eventually(lambda: _rows(engine, product_id, 2))

        async def logged() -> bool:
            consumer = [line for line in _lines(consumer_log) if line.get("event") == "orders_written"]
            access = [line for line in _lines(api_log) if line.get("event") == "http_request"]
            return any("trace-7f3c" in json.dumps(line) for line in consumer) and len(access) >= 4

        await eventually(logged, timeout=30)
    finally:
        for process in processes:
            os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            await asyncio.to_thread(process.wait, 30)

    api_lines, consumer_lines = _lines(api_log), _lines(consumer_log)  # every line parses as JSON
    assert any(line.get("logger", "").startswith("_granian") for line in api_lines)  # granian's own, as JSON
    traced_lines = [line for line in api_lines if line.get("http_request_id") == "trace-7f3c"]
    # the access line, and any line logged while serving the request (the first order number of
    # a fresh Redis moves its shard's generation on: order_no_generation_moved) carries the id too
    [access] = [line for line in traced_lines if line["event"] == "http_request"]
    assert access["method"] == "POST" and access["status"] == 202
    assert access["route"] == "/api/v1/orders" and access["duration_ms"] > 0
    assert (access["request_id"], access["order_no"]) == (order["request_id"], order["order_no"])
    # one grep for the order's request id: the HTTP request and the consumer's write
    grep = [line for line in (*api_lines, *consumer_lines) if order["request_id"] in json.dumps(line)]
    events = {line["event"] for line in grep}
    assert {"http_request", "orders_written"} <= events
    [written] = [
        entry
        for line in consumer_lines
        if line.get("event") == "orders_written"
        for entry in line["orders"]
        if entry["request_id"] == order["request_id"]
    ]
    assert written == {
        "request_id": order["request_id"],
        "order_no": order["order_no"],
        "outcome": "applied",
        "http_request_id": "trace-7f3c",
    }


async def _rows(engine, product_id: int, count: int) -> bool:
    return len(await order_rows(engine, product_id)) >= count
