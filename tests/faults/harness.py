"""One fault case of the suite: a small flash sale on the private servers, run by the project's
own processes, a fault injected mid-sale, then the invariants and the row of the table.

A case (:class:`FaultSale`) gets settings of its own on the session's private Redis, MariaDB
and RabbitMQ (database, key prefix and queue names ``fault_<hex>``, removed afterwards) and
starts, as compose would, ``flashsale serve --workers 2``, ``flashsale consume``, ``flashsale
realign --watch 1`` and ``flashsale sweep --watch 5`` under a small supervisor
(:mod:`tests.faults.supervisor`) that restarts a process that ended (compose's ``restart:
unless-stopped``) and records the exits it did not cause. Buyers (:mod:`tests.faults.buyers`:
the plan of ``flashsale sale``, :func:`toolkit.sale.plan.build_plan`, every request with an
Idempotency-Key) send their purchases from :data:`tests.faults.terms.CONCURRENCY` connections
and retry a 503, a 429, a 409 ``request_in_progress`` or a lost connection with the same key
until they get an answer that is final (:data:`tests.faults.terms.BUYER_PATIENCE`). Meanwhile a canary buyer purchases a
second product twice a second and the suite times how long each order takes to get its row;
the readiness of the API and the reservation journal are sampled.

After the load and the fault, :meth:`FaultSale.finish` (:mod:`tests.faults.checks`) waits for the
sale to settle and checks, for the row of the table (:class:`tests.faults.report.Row`):

- lost: a 202 whose order has no row in MySQL, or whose ``GET /orders/{order_no}`` (as the
  buyer) does not answer 200 with the order written;
- duplicate: two rows for one request, one order number answered to two requests (or two
  numbers to one), a row that is not the order its 202 described;
- no 202: a row whose buyer was never told (every buyer retries until a final answer);
- oversold: units held in MySQL beyond the stock (or ``sold`` beyond it);
- over-limit: buyers holding more units than the per-user limit in MySQL;
- stranded: reservations left in the journal without a row for longer than
  :data:`tests.faults.terms.STRANDED_BOUND` seconds (counted from the end of the fault);
- recovered by itself: within :data:`tests.faults.terms.RECOVERY_TIMEOUT` after the load, with no step by a
  person (the supervisor only restarts what ended, as compose does): every 202 has its row,
  Redis stock = MySQL stock with an empty journal and quotas = units held, nothing left in the
  order queue, no message of the sale in the dead-letter queue, the API ready and buying again,
  every process still running (none ended by itself), plus the checks of the fault's own
  (:attr:`FaultSale.extra_checks`);
- time to recover: from the end of the fault to the first canary order, bought after it, that
  has its row (and the API ready);
- 503 share and longest 503 window, and the bound on the window (tests/faults/availability.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aio_pika
import httpx
import msgspec
from sqlalchemy.ext.asyncio import AsyncEngine

from db.engine import make_engine
from db.migrate import upgrade
from db.queries import orders as order_queries
from service.adapters.broker_topology import declare_topology
from service.adapters.redis.keys import ProductKeys
from service.adapters.redis.stores import RedisStores, make_stores
from service.bootstrap import open_job, opened
from service.domain.stock.catalog import ProductInput
from service.model.order_message import encode_order, orders_of
from service.runtime import stop_task
from service.settings import Settings
from tests.faults import checks, samplers, terms
from tests.faults.buyers import Buyers
from tests.faults.report import Row
from tests.faults.supervisor import Servers, Supervisor
from tests.faults.terms import (
    CANARY_STOCK,
    GRACE_SECONDS,
    LIMIT,
    PREFETCH,
    PRICE,
    SWEEP_SECONDS,
    WATCH_SECONDS,
    WORKERS,
    monotonic,
)
from tests.support import message_for
from toolkit.sale.isolation import environment, free_port, new_run_id, sale_settings
from toolkit.sale.plan import ACCEPTED
from toolkit.sale.stores import tear_down


class FaultSale:
    """One case: see the module docstring. Use as ``async with FaultSale(...) as sale``."""

    def __init__(self, servers: Servers, fault: str, log_root: Path) -> None:
        self.servers = servers
        self.fault = fault
        self.run_id = new_run_id("fault")
        base = Settings().model_copy(
            update={
                "redis": Settings().redis.model_copy(update={"url": servers.redis.url}),
                "db": Settings().db.model_copy(update={"url": servers.mariadb.url("flashsale")}),
                "amqp": Settings().amqp.model_copy(update={"url": servers.rabbitmq.url}),
            }
        )
        settings = sale_settings(base, self.run_id, None)
        self.settings = settings.model_copy(
            update={
                "realign": settings.realign.model_copy(update={"grace_seconds": GRACE_SECONDS}),
                "log_level": "INFO",
                "metrics": settings.metrics.model_copy(update={"port": 0}),
            }
        )
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.realign_metrics_port = free_port()
        slug = "".join(c if c.isalnum() else "-" for c in fault.lower()).strip("-")
        self.log_dir = log_root / f"{slug[:60]}-{self.run_id}"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.supervisor = Supervisor({**os.environ, **environment(self.settings)}, self.log_dir)
        self.product_id = random.randrange(10**9, 2 * 10**9)
        self.canary_id = self.product_id + 1
        self.buyers = Buyers(self.url, self.product_id, self.settings)
        self.engine: AsyncEngine | None = None
        self.store: RedisStores | None = None
        self.extra_checks: list[Callable[[], Awaitable[str | None]]] = []
        self.notes: list[str] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self.readiness: list[tuple[float, int]] = []
        self.canary: list[dict[str, Any]] = []  # {"sent", "accepted", "order_no", "row"}
        self.stranded: set[str] = set()
        self.fault_end: float | None = None
        self.fault_start: float | None = None
        self.recovery: float | None = None
        """The fault's own recovery, seconds from its start (availability.py); None: the whole fault."""
        self.load_task: asyncio.Task[None] | None = None
        self.load_end: float | None = None

    # -- set-up and tear-down ---------------------------------------------------------------------

    async def __aenter__(self) -> FaultSale:
        await self.servers.ensure_running()
        await upgrade(self.settings.db.url)
        connection = await aio_pika.connect(self.settings.amqp.url)
        try:
            await declare_topology(await connection.channel(), self.settings.amqp)
        finally:
            await connection.close()
        self.engine = make_engine(self.settings.db.url, pool_size=4, max_overflow=4)
        self.store = make_stores(self.settings)
        async with opened(open_job(self.settings, publish=False)) as resources:
            for product_id, stock, limit in (
                (self.product_id, terms.STOCK, LIMIT),
                (self.canary_id, CANARY_STOCK, 10**6),
            ):
                product = {"stock": stock, "per_user_limit": limit, "price": PRICE, "stock_mode": "redis"}
                await resources.catalog.set(product_id, msgspec.convert(product, ProductInput))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        if self.load_task is not None and not self.load_task.done():
            self.load_task.cancel()
        # stop_task cancels again until each ends: Python 3.11 can drop a cancellation inside
        # redis-py (service.runtime.stop_task), and a sampler that lost its one ran for ever
        await asyncio.gather(*(stop_task(task) for task in self._tasks), return_exceptions=True)
        await self.supervisor.stop_all()
        await self.servers.ensure_running()
        if self.store is not None:
            await self.store.aclose()
        if self.engine is not None:
            await self.engine.dispose()
        await tear_down(self.settings)

    # -- processes --------------------------------------------------------------------------------

    async def start_api(self, env: dict[str, str] | None = None) -> None:
        await self.supervisor.start(
            "api", "serve", "--host", "127.0.0.1", "--port", str(self.port), "--workers", str(WORKERS), env=env
        )

    async def start_consumer(self, prefetch: int = PREFETCH) -> None:
        await self.supervisor.start("consumer", "consume", "--prefetch", str(prefetch))

    async def start_realign(self) -> None:
        await self.supervisor.start(
            "realign",
            "realign",
            "--watch",
            str(WATCH_SECONDS),
            "--json",
            "--metrics-port",
            str(self.realign_metrics_port),
        )

    async def start_sweep(self) -> None:
        await self.supervisor.start("sweep", "sweep", "--watch", str(SWEEP_SECONDS), "--json")

    async def start_all(
        self, *, realign: bool = True, consumer: bool = True, api_env: dict[str, str] | None = None
    ) -> None:
        await self.start_api(api_env)
        if consumer:
            await self.start_consumer()
        if realign:
            await self.start_realign()
        await self.start_sweep()
        self._tasks.append(asyncio.create_task(samplers.readiness(self)))
        self._tasks.append(asyncio.create_task(samplers.canary(self)))
        self._tasks.append(asyncio.create_task(samplers.journal(self)))

    async def ready(self, timeout: float = 90.0) -> bool:
        """Until ``/health/ready`` answers 200 (False after ``timeout`` seconds)."""
        deadline = monotonic() + timeout
        async with httpx.AsyncClient(base_url=self.url, timeout=5, trust_env=False) as http:
            while monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get("/api/v1/health/ready")).status_code == 200:
                        return True
                await asyncio.sleep(0.2)
        return False

    # -- the load ---------------------------------------------------------------------------------

    def start_load(self) -> None:
        async def load() -> None:
            await self.buyers.run(self.buyers.plan(self.run_id))
            self.load_end = monotonic()

        self.load_task = asyncio.create_task(load())

    async def mid_sale(self, fraction: float = 0.3) -> None:
        """Until buyers were told 202 for ``fraction`` of the stock (orders are in flight)."""
        while self.buyers.accepted_units < fraction * terms.STOCK:
            if self.load_task is not None and self.load_task.done():
                return
            await asyncio.sleep(0.02)

    def faulted(self) -> None:
        self.fault_start = monotonic()

    def fault_over(self) -> None:
        self.fault_end = monotonic()

    async def present_request_ids(self, request_ids: list[str]) -> set[str]:
        """Which of ``request_ids`` have their row in MySQL."""
        assert self.engine is not None
        present: set[str] = set()
        async with self.engine.connect() as conn:
            for start in range(0, len(request_ids), 1000):
                chunk = request_ids[start : start + 1000]
                rows = await conn.execute(order_queries.PRESENT_REQUEST_IDS, {"r": chunk})
                present.update(request_id for (request_id,) in rows)
        return present

    # -- the stores, directly ---------------------------------------------------------------------

    async def publish_poison(self, count: int = 100) -> None:
        """``count`` well-formed order messages for a product that does not exist."""
        connection = await aio_pika.connect(self.settings.amqp.url)
        try:
            channel = await connection.channel(publisher_confirms=True)
            exchange = await channel.get_exchange(self.settings.amqp.exchange)
            unknown = self.product_id + 7  # no such product: well-formed messages the consumer cannot apply
            for number in range(count):
                message = message_for(unknown, f"poison-{number}", number + 1)
                await exchange.publish(
                    aio_pika.Message(
                        encode_order(message),
                        message_id=message.request_id,
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    ),
                    routing_key=self.settings.amqp.queue,
                )
        finally:
            await connection.close()

    async def delete_quotas(self, users: list[str]) -> None:
        assert self.store is not None
        await self.servers.redis.command(
            "HDEL", ProductKeys(self.settings.redis.key_prefix, self.product_id).quota, *users
        )

    def accepted_order_nos(self) -> set[str]:
        return {o.order_no for o in self.buyers.outcomes if o is not None and o.code == ACCEPTED and o.order_no}

    def holders_of_the_limit(self, count: int) -> list[str]:
        """Up to ``count`` buyers who were answered 202 for the whole limit already."""
        units: Counter[str] = Counter()
        for job in self.buyers.jobs:
            for shot in job.shots:
                outcome = self.buyers.outcomes[shot.index]
                if outcome is not None and outcome.code == ACCEPTED:
                    units[shot.user] += shot.quantity
        return [user for user, held in units.items() if held >= LIMIT][:count]

    async def republished(self) -> float | None:
        """``flashsale_realign_republished_total`` of the sale's product, from realign's /metrics."""
        try:
            async with httpx.AsyncClient(timeout=5, trust_env=False) as http:
                body = (await http.get(f"http://127.0.0.1:{self.realign_metrics_port}/metrics")).text
        except httpx.HTTPError:
            return None
        total = 0.0
        for line in body.splitlines():
            if line.startswith("flashsale_realign_republished_total{") and f'"{self.product_id}"' in line:
                total += float(line.rsplit(" ", 1)[1])
        return total

    async def dead_letters(self) -> dict[str, int]:
        """The dead-letter queue's orders by kind: ``sale`` (an order of the sale), ``canary``,
        ``other`` (the poison flood); read off the queue (it is the case's own)."""
        kinds: Counter[str] = Counter()
        connection = await aio_pika.connect(self.settings.amqp.url)
        try:
            channel = await connection.channel()
            queue = await channel.get_queue(self.settings.amqp.dead_letter_queue)
            while (message := await queue.get(no_ack=True, fail=False)) is not None:
                try:  # a group the broker dead-lettered whole counts once per order
                    products = [order.product_id for order in orders_of(message.body)]
                except msgspec.MsgspecError:
                    products = [-1]
                for product in products:
                    kind = "sale" if product == self.product_id else "canary" if product == self.canary_id else "other"
                    kinds[kind] += 1
        finally:
            await connection.close()
        return dict(kinds)

    async def queue_depth(self) -> int:
        connection = await aio_pika.connect(self.settings.amqp.url)
        try:
            channel = await connection.channel()
            queue = await channel.declare_queue(self.settings.amqp.queue, passive=True)
            return queue.declaration_result.message_count or 0
        finally:
            await connection.close()

    # -- the verdict ------------------------------------------------------------------------------

    async def finish(self) -> Row:
        """Wait for the load and for the sale to settle; the row of the table (:func:`tests.faults.checks.finish`)."""
        return await checks.finish(self)

    def longest_canary_wait(self, after: float | None = None) -> float | None:
        """Seconds from a canary's 202 to its row, the longest (orders accepted after ``after``)."""
        waits = [
            (entry["row"] if entry["row"] is not None else monotonic()) - entry["accepted"]
            for entry in self.canary
            if after is None or entry["accepted"] >= after
        ]
        return round(max(waits), 1) if waits else None

    def readiness_lie(self, after: float) -> float:
        """The longest stretch after ``after`` in which readiness said 200 while every purchase
        (buyers' tries) answered 503: seconds."""
        longest, start = 0.0, None
        events = sorted(
            [(t, "ready", s) for t, s in self.readiness if t >= after]
            + [(t.at, "buy", t.status) for t in self.buyers.tries if t.at >= after]
        )
        ready_ok = False
        for at, kind, status in events:
            if kind == "ready":
                ready_ok = status == 200
                if not ready_ok:
                    start = None
                continue
            if status == 503 and ready_ok:
                start = at if start is None else start
                longest = max(longest, at - start)
            elif status != 503:
                start = None
        return longest
