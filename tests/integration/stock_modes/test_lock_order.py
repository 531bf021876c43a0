"""One lock order on the real MariaDB: a product row before its inventory row. A consumer's batch
holds the product row shared (its ``INSERT ... JOIN products`` and the foreign key check) before
it takes the stock (``UPDATE inventory``); a product set or a mode switch that took the inventory
row first and then wrote the product row deadlocked with it, was the victim every time (it had
written nothing yet), and under a steady stream of batches ran out of retries: ``500`` on the
admin route mid-sale (found by an attacker: 40 switches under 400 buyers). Each test holds a
batch open between its two statements, starts the writer, then finishes the batch."""

from __future__ import annotations

import asyncio

from sqlalchemy.ext.asyncio import AsyncEngine

from db.models import OrderStatus, StockMode
from db.queries import inventory, orders
from db.queries.json_rows import json_rows
from service import metrics
from service.domain.order_numbers.format import compose_order_no
from service.domain.purchase.request_id import mint_request_id
from service.domain.stock.modes import set_mode

WAIT = 0.5
"""Long enough for the writer to reach its lock wait (it would be blocked for good otherwise)."""


def _retries(work: str) -> float:
    return metrics.registry().get_sample_value("flashsale_transaction_retries_total", {"work": work}) or 0.0


async def _batch_holding_the_product_row(engine: AsyncEngine, product_id: int, writer) -> None:
    """The consumer's two statements, in its order, in one transaction, with ``writer`` (a
    coroutine function) started between them; the batch must commit and the writer finish."""
    order_no = compose_order_no("FS", "20261203000000", 92, product_id % 1_000_000)  # this test's own numbers
    rows = json_rows([[order_no, mint_request_id(), "held", product_id, 1, 1500]])
    async with engine.begin() as conn:
        await conn.execute(orders.INSERT_MANY, {"rows": rows, "status": OrderStatus.PENDING_PAYMENT})
        started = asyncio.ensure_future(writer())
        await asyncio.sleep(WAIT)
        assert not started.done(), "the writer did not wait for the product row"
        taken = await conn.execute(inventory.TAKE, {"product_id": product_id, "quantity": 1})
        assert taken.rowcount == 1
    await asyncio.wait_for(started, 30)


async def test_a_product_set_waits_for_a_batch_holding_the_product_row(client, admin, engine, put_product, product_id):
    await put_product(product_id, stock=10, limit=1)
    before = _retries("set_product")

    async def product_set() -> None:
        body = {"stock": 20, "per_user_limit": 2, "price": 1500, "stock_mode": "redis"}
        response = await client.put(f"/api/v1/admin/products/{product_id}", json=body, headers=admin)
        assert response.status_code == 200, response.text

    await _batch_holding_the_product_row(engine, product_id, product_set)
    assert _retries("set_product") == before  # no deadlock to retry


async def test_a_mode_switch_waits_for_a_batch_holding_the_product_row(engine, put_product, product_id):
    await put_product(product_id, stock=10, limit=1)
    before = _retries("set_stock_mode")
    await _batch_holding_the_product_row(engine, product_id, lambda: set_mode(engine, product_id, StockMode.DATABASE))
    assert _retries("set_stock_mode") == before
