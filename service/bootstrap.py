"""The composition root (docs/ARCHITECTURE.md): each kind of process opens its connections and
builds its use cases here, once per process (no per-request set-up), and closes them with one
``close()``. One builder per kind: :func:`open_api` (an API worker: :class:`ApiWorker`),
:func:`open_consumer` (the order consumer: :class:`Resources`), :func:`open_job` (realignment,
the sweep and the other commands that need the stores: :class:`Job`); :func:`opened` closes any
of them on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import TypedDict, TypeVar

import httpx
import structlog
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from db.engine import make_engine
from service.adapters.background_publisher import BackgroundPublisher
from service.adapters.broker import Publisher, quiet_connect_logs
from service.adapters.channel_client import ChannelClient
from service.adapters.dead_letters import DeadLetterQueue
from service.adapters.redis.client import make_redis
from service.adapters.redis.eviction import EvictionPolicy
from service.adapters.redis.stores import RedisStores, make_stores
from service.domain.fulfilment.dead_letters import DeadLetterService
from service.domain.order_numbers.minter import OrderNumberMinter, ShardGenerations, ShardLease, ShardsExhausted
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
from service.runtime import Backoff, OutageLog, stop_signal, stop_task, wait_or_stop
from service.settings import ConfigError, Settings

log = structlog.get_logger(__name__)


def make_channel_client(settings: Settings) -> ChannelClient:
    """The channels' HTTP API on one pooled client per process: every call bounded by
    ``channel_timeout`` seconds (connect, read, write and the wait for a pooled connection), at
    most 20 connections."""
    payment = settings.payment
    http = httpx.AsyncClient(
        timeout=httpx.Timeout(payment.channel_timeout),
        limits=httpx.Limits(max_connections=20, max_keepalive_connections=10),
    )
    return ChannelClient(payment.channel_urls, http)


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

    @classmethod
    async def open(cls, settings: Settings, *, publish: bool = True, purchase: bool = True) -> Resources:
        """The builder of the kind of process the flags name, for the start-up loops that take
        flags (:func:`open_when_reachable`, :class:`BackgroundResources`): ``purchase`` (with
        ``publish``) the API worker (:func:`open_api`), otherwise a job (:func:`open_job`, with a
        publisher when ``publish``)."""
        if purchase and publish:
            return await open_api(settings)
        return await open_job(settings, publish=publish)


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
        realigner = Realigner(engine, store, settings.realign.grace_seconds, publisher)
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
        realigner = Realigner(engine, store, settings.realign.grace_seconds, publisher)
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
async def job_opened(settings: Settings, *, publish: bool = True, wait: bool = False) -> AsyncIterator[Job | None]:
    """``async with job_opened(settings) as job``: :func:`open_job`, closed on exit. With
    ``wait`` (a command that repeats: ``realign --watch``, ``sweep --watch``) it waits for the
    stores first (:func:`opened_when_reachable`); ``job`` is None when SIGTERM/SIGINT came first."""
    if not wait:
        async with opened(open_job(settings, publish=publish)) as job:
            yield job
        return
    async with opened_when_reachable(settings, publish=publish) as resources:
        assert resources is None or isinstance(resources, Job)  # opened without purchase: a job
        yield resources


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
    engine = make_engine(db.url, pool_size=db.pool_size, max_overflow=db.max_overflow)
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
    channels = make_channel_client(settings)
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


class DependencyUnreachable(ConfigError):
    """A store named by a setting did not answer. ``str()`` is one line: what, which variable, why."""


_UNREACHABLE_MYSQL_ERRNOS = {1044, 1045, 1049, 2002, 2003, 2005, 2006, 2013}
"""Access denied (1044, 1045), unknown database (1049), cannot connect / host unknown / gone away
/ lost during query (2002-2013): MySQL errors that say "not reachable as configured"."""


def _where(url: str) -> str:
    """``host:port`` (or the path of a socket) of a store URL, without credentials."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.netloc.rsplit("@", 1)[-1] or parts.path or url.split("://", 1)[0]


def unreachable(exc: BaseException, settings: Settings) -> DependencyUnreachable | None:
    """The one-line :class:`DependencyUnreachable` for an exception that means a store named by
    the settings cannot be reached (MySQL, Redis or RabbitMQ); None for any other exception."""
    from aiormq.exceptions import AMQPConnectionError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from db.engine import is_unreachable

    reason = str(getattr(exc, "orig", None) or exc).splitlines()[0][:200]
    if is_unreachable(exc):
        what, variable, url = "MySQL", "FLASHSALE_DB__URL", settings.db.url
    elif isinstance(exc, RedisConnectionError | RedisTimeoutError):
        what, variable, url = "Redis", "FLASHSALE_REDIS__URL", settings.redis.url
    elif isinstance(exc, AMQPConnectionError):
        what, variable, url = "RabbitMQ", "FLASHSALE_AMQP__URL", settings.amqp.url
    else:
        return None
    return DependencyUnreachable(f"{variable}: cannot reach {what} at {_where(url)}: {reason}")


async def check_dependencies(settings: Settings, *, redis: bool = True, amqp: bool = True, mysql: bool = True) -> None:
    """Connect once to each store the process needs (Redis PING, a RabbitMQ connection, MySQL
    ``SELECT 1``), in that order, each bounded by its connect timeout: the start-up check of
    ``flashsale serve`` and ``consume``, so that a wrong URL ends in one line instead of workers
    crashing and being respawned.

    Raises:
        DependencyUnreachable: the first store that did not answer.
    """
    import aio_pika

    try:
        if redis:
            client = make_redis(settings)
            try:
                await client.ping()
            finally:
                await client.aclose()
        if amqp:
            # aiormq logs the refused connect itself; the error raised says it once, in one line
            with quiet_connect_logs():
                connection = await aio_pika.connect(settings.amqp.url, timeout=settings.amqp.confirm_timeout)
            await connection.close()
        if mysql:
            engine = make_engine(settings.db.url, pool_size=1, max_overflow=0)
            try:
                async with engine.connect() as conn:
                    await conn.execute(text("SELECT 1"))
            finally:
                await engine.dispose()
    except Exception as exc:
        problem = unreachable(exc, settings)
        if problem is None:
            raise
        raise problem from exc


_MYSQL_OUTAGE_ERRNOS = frozenset({1053, 1927, 2002, 2003, 2005, 2006, 2013, 2055, 4031})
"""Server shutdown in progress (1053), connection killed (1927), cannot connect / host unknown /
gone away / lost (2002-2013, 2055), disconnected for inactivity (4031): MySQL is away, and may
come back. Access denied (1044, 1045) and unknown database (1049) are not: they are configuration."""


def _one_outage(exc: BaseException) -> str | None:
    """The store ``exc`` says is away; "" when it says something else for sure (credentials,
    a MySQL error that is no connection error); None when it does not tell (look at its cause)."""
    from aiormq.exceptions import AMQPConnectionError, ChannelInvalidStateError, ProbableAuthenticationError
    from aiormq.exceptions import AuthenticationError as AMQPAuthenticationError
    from redis.exceptions import AuthenticationError as RedisAuthenticationError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError
    from sqlalchemy.exc import DBAPIError
    from sqlalchemy.exc import TimeoutError as PoolTimeoutError

    from db.engine import mysql_errno
    from service.adapters.broker import PublishFailed
    from service.adapters.failures import StoreUnavailable

    if isinstance(exc, StoreUnavailable):  # an adapter's translation: the driver's error, its cause, tells
        return (
            None
            if exc.__cause__ is not None
            else {"redis": "Redis", "mysql": "MySQL", "rabbitmq": "RabbitMQ"}[exc.store]
        )
    if isinstance(exc, RedisAuthenticationError | AMQPAuthenticationError | ProbableAuthenticationError):
        return ""  # configuration, whatever caused it
    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        return "Redis"
    if isinstance(exc, DBAPIError):
        return "MySQL" if mysql_errno(exc) in _MYSQL_OUTAGE_ERRNOS else ""
    if isinstance(exc, PoolTimeoutError):
        return "MySQL"
    if isinstance(exc, AMQPConnectionError | ChannelInvalidStateError | PublishFailed):
        return "RabbitMQ"
    if isinstance(exc, OSError | TimeoutError):  # refused, reset, timed out: whoever it was may come back
        return "a store"
    return None


def outage_of(exc: BaseException) -> str | None:
    """Which store is away when ``exc`` says one is (``"Redis"``, ``"MySQL"``, ``"RabbitMQ"``, or
    ``"a store"`` for a bare refused connection or timeout), else None: a store that is down,
    restarting, unreachable or timing out may come back, so a long-running process waits for it.
    Wrong credentials and an unknown database are no outage (None): they are configuration. The
    exception's causes are looked at too (:class:`DependencyUnreachable` wraps the driver's)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if (what := _one_outage(current)) is not None:
            return what or None
        current = current.__cause__ or current.__context__
    return None


def is_outage(exc: BaseException) -> bool:
    """True when ``exc`` means a store is away for now (:func:`outage_of`)."""
    return outage_of(exc) is not None


async def probe_dependencies(settings: Settings) -> dict[str, BaseException | None]:
    """Ask Redis, RabbitMQ and MySQL side by side, once each (:func:`check_dependencies`):
    ``{"redis": None | error, "rabbitmq": ..., "mysql": ...}``; never raises for a store that
    does not answer."""
    checks = {
        "redis": check_dependencies(settings, amqp=False, mysql=False),
        "rabbitmq": check_dependencies(settings, redis=False, mysql=False),
        "mysql": check_dependencies(settings, redis=False, amqp=False),
    }
    results = await asyncio.gather(*checks.values(), return_exceptions=True)
    found: dict[str, BaseException | None] = {}
    for name, result in zip(checks, results, strict=True):
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result  # cancelled
        found[name] = result if isinstance(result, BaseException) else None
    return found


async def wait_for_dependencies(
    settings: Settings, stop: asyncio.Event | None = None, *, redis: bool = True, amqp: bool = True, mysql: bool = True
) -> bool:
    """Check the stores (:func:`check_dependencies`) until each answers, with back-off (0.5 s
    doubling to 5 s) and one log line when the wait begins and one when it ends, however long
    it takes. True once they answer; False when ``stop`` was set first.

    Raises:
        DependencyUnreachable: a store refused as configured (wrong credentials, unknown
            database): waiting would not help.
    """
    backoff = Backoff()
    waiting = OutageLog("dependency")
    while True:
        try:
            await check_dependencies(settings, redis=redis, amqp=amqp, mysql=mysql)
        except DependencyUnreachable as exc:
            if not is_outage(exc):
                raise
            waiting.failed(exc, store=outage_of(exc))
            if await wait_or_stop(stop, backoff.next()):
                return False
            continue
        waiting.recovered()
        return True


async def open_when_reachable(
    settings: Settings, stop: asyncio.Event | None = None, *, publish: bool = True, purchase: bool = False
) -> Resources | None:
    """:meth:`Resources.open`, tried again with back-off while a store is away (one log line
    when the wait begins, one when it ends); None when ``stop`` was set first. Close the result.

    Raises:
        Whatever :meth:`Resources.open` raises that is no outage (:func:`is_outage`).
    """
    backoff = Backoff()
    waiting = OutageLog("dependency")
    while True:
        try:
            resources = await Resources.open(settings, publish=publish, purchase=purchase)
        except Exception as exc:
            if not is_outage(exc):
                raise
            waiting.failed(exc, store=outage_of(exc))
            if await wait_or_stop(stop, backoff.next()):
                return None
            continue
        waiting.recovered()
        return resources


@asynccontextmanager
async def opened_when_reachable(
    settings: Settings, *, publish: bool = True, purchase: bool = False
) -> AsyncIterator[Resources | None]:
    """``async with opened_when_reachable(settings) as resources``: for a long-running command
    started while a store may be away (``consume``, ``realign --watch``, ``sweep --watch``):
    :func:`open_when_reachable` until SIGTERM/SIGINT (then ``resources`` is None: stop at once),
    closed on exit."""
    with stop_signal() as stop:
        resources = await open_when_reachable(settings, stop, publish=publish, purchase=purchase)
    try:
        yield resources
    finally:
        if resources is not None:
            await resources.close()


class BackgroundResources:
    """The API worker's resources, opened in a task of their own so that a worker starts (and
    answers ``/health/live``, and ``/health/ready`` 503) while Redis or RabbitMQ is away:
    granian never sees a start-up failure, so there is no crash loop. The task tries
    :meth:`Resources.open` with back-off (0.5 s doubling to :data:`OPEN_BACKOFF_CAP` s), one
    log line when the wait begins and one when it ends. ``current`` is None until it succeeds;
    meanwhile ``reachable`` says which stores answered the last attempt (for readiness).
    ``on_no_shard``: called when an attempt (the first or a background one) finds every
    order-number shard leased (the API stops its server: :func:`service.api.no_shard.stop_server`)."""

    OPEN_BACKOFF_CAP = 3.0
    OPEN_TIMEOUT = 15.0

    def __init__(
        self,
        settings: Settings,
        *,
        publish: bool = True,
        purchase: bool = True,
        on_no_shard: Callable[[ShardsExhausted], None] | None = None,
    ) -> None:
        self._settings = settings
        self._publish = publish
        self._purchase = purchase
        self._on_no_shard = on_no_shard
        self.current: Resources | None = None
        self.reachable: dict[str, bool] = {"redis": False, "rabbitmq": False, "mysql": False}
        self._task: asyncio.Task[None] | None = None
        self._waiting = OutageLog("dependency", process="api")

    async def start(self) -> None:
        """Try once now (at most :data:`OPEN_TIMEOUT` seconds: a worker whose stores answer
        starts ready, as before); if that fails, go on trying in a background task. Never
        raises for a store that fails.

        Raises:
            ShardsExhausted: every order-number shard is leased (no outage: waiting frees none),
                after ``on_no_shard`` was told; met later, it ends the background task the same way.
        """
        if await self._attempt():
            return
        self._task = asyncio.create_task(self._keep_trying())

    async def _attempt(self) -> bool:
        try:
            self.current = await asyncio.wait_for(
                Resources.open(self._settings, publish=self._publish, purchase=self._purchase), self.OPEN_TIMEOUT
            )
        except ShardsExhausted as exc:  # not an outage: waiting frees no shard
            if self._on_no_shard is not None:
                self._on_no_shard(exc)
            raise
        except Exception as exc:  # an API worker keeps trying whatever else failed: its readiness says so
            self._waiting.failed(exc, store=outage_of(exc) or "unknown")
            with contextlib.suppress(Exception):
                found = await probe_dependencies(self._settings)
                self.reachable = {name: error is None for name, error in found.items()}
            return False
        self._waiting.recovered()
        return True

    async def _keep_trying(self) -> None:
        backoff = Backoff(cap=self.OPEN_BACKOFF_CAP)
        while not await self._attempt():
            await asyncio.sleep(backoff.next())

    async def close(self) -> None:
        """Stop opening; close what was opened."""
        if self._task is not None:
            await stop_task(self._task)
        if self.current is not None:
            await self.current.close()
            self.current = None


async def report_dependencies(settings: Settings) -> list[str]:
    """``flashsale serve``'s start-up check: every store asked once (:func:`probe_dependencies`);
    one line per store that is away (what, where, which variable, why), returned for the caller
    to print; the API starts all the same and its readiness says 503 until they answer.

    Raises:
        DependencyUnreachable: a store refused as configured (wrong credentials, unknown
            database): the first such one.
    """
    away = []
    for error in (await probe_dependencies(settings)).values():
        if error is None:
            continue
        if not is_outage(error):
            raise error
        away.append(str(error))
    return away
