"""The composition root: every entry point (API lifespan, consumer, realignment, sweep, product
set, the sale, scripts/) opens its connections and builds its use cases here, once per process
(no per-request set-up), and closes them here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

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


@dataclass
class Resources:
    """Everything one process holds: connections and the use cases built on them.

    ``publisher`` is None when opened with ``publish=False``; ``lease`` and ``purchases`` are None
    unless opened with ``purchase=True`` (only the API mints order numbers); ``background`` is set
    only for purchases in publish mode ``async``. ``sold_out`` is the purchase path's sold-out
    flags (with ``purchase=True`` and ``sold_out_flag_seconds`` > 0), kept current by a task that
    follows the restock announcements until :meth:`close`.
    """

    settings: Settings
    engine: AsyncEngine
    store: RedisStores
    publisher: Publisher | None
    lease: ShardLease | None
    purchases: PurchaseService | None
    background: BackgroundPublisher | None
    realigner: Realigner
    orders: OrderService
    catalog: CatalogService
    payments: PaymentService
    channels: ChannelClient
    checkout: Checkout
    reconciler: Reconciler
    sold_out: SoldOutFlags | None = None
    recovery: Recovery | None = None
    eviction: EvictionPolicy | None = None
    """Redis's ``maxmemory-policy``, read at start and refreshed by the readiness probe."""
    _follower: asyncio.Task[None] | None = field(default=None, repr=False)
    _rebalancer: Rebalancer | None = field(default=None, repr=False)

    @classmethod
    async def open(cls, settings: Settings, *, publish: bool = True, purchase: bool = True) -> Resources:
        """Connect to MySQL and Redis, load the scripts; with ``publish`` connect to RabbitMQ, with
        ``purchase`` (needs ``publish``) lease an order-number shard for the purchase path.

        Raises whatever the first unreachable store raises (nothing stays open then).
        """
        engine = make_engine(settings.db.url, pool_size=settings.db.pool_size, max_overflow=settings.db.max_overflow)
        store = make_stores(settings)
        publisher = lease = purchases = background = sold_out = follower = recovery = rebalancer = None
        eviction = store.eviction_policy()
        try:
            await store.scripts.load()
            await eviction.check()
            if publish:
                publisher = Publisher(settings.amqp)
                await publisher.connect()
            realigner = Realigner(engine, store, settings.realign.grace_seconds, publisher)
            if purchase and publisher is not None:
                recovery = _recovery(settings, engine, store, realigner)
                lease = ShardLease(store, settings.orders.shard_lease_seconds)
                await lease.start()
                minter = OrderNumberMinter(
                    store,
                    lease,
                    settings.orders.order_no_prefix,
                    ShardGenerations(engine),
                    block=settings.orders.sequence_block,
                )
                if settings.orders.publish_mode == "async":
                    background = BackgroundPublisher(publisher)
                    background.start()
                sold_out, follower = _follow_sold_out(store, settings.orders.sold_out_flag_seconds)
                rebalancer = Rebalancer(realigner)
                purchases = PurchaseService(
                    store,
                    minter,
                    publisher,
                    engine=engine,
                    background=background,
                    sold_out=sold_out,
                    token_ttl_seconds=settings.orders.token_ttl_seconds,
                    database_minter=MysqlOrderNumberMinter(
                        engine, settings.orders.order_no_prefix, block=settings.orders.sequence_block
                    ),
                    not_loaded=None if recovery is None else recovery.not_loaded,
                    rebalance=rebalancer,
                )
                if recovery is not None:
                    recovery.start()
        except BaseException:
            await _close(settings, engine, store, publisher, lease, background, follower, recovery)
            raise
        payment = settings.payment
        channels = make_channel_client(settings)
        payments = PaymentService(engine, store, payment.channel_secrets, payment.currency, channels)
        checkout = Checkout(engine, store, channels, payments, payment.currency, payment.notify_url)
        return cls(
            settings=settings,
            engine=engine,
            store=store,
            publisher=publisher,
            lease=lease,
            purchases=purchases,
            background=background,
            realigner=realigner,
            orders=OrderService(engine, store, checkout.may_cancel),
            catalog=CatalogService(engine, store, realigner),
            payments=payments,
            channels=channels,
            checkout=checkout,
            reconciler=Reconciler(engine, channels, payments, payment.currency),
            sold_out=sold_out,
            recovery=recovery,
            eviction=eviction,
            _follower=follower,
            _rebalancer=rebalancer,
        )

    @property
    def purchase_service(self) -> PurchaseService:
        """The purchase path; only a process opened with ``purchase=True`` (the API) has one.

        Raises:
            RuntimeError: opened without ``purchase=True``.
        """
        if self.purchases is None:
            raise RuntimeError("this process was opened without the purchase path")
        return self.purchases

    async def close(self) -> None:
        """Stop following restocks, publish what the background publisher holds (up to
        ``confirm_timeout`` seconds; the rest is left to realignment), release the shard lease and
        close every connection."""
        await self.channels.aclose()
        if self._rebalancer is not None:
            await self._rebalancer.aclose()
        await _close(
            self.settings,
            self.engine,
            self.store,
            self.publisher,
            self.lease,
            self.background,
            self._follower,
            self.recovery,
        )


def _recovery(settings: Settings, engine: AsyncEngine, store: RedisStores, realigner: Realigner) -> Recovery | None:
    """The API process's self-healing task (not started; None when ``auto_seconds`` is 0), which
    also drops dead-lettered copies of orders that landed since."""
    if settings.realign.auto_seconds <= 0:
        return None
    dead_letters = DeadLetterService(DeadLetterQueue(settings.amqp), engine, store, realigner)
    return Recovery(realigner, store, settings.realign.auto_seconds, after_pass=dead_letters.drop_landed)


def _follow_sold_out(store: RedisStores, ttl_seconds: float) -> tuple[SoldOutFlags | None, asyncio.Task[None] | None]:
    """The purchase path's sold-out flags (None when ``ttl_seconds`` is 0) and the task that keeps
    them current: this store's own restocks clear them before the call returns, every other
    process's through the restock channel (flags are raised only while it is followed)."""
    if ttl_seconds <= 0:
        return None, None
    flags = SoldOutFlags(ttl_seconds)
    store.restocks.on_restock(flags.restocked)
    follower = asyncio.create_task(store.restocks.follow(flags.restocked, flags.following, flags.lost))
    return flags, follower


async def _close(
    settings: Settings,
    engine: AsyncEngine,
    store: RedisStores,
    publisher: Publisher | None,
    lease: ShardLease | None,
    background: BackgroundPublisher | None,
    follower: asyncio.Task[None] | None = None,
    recovery: Recovery | None = None,
) -> None:
    if recovery is not None:
        await recovery.stop()
    if follower is not None:
        await stop_task(follower)
    if background is not None:
        await background.close(settings.amqp.confirm_timeout)
    if lease is not None:
        await lease.stop()
    if publisher is not None:
        await publisher.close()
    await store.aclose()
    await engine.dispose()


@asynccontextmanager
async def opened(settings: Settings, *, publish: bool = True, purchase: bool = False) -> AsyncIterator[Resources]:
    """``async with opened(settings) as resources``: :meth:`Resources.open`, closed on exit."""
    resources = await Resources.open(settings, publish=publish, purchase=purchase)
    try:
        yield resources
    finally:
        await resources.close()


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
