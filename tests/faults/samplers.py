"""The fault suite's samplers, run beside a case's load (:meth:`FaultSale.start_all
<tests.faults.harness.FaultSale.start_all>`): the API's readiness, a canary buyer timing how
long its orders take to get their rows, and the reservations left stranded in the journal."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import httpx

from db.queries import orders as order_queries
from tests.faults.terms import BUYER_PATIENCE, CANARY_EVERY, STRANDED_BOUND, monotonic

if TYPE_CHECKING:
    from tests.faults.harness import FaultSale


async def readiness(sale: FaultSale) -> None:
    """Every quarter second: the API's readiness answer (0: none), into ``sale.readiness``."""
    async with httpx.AsyncClient(base_url=sale.url, timeout=3, trust_env=False) as http:
        while True:
            try:
                status = (await http.get("/api/v1/health/ready")).status_code
            except httpx.HTTPError:
                status = 0
            sale.readiness.append((monotonic(), status))
            await asyncio.sleep(0.25)


async def canary(sale: FaultSale) -> None:
    """A purchase of the canary product every :data:`tests.faults.terms.CANARY_EVERY` seconds
    (a new buyer each, retried like every buyer); each 202 is then watched for its row."""
    number = 0
    limits = httpx.Limits(max_connections=8)
    async with httpx.AsyncClient(base_url=sale.url, timeout=10, limits=limits, trust_env=False) as http:
        watcher = asyncio.create_task(_canary_rows(sale))
        buying: set[asyncio.Task[None]] = set()
        try:
            while True:
                number += 1
                task = asyncio.create_task(_canary_buy(sale, http, f"canary-{number}"))
                buying.add(task)
                task.add_done_callback(buying.discard)
                await asyncio.sleep(CANARY_EVERY)
        finally:
            watcher.cancel()
            for task in buying:
                task.cancel()


async def _canary_buy(sale: FaultSale, http: httpx.AsyncClient, user: str) -> None:
    entry: dict[str, Any] = {"sent": monotonic(), "accepted": None, "order_no": None, "row": None}
    headers = {"Authorization": sale.buyers.token(user), "Idempotency-Key": f"{user}-key"}
    body = {"product_id": sale.canary_id, "quantity": 1}
    while monotonic() - entry["sent"] < BUYER_PATIENCE:
        try:
            response = await http.post("/api/v1/orders", json=body, headers=headers)
        except httpx.HTTPError:
            await asyncio.sleep(0.5)
            continue
        if response.status_code == 202:
            entry["accepted"], entry["order_no"] = monotonic(), response.json()["order_no"]
            sale.canary.append(entry)
            return
        if response.status_code not in (409, 429, 503):
            return
        await asyncio.sleep(0.5)


async def _canary_rows(sale: FaultSale) -> None:
    assert sale.engine is not None
    while True:
        await asyncio.sleep(0.2)
        waiting = {entry["order_no"]: entry for entry in sale.canary if entry["row"] is None}
        if not waiting:
            continue
        try:
            async with sale.engine.connect() as conn:
                rows = await conn.execute(order_queries.PRESENT_ORDER_NOS, {"order_nos": list(waiting)})
                found = {order_no for (order_no,) in rows}
        except Exception:
            continue
        now = monotonic()
        for order_no in found:
            waiting[order_no]["row"] = now


async def journal(sale: FaultSale) -> None:
    """Every second: the sale's reservations without a row for longer than
    :data:`tests.faults.terms.STRANDED_BOUND` seconds, counted from the end of the fault (while a store is down
    nothing can be expected of realignment)."""
    assert sale.store is not None
    while True:
        await asyncio.sleep(1.0)
        try:
            journal = await sale.store.stock.journal(sale.product_id)
            now_ms = await sale.store.stock.server_time_ms()
            present = await sale.present_request_ids([entry.request_id for entry in journal])
        except Exception:
            continue
        if sale.fault_start is not None and sale.fault_end is None:
            continue  # the fault is on
        since_ms = now_ms - (monotonic() - sale.fault_end) * 1000 if sale.fault_end is not None else 0
        for entry in journal:
            if entry.request_id in present:
                continue
            if now_ms - max(entry.reserved_at_ms, since_ms) > STRANDED_BOUND * 1000:
                sale.stranded.add(entry.request_id)
