"""The composition root (docs/ARCHITECTURE.md): each kind of process opens its connections and
builds its use cases here, once per process (no per-request set-up), and closes them with one
``close()``. One builder per kind: :func:`open_api` (an API worker: :class:`ApiWorker`),
:func:`open_consumer` (the order consumer: :class:`Resources`), :func:`open_job` (realignment,
the sweep and the other commands that need the stores: :class:`Job`); :func:`opened` closes any
of them on exit.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import TypedDict, TypeVar

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from db.engine import make_engine
from service.adapters.background_publisher import BackgroundPublisher
from service.adapters.broker import Publisher
from service.adapters.channel_client import ChannelClient, make_channel_client
from service.adapters.dead_letters import DeadLetterQueue
from service.adapters.redis.eviction import EvictionPolicy
from service.adapters.redis.stores import RedisStores, make_stores
from service.domain.fulfilment.dead_letters import DeadLetterService
from service.domain.order_numbers.minter import OrderNumberMinter, ShardGenerations, ShardLease
from service.domain.order_numbers.mysql_minter import MysqlOrderNumberMinter
from service.domain.orders.service import OrderService
from service.domain.payments.checkout import Checkout
from service.domain.payments.reconcile import Reconciler
from service.domain.payments.service import PaymentService
from service.domain.purchase.service import PurchaseService
from service.domain.purchase.sold_out import SoldOutFlags
from service.domain.stock.catalog import CatalogService
from service.domain.stock.realign import Realigner
from service.domain.stock.rebalance import Rebalancer
from service.domain.stock.recovery import Recovery
from service.domain.waiting_room.service import WaitingRoomService
from service.runtime import stop_task
from service.settings import Settings

log = structlog.get_logger(__name__)


@dataclass(kw_only=True)
class Resources:
    """What every process holds: the settings, MySQL (``engine``) and the stock store, its Lua
    scripts loaded and Redis's eviction policy read. It is the consumer's whole container
    (:func:`open_consumer`); :class:`ApiWorker` and :class:`Job` add the use cases their
    process runs. Every field is set: what a process does not use, its builder does not open.
    :meth:`close` closes what the builder opened, the last opened first.
    """

    settings: Settings
    engine: AsyncEngine
    store: RedisStores
    eviction: EvictionPolicy
    """Redis's ``maxmemory-policy``, read at start and refreshed by the readiness probe."""
    _stack: AsyncExitStack = field(repr=False)

    async def close(self) -> None:
        """Stop the background tasks, publish what the background publisher holds (up to
        ``confirm_timeout`` seconds; the rest is left to realignment), release the shard lease
        and close every connection: whatever the builder opened, the last opened first."""
        await self._stack.aclose()


@dataclass(kw_only=True)
class ApiWorker(Resources):
    """An API worker: the purchase path on a leased order-number shard, and the use cases of
    the other routes (one Litestar provider each, :mod:`service.api.providers`).

    Optional by the settings, not by how it was opened: ``background`` only in publish mode
    ``async``; ``sold_out`` only with ``sold_out_flag_seconds`` > 0 (kept current by a task
    that follows the restock announcements until :meth:`close`); ``recovery`` (the
    self-healing task) only with ``realign.auto_seconds`` > 0.
    """

    publisher: Publisher
    lease: ShardLease
    purchases: PurchaseService
    realigner: Realigner
    orders: OrderService
    catalog: CatalogService
    payments: PaymentService
    checkout: Checkout
    background: BackgroundPublisher | None
    sold_out: SoldOutFlags | None
    recovery: Recovery | None
    rooms: WaitingRoomService


@dataclass(kw_only=True)
class Job(Resources):
    """A command that runs use cases and exits or repeats (``realign``, ``sweep``, ``product
    set``, ``reconcile``, ``payments sync``, ``dlq``, the sale's own passes). Its realigner
    republishes lost orders only when opened with a publisher (:func:`open_job`)."""

    realigner: Realigner
    catalog: CatalogService
    checkout: Checkout
    reconciler: Reconciler
    channels: ChannelClient


R = TypeVar("R", bound=Resources)


async def open_consumer(settings: Settings) -> Resources:
    """The order consumer's stores: MySQL and Redis (the consumer opens its own broker
    connection). Raises whatever the first unreachable store raises (nothing stays open then)."""
    async with _closed_on_error() as stack:
        return Resources(**await _open_stores(settings, stack))


async def open_job(settings: Settings, *, publish: bool = True) -> Job:
    """A job's stores and use cases; with ``publish`` a RabbitMQ publisher for its realigner
    (orders whose message was lost are published again). Raises whatever the first unreachable
    store raises (nothing stays open then)."""
    async with _closed_on_error() as stack:
        stores = await _open_stores(settings, stack)
        engine, store = stores["engine"], stores["store"]
        publisher = await _open_publisher(settings, stack) if publish else None
        realigner = Realigner(
            engine, store, settings.realign.grace_seconds, publisher, settings.realign.keep_resolved_seconds
        )
        channels, payments, checkout = _payments(settings, engine, store, stack)
        return Job(
            **stores,
            realigner=realigner,
            catalog=CatalogService(engine, store, realigner),
            checkout=checkout,
            reconciler=Reconciler(engine, channels, payments, settings.payment.currency),
            channels=channels,
        )


async def open_api(settings: Settings) -> ApiWorker:
    """An API worker: the stores, a RabbitMQ publisher, an order-number shard leased for the
    purchase path, the background tasks the settings ask for (background publisher, sold-out
    flags, self-healing), the routes' use cases.

    Raises:
        ShardsExhausted: every order-number shard is leased.
        Whatever the first unreachable store raises (nothing stays open then).
    """
    orders = settings.orders
    async with _closed_on_error() as stack:
        stores = await _open_stores(settings, stack)
        engine, store = stores["engine"], stores["store"]
        publisher = await _open_publisher(settings, stack)
        realigner = Realigner(
            engine, store, settings.realign.grace_seconds, publisher, settings.realign.keep_resolved_seconds
        )
        recovery = _recovery(settings, engine, store, realigner)
        lease = ShardLease(store, orders.shard_lease_seconds)
        stack.push_async_callback(lease.stop)
        await lease.start()
        minter = OrderNumberMinter(
            store, lease, orders.order_no_prefix, ShardGenerations(engine), block=orders.sequence_block
        )
        background = None
        if orders.publish_mode == "async":
            background = BackgroundPublisher(publisher)
            stack.push_async_callback(background.close, settings.amqp.confirm_timeout)
            background.start()
        sold_out = _follow_sold_out(store, orders.sold_out_flag_seconds, stack)
        rebalancer = Rebalancer(realigner)
        purchases = PurchaseService(
            store,
            minter,
            publisher,
            engine=engine,
            background=background,
            sold_out=sold_out,
            token_ttl_seconds=orders.token_ttl_seconds,
            database_minter=MysqlOrderNumberMinter(engine, orders.order_no_prefix, block=orders.sequence_block),
            not_loaded=None if recovery is None else recovery.not_loaded,
            rebalance=rebalancer,
        )
        if recovery is not None:
            stack.push_async_callback(recovery.stop)
            recovery.start()
        stack.push_async_callback(rebalancer.aclose)
        channels, payments, checkout = _payments(settings, engine, store, stack)
        rooms = WaitingRoomService(store.rooms, engine, settings.waiting_room, sold_out)
        stack.push_async_callback(rooms.aclose)
        return ApiWorker(
            **stores,
            publisher=publisher,
            lease=lease,
            purchases=purchases,
            realigner=realigner,
            orders=OrderService(engine, store, checkout.may_cancel),
            catalog=CatalogService(engine, store, realigner),
            payments=payments,
            checkout=checkout,
            background=background,
            sold_out=sold_out,
            recovery=recovery,
            rooms=rooms,
        )


@asynccontextmanager
async def opened(opening: Awaitable[R]) -> AsyncIterator[R]:
    """``async with opened(open_job(settings)) as job``: the builder's container, closed on exit."""
    resources = await opening
    try:
        yield resources
    finally:
        await resources.close()


@asynccontextmanager
async def _closed_on_error() -> AsyncIterator[AsyncExitStack]:
    """The stack a builder pushes each close on as it opens: closed, the last opened first, when
    the builder fails (or is cancelled); handed to the container otherwise."""
    stack = AsyncExitStack()
    try:
        yield stack
    except BaseException:
        await stack.aclose()
        raise


class _Stores(TypedDict):
    """:class:`Resources`'s fields, which every builder opens first (:func:`_open_stores`)."""

    settings: Settings
    engine: AsyncEngine
    store: RedisStores
    eviction: EvictionPolicy
    _stack: AsyncExitStack


async def _open_stores(settings: Settings, stack: AsyncExitStack) -> _Stores:
    """MySQL's engine and the stock store with its scripts loaded, Redis's eviction policy read."""
    db = settings.db
    engine = make_engine(
        db.url, pool_size=db.pool_size, max_overflow=db.max_overflow, idle_session_seconds=db.idle_session_seconds
    )
    stack.push_async_callback(engine.dispose)
    store = make_stores(settings)
    stack.push_async_callback(store.aclose)
    eviction = store.eviction_policy()
    await store.scripts.load()
    await eviction.check()
    return _Stores(settings=settings, engine=engine, store=store, eviction=eviction, _stack=stack)


async def _open_publisher(settings: Settings, stack: AsyncExitStack) -> Publisher:
    publisher = Publisher(settings.amqp)
    stack.push_async_callback(publisher.close)
    await publisher.connect()
    return publisher


def _payments(
    settings: Settings, engine: AsyncEngine, store: RedisStores, stack: AsyncExitStack
) -> tuple[ChannelClient, PaymentService, Checkout]:
    """The payment channels' client (closed first), the payment service and the checkout."""
    payment = settings.payment
    channels = make_channel_client(settings.payment)
    stack.push_async_callback(channels.aclose)
    payments = PaymentService(engine, store, payment.channel_secrets, payment.currency, channels)
    checkout = Checkout(engine, store, channels, payments, payment.currency, payment.notify_url)
    return channels, payments, checkout


def _recovery(settings: Settings, engine: AsyncEngine, store: RedisStores, realigner: Realigner) -> Recovery | None:
    """The API process's self-healing task (not started; None when ``auto_seconds`` is 0), which
    also drops dead-lettered copies of orders that landed since."""
    if settings.realign.auto_seconds <= 0:
        return None
    dead_letters = DeadLetterService(DeadLetterQueue(settings.amqp), engine, store, realigner)
    return Recovery(realigner, store, settings.realign.auto_seconds, after_pass=dead_letters.drop_landed)


def _follow_sold_out(store: RedisStores, ttl_seconds: float, stack: AsyncExitStack) -> SoldOutFlags | None:
    """The purchase path's sold-out flags (None when ``ttl_seconds`` is 0), kept current by a
    task stopped on close: this store's own restocks clear them before the call returns, every
    other process's through the restock channel (flags are raised only while it is followed)."""
    if ttl_seconds <= 0:
        return None
    flags = SoldOutFlags(ttl_seconds)
    store.restocks.on_restock(flags.restocked)
    follower = asyncio.create_task(store.restocks.follow(flags.restocked, flags.following, flags.lost))
    stack.push_async_callback(stop_task, follower)
    return flags
