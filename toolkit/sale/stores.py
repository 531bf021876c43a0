"""The stores of ``flashsale sale``: the sale's own connections to MySQL, Redis and RabbitMQ
(:class:`Stores`: drain polls, the reads behind the report, the sweep and the realignment),
and the set-up and tear-down of an isolated run (:func:`isolate`, :func:`tear_down`).

The sale's connections come from the composition root (:mod:`service.bootstrap`); the run's
removal from :mod:`service.teardown`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from aio_pika.abc import AbstractChannel
from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncEngine

from db.migrate import upgrade
from db.models import OrderStatus
from db.queries import inventory, orders, payments, products
from service.adapters.broker_connection import connect_once
from service.adapters.broker_topology import queue_depth, queue_depths
from service.adapters.redis.stores import RedisStores
from service.bootstrap import Job, open_job, opened
from service.domain.orders.lifecycle import expire_unpaid
from service.domain.payments.reconcile import ReconcileReport
from service.domain.stock.realign_report import RealignReport
from service.settings import Settings
from service.teardown import remove
from toolkit.sale.errors import SetupError, stderr, where
from toolkit.sale.facts import ChannelPayment, PaymentRow, SaleOrderRow, StoreFacts, UnpaidOrder
from toolkit.sale.isolation import Sale

T = TypeVar("T")

CONNECT_TIMEOUT = 10.0  # seconds for each service to answer at set-up


async def _reachable(service: str, url: str, awaitable: Awaitable[T]) -> T:
    """``awaitable``'s result, or SetupError naming the service that did not answer."""
    try:
        return await asyncio.wait_for(awaitable, CONNECT_TIMEOUT)
    except Exception as exc:
        raise SetupError(f"{service} at {where(url)} is unreachable: {exc!r}") from exc


@dataclass(frozen=True, slots=True)
class Stores:
    """The sale's own connections to MySQL, Redis (with the Lua scripts registered) and RabbitMQ
    (drain, checks, sweep, realignment)."""

    settings: Settings
    resources: Job
    channel: AbstractChannel

    @property
    def engine(self) -> AsyncEngine:
        return self.resources.engine

    @property
    def store(self) -> RedisStores:
        return self.resources.store

    @classmethod
    async def open(cls, stack: AsyncExitStack, settings: Settings) -> Stores:
        """Connect to all three (closed by ``stack``).

        Raises:
            SetupError: a service did not answer.
        """
        resources = await _reachable("Redis", settings.redis.url, open_job(settings, publish=False))
        stack.push_async_callback(resources.close)
        await _reachable("MySQL", settings.db.url, _select_one(resources.engine))
        connection = await _reachable("RabbitMQ", settings.amqp.url, connect_once(settings.amqp))
        stack.push_async_callback(connection.close)
        return cls(settings, resources, await connection.channel())

    async def queue_depth(self, name: str) -> int:
        """Messages ready in queue ``name`` (not those delivered and unacked)."""
        return await queue_depth(self.channel, name)

    async def order_queue_depth(self) -> int:
        """Messages ready in the order queues, every partition's together."""
        return await queue_depths(self.channel, self.settings.amqp.partition_queues())

    async def _scalar(self, query: TextClause, product_id: int) -> Any:
        """The one value ``query`` selects, with ``:p`` = ``product_id`` and ``:pending`` = the
        ``pending_payment`` status code."""
        async with self.engine.connect() as conn:
            params = {"p": product_id, "pending": OrderStatus.PENDING_PAYMENT}
            return (await conn.execute(query, params)).scalar_one()

    async def count_orders(self, product_id: int) -> int:
        """Order rows of the product in MySQL, whatever their status."""
        return int(await self._scalar(orders.COUNT_OF_PRODUCT, product_id))

    async def mysql_stock(self, product_id: int) -> int:
        """Units on sale in MySQL."""
        return int(await self._scalar(inventory.STOCK, product_id))

    async def youngest_unpaid_age(self, product_id: int) -> int | None:
        """Whole seconds from the newest ``created_at`` of the product's orders pending payment to
        MySQL's ``NOW()`` (both second precision), or None when none is pending."""
        age = await self._scalar(orders.YOUNGEST_UNPAID_AGE, product_id)
        return None if age is None else int(age)

    async def unpaid_orders(self, product_id: int) -> list[UnpaidOrder]:
        """The product's orders pending payment, in insertion order."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                orders.UNPAID_OF_PRODUCT,
                {"p": product_id, "pending": OrderStatus.PENDING_PAYMENT},
            )
            return [UnpaidOrder(*row) for row in rows]

    async def sweep(self, product_id: int) -> int:
        """One payment-timeout sweep of the product in this process:
        :func:`service.domain.orders.lifecycle.expire_unpaid` asking the channels first (what
        ``flashsale sweep`` runs) with the run's key prefix and payment window; returns orders
        cancelled."""
        window = self.settings.payment.window_seconds
        async with opened(open_job(self.settings, publish=False)) as job:
            return await expire_unpaid(
                self.engine, self.store, window, product_id=product_id, may_cancel=job.checkout.may_cancel
            )

    async def reconcile(self) -> tuple[ReconcileReport, list[ChannelPayment]]:
        """Today's reconciliation of every channel (what ``flashsale reconcile`` runs, without
        ``--apply``) and the payments in the channels' bills."""
        async with opened(open_job(self.settings, publish=False)) as job:
            day = datetime.now(UTC).date()
            report = await job.reconciler.reconcile(day)
            billed = [
                ChannelPayment(channel, line.channel_txn_id, line.order_no, line.amount)
                for channel in sorted(job.channels.channels)
                for line in await job.channels.bill(channel, day)
                if line.type == "payment"
            ]
        return report, billed

    async def realign(self, product_id: int) -> RealignReport:
        """One realignment pass over the product (what ``flashsale realign --product`` runs), on
        connections of its own with a publisher (lost messages are published again)."""
        async with opened(open_job(self.settings)) as job:
            return await job.realigner.realign(product_id)

    async def facts(self, product_id: int, dead_letters_before: int) -> StoreFacts:
        """What MySQL, Redis and RabbitMQ hold for the product now."""
        async with self.engine.connect() as conn:
            stock, sold = (await conn.execute(inventory.STOCK_AND_SOLD, {"p": product_id})).one()
            buckets = (await conn.execute(products.BUCKETS, {"id": product_id})).scalar_one()
            order_rows = [SaleOrderRow(*row) for row in await conn.execute(orders.OF_PRODUCT, {"p": product_id})]
            payment_rows = [PaymentRow(*row) for row in await conn.execute(payments.OF_PRODUCT, {"p": product_id})]
        amqp = self.settings.amqp
        return StoreFacts(
            mysql_stock=stock,
            mysql_sold=sold,
            orders=order_rows,
            payments=payment_rows,
            redis_stock=await self.store.stock.units(product_id, buckets=buckets),
            journal_ids=[
                entry.request_id
                for bucket in range(buckets)
                for entry in await self.store.stock.journal(product_id, bucket=bucket)
            ],
            quota=await self.store.stock.quota(product_id, buckets=buckets),
            dead_letters=await self.queue_depth(amqp.dead_letter_queue) - dead_letters_before,
            queue_messages=await self.order_queue_depth(),
            redis_held=(await self.store.rooms.counters(product_id))["held"],
        )


async def _select_one(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        await conn.execute(text("SELECT 1"))


async def _remove(what: str, remove: Callable[[], Awaitable[None]]) -> None:
    """Run one clean-up step; a failure is a warning (the report stands)."""
    try:
        await remove()
    except Exception as exc:
        stderr.print(f"[yellow]warning:[/] could not remove {what}: {exc!r}")


async def isolate(stack: AsyncExitStack, sale: Sale) -> None:
    """Create the run's database (schema at head); register removal of everything the run
    creates: database, Redis keys, queues and exchanges.

    Raises:
        SetupError: MySQL did not answer or the migration failed.
    """
    settings = sale.settings
    stack.push_async_callback(_remove, f"database, Redis keys and queues of {sale.run_id}", lambda: tear_down(settings))
    try:
        await upgrade(settings.db.url)
    except Exception as exc:
        raise SetupError(f"could not create database {sale.run_id} at {where(settings.db.url)}: {exc!r}") from exc


async def tear_down(settings: Settings) -> None:
    """Drop the run's database, unlink its Redis keys, delete its queues and exchanges
    (:func:`service.teardown.remove`). Every key starting with the run's prefix goes, ``:`` or
    not: tests derive ``<prefix>-<part>`` prefixes from theirs."""
    await remove(settings, f"{settings.redis.key_prefix}*")
