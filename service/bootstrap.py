"""The composition root: every entry point (API lifespan, consumer, realignment, sweep, product
set, the sale, scripts/) opens its connections and builds its use cases here, once per process
(no per-request set-up), and closes them here. Waiting for stores that are away at start-up is
:mod:`service.startup`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import hiredis
import httpx
import structlog
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.connection import HiredisRespSerializer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.maint_notifications import MaintNotificationsConfig
from redis.typing import EncodableT
from sqlalchemy.ext.asyncio import AsyncEngine

from db.engine import make_engine
from service.adapters.background_publisher import BackgroundPublisher
from service.adapters.broker import Publisher
from service.adapters.channel_client import ChannelClient
from service.adapters.dead_letters import DeadLetterQueue
from service.adapters.redis.client import ClusterClient, RedisClient
from service.adapters.redis.eviction import EvictionPolicy
from service.adapters.redis.stock_store import RateLimits, StockStore
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
from service.runtime import stop_task
from service.settings import Settings

log = structlog.get_logger(__name__)


def make_redis(settings: Settings) -> RedisClient:
    """One pooled Redis client per process (strings decoded as UTF-8); a ``RedisCluster`` when
    ``FLASHSALE_REDIS__CLUSTER`` is set (:func:`_make_cluster`).

    The pool blocks (up to 5 s) when all ``max_connections`` are busy instead of failing the
    request, so a stampede queues for a connection rather than turning into 503s.

    Dead and stalled connections: ``socket_timeout`` bounds every reply (a stalled Redis costs a
    request at most that long, then 503; the purchase path gives back what a failed reserve may
    hold), ``connect_timeout`` every connect; TCP keepalive finds peers that vanished; a
    connection idle longer than ``health_check_interval`` is PINGed before its next command and,
    when the PING fails (cut by a NAT/firewall timeout or ``CLIENT KILL``), re-opened once.

    Retries, on purpose only there: the PING is idempotent and is sent *before* the command, so
    re-opening after a failed PING cannot run anything twice. The commands themselves are never
    retried (no ``Retry`` on the client): a ``ConnectionError``/``TimeoutError`` on a command
    does not say whether Redis ran it, and re-sending a reserve EVALSHA that did run would
    answer ``in_flight`` for the caller's own request (and hold its stock until realignment);
    the callers know what a failure means for them (the purchase path releases and answers 503).
    A connection the server closed while it sat in the pool (``CLIENT KILL``, a NAT or firewall
    that resets it, a Redis restart) is caught before use by the pool itself: it checks the socket
    for EOF or stray data and reconnects. redis-py skips that check whenever maintenance
    notifications are on, and its default (``"auto"``) counts as on even over RESP2, where the
    feature (a Redis Enterprise/Cloud one) cannot work; so they are turned off here.
    """
    redis = settings.redis
    if redis.cluster:
        return _make_cluster(settings)
    pool = BlockingConnectionPool.from_url(redis.url, timeout=5, **_connection_options(settings))
    pool.connection_class = _tuned(pool.connection_class)
    return Redis.from_pool(pool)


def _connection_options(settings: Settings) -> dict[str, Any]:
    """What every Redis connection gets, of one server or of a cluster node (:func:`make_redis`):
    the pool size, UTF-8 strings, the timeouts (seconds), TCP keepalive, the idle health check,
    maintenance notifications off."""
    redis = settings.redis
    return {
        "max_connections": redis.max_connections,
        "decode_responses": True,
        "socket_timeout": redis.socket_timeout,
        "socket_connect_timeout": redis.connect_timeout,
        "socket_keepalive": True,
        "health_check_interval": redis.health_check_interval,
        "maint_notifications_config": MaintNotificationsConfig(enabled=False),
    }


def _make_cluster(settings: Settings) -> ClusterClient:
    """A Redis Cluster client that discovers the cluster from the node ``FLASHSALE_REDIS__URL``
    names and sends each command to the master of its key's slot (following MOVED/ASK).

    Kept from :func:`make_redis`: the same timeouts, TCP keepalive, maintenance notifications
    off, and :class:`_Tuned` connections (idle-time health check with one re-open, hiredis
    packing): redis-py's cluster client takes no ``connection_class``, so it is set in the
    connection options every node is built from, before the first command discovers them.
    Commands are not retried on a connection error or timeout (``Retry`` with 0 retries; redis-py's
    cluster default retries 3 times, which could run a reserve twice, see :func:`make_redis`);
    MOVED/ASK redirections are followed all the same.

    An unreachable cluster raises a Redis ``ConnectionError`` (:class:`ClusterClient`).

    Differs: each node has its own pool of ``max_connections``, which fails at once
    (``MaxConnectionsError``, the request answers 503) instead of blocking when all are busy:
    redis-py's cluster client has no blocking pool. Pipelines are split by node
    (``ClusterPipeline``: one round trip per node).
    """
    cluster: ClusterClient = ClusterClient.from_url(  # type: ignore[assignment]  # from_url is typed as the base class's
        settings.redis.url, retry=Retry(NoBackoff(), 0), **_connection_options(settings)
    )
    options = cluster.nodes_manager.connection_kwargs
    options["connection_class"] = _tuned(options["connection_class"])
    for node in cluster.nodes_manager.startup_nodes.values():
        node.connection_class = options["connection_class"]
    return cluster


class _Tuned(AbstractConnection):
    """A connection whose idle-time health check re-opens the connection once and PINGs again
    when the PING fails (the command that follows is sent only on a connection that answered),
    and whose commands are packed by hiredis.

    redis-py's asyncio connection packs every command in Python (its sync client already uses
    hiredis): ~20 us per EVALSHA of the reserve script on the 2-core box, measured with
    ``timeit``, against ~8 us with the sync client's own ``HiredisRespSerializer`` and ~6 us
    (18 against 5.7 on a slower day) with ``hiredis.pack_command`` called directly; byte for
    byte the same protocol (RESP, https://redis.io/docs/latest/develop/reference/protocol-spec/).
    """

    _PING_RETRY = Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError, RedisTimeoutError))
    _SERIALIZER = HiredisRespSerializer()

    async def check_health(self) -> None:
        if self.health_check_interval and asyncio.get_running_loop().time() > self.next_health_check:
            await self._PING_RETRY.call_with_retry(self._send_ping, self._ping_failed, with_failure_count=True)

    def pack_command(self, *args: EncodableT) -> list[bytes]:
        first = args[0]
        if (isinstance(first, str) and " " in first) or (isinstance(first, bytes) and b" " in first):
            args = (*first.split(), *args[1:])  # a command name of several words ("CLIENT KILL")
        try:
            # hiredis directly: redis-py's serializer first walks the arguments in Python to turn
            # bytearray/memoryview into bytes (~12 us more per reserve EVALSHA on the 2-core box)
            return [hiredis.pack_command(args)]  # type: ignore[arg-type]  # TypeError is handled below
        except TypeError:  # a bytearray or memoryview argument (or a type Redis cannot take)
            packed: list[bytes] = self._SERIALIZER.pack(*args)  # type: ignore[arg-type]  # redis-py hints args as lists
            return packed


def _tuned(connection_class: type[AbstractConnection]) -> type[AbstractConnection]:
    """``connection_class`` (TCP, TLS or Unix socket, as the URL chose) with :class:`_Tuned`'s
    health check and packing."""
    return type(f"Tuned{connection_class.__name__}", (_Tuned, connection_class), {})


def make_store(settings: Settings) -> StockStore:
    """A :class:`StockStore` on a new :func:`make_redis` client, with the run's key prefix and
    replay TTL (scripts registered, not yet loaded: call ``load()`` where the hot path follows)."""
    limits = settings.rate_limit
    return StockStore(
        make_redis(settings),
        settings.redis.key_prefix,
        replay_ttl_seconds=settings.orders.replay_ttl_seconds,
        rate_limits=RateLimits(
            limits.user_per_second, limits.user_burst, limits.address_per_second, limits.address_burst
        ),
    )


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
    store: StockStore
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
        store = make_store(settings)
        publisher = lease = purchases = background = sold_out = follower = recovery = rebalancer = None
        eviction = store.eviction_policy()
        try:
            await store.load()
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


def _recovery(settings: Settings, engine: AsyncEngine, store: StockStore, realigner: Realigner) -> Recovery | None:
    """The API process's self-healing task (not started; None when ``auto_seconds`` is 0), which
    also drops dead-lettered copies of orders that landed since."""
    if settings.realign.auto_seconds <= 0:
        return None
    dead_letters = DeadLetterService(DeadLetterQueue(settings.amqp), engine, store, realigner)
    return Recovery(realigner, store, settings.realign.auto_seconds, after_pass=dead_letters.drop_landed)


def _follow_sold_out(store: StockStore, ttl_seconds: float) -> tuple[SoldOutFlags | None, asyncio.Task[None] | None]:
    """The purchase path's sold-out flags (None when ``ttl_seconds`` is 0) and the task that keeps
    them current: this store's own restocks clear them before the call returns, every other
    process's through the restock channel (flags are raised only while it is followed)."""
    if ttl_seconds <= 0:
        return None, None
    flags = SoldOutFlags(ttl_seconds)
    store.on_restock(flags.restocked)
    follower = asyncio.create_task(store.follow_restocks(flags.restocked, flags.following, flags.lost))
    return flags, follower


async def _close(
    settings: Settings,
    engine: AsyncEngine,
    store: StockStore,
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
