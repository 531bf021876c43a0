"""The Redis client of a process (:func:`make_redis`): one server (``redis.asyncio.Redis``) or a
Redis Cluster (``redis.asyncio.cluster.RedisCluster``, chosen by ``FLASHSALE_REDIS__CLUSTER``),
with tuned connections (:class:`_Tuned`).

Every key of one script call shares a hash tag (:mod:`.keys`), so both run every command the
same way. Of the commands about a server rather than a key, ``SCRIPT LOAD``/``SCRIPT EXISTS``
go to every master (redis-py's cluster client), pub/sub works on any node (a cluster delivers
every ``PUBLISH`` to every node) and ``CONFIG GET`` is asked of every master here.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import hiredis
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.connection import HiredisRespSerializer
from redis.exceptions import ConnectionError, RedisClusterException
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.maint_notifications import MaintNotificationsConfig
from redis.typing import EncodableT

from service.settings import Settings

RedisClient = Redis | RedisCluster
"""A client of one Redis server or of a Redis Cluster (decoding responses)."""


class ClusterClient(RedisCluster):
    r"""redis-py's ``RedisCluster`` whose "cannot reach the cluster" errors are Redis
    ``ConnectionError``\ s, as one unreachable server's are: redis-py raises
    ``RedisClusterException`` (not a ``RedisError``) when no node it knows answers the slot map
    (at start, or after a node failed), which the start-up check, reading the raw client's
    error, would otherwise not recognise as Redis unreachable (it names the URL)."""

    async def initialize(self, *args: Any, **kwargs: Any) -> ClusterClient:
        try:
            await super().initialize(*args, **kwargs)
        except RedisClusterException as exc:
            raise ConnectionError(f"Redis Cluster unreachable: {exc}") from exc
        return self

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().execute_command(*args, **kwargs)
        except RedisClusterException as exc:
            raise ConnectionError(f"Redis Cluster unreachable: {exc}") from exc


async def config_values(redis: RedisClient, parameter: str) -> list[str | None]:
    """``CONFIG GET parameter`` of the server, or of every master of a cluster (one value each,
    None where the server does not know the parameter).

    Raises:
        redis.exceptions.ResponseError: ``CONFIG`` renamed away or denied (NOPERM).
    """
    if isinstance(redis, RedisCluster):
        answers = cast(dict[str, Any], await redis.config_get(parameter, target_nodes=RedisCluster.PRIMARIES))
        # several nodes: {node name: reply}; a one-master cluster: the reply itself
        replies = [answers] if parameter in answers else list(answers.values())
    else:
        replies = [cast(dict[str, Any], await redis.config_get(parameter))]
    return [_text(reply.get(parameter)) for reply in replies]


def _text(value: object) -> str | None:
    return value.decode() if isinstance(value, bytes) else None if value is None else str(value)


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
    names (or, when it does not answer, from ``FLASHSALE_REDIS__CLUSTER_NODES``) and sends each
    command to the master of its key's slot (following MOVED/ASK).

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
    others = [node.rpartition(":") for node in settings.redis.cluster_nodes]
    cluster: ClusterClient = ClusterClient.from_url(  # type: ignore[assignment]  # from_url is typed as the base class's
        settings.redis.url,
        startup_nodes=[ClusterNode(host, int(port)) for host, _, port in others] or None,
        retry=Retry(NoBackoff(), 0),
        **_connection_options(settings),
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
    hiredis); ``hiredis.pack_command`` called directly is several times faster per reserve
    EVALSHA (docs/BENCHMARKS.md), byte for byte the same protocol
    (RESP, https://redis.io/docs/latest/develop/reference/protocol-spec/).
    """

    _PING_RETRY = Retry(NoBackoff(), 1, supported_errors=(ConnectionError, RedisTimeoutError))
    _SERIALIZER = HiredisRespSerializer()  # type: ignore[no-untyped-call,unused-ignore]  # untyped from redis 8.2

    async def check_health(self) -> None:
        if self.health_check_interval and asyncio.get_running_loop().time() > self.next_health_check:
            await self._PING_RETRY.call_with_retry(self._send_ping, self._ping_failed, with_failure_count=True)

    def pack_command(self, *args: EncodableT) -> list[bytes]:
        first = args[0]
        if (isinstance(first, str) and " " in first) or (isinstance(first, bytes) and b" " in first):
            args = (*first.split(), *args[1:])  # a command name of several words ("CLIENT KILL")
        try:
            # hiredis directly: redis-py's serializer first walks the arguments in Python to turn
            # bytearray/memoryview into bytes
            return [hiredis.pack_command(args)]  # type: ignore[arg-type]  # TypeError is handled below
        except TypeError:  # a bytearray or memoryview argument (or a type Redis cannot take)
            packed: list[bytes] = self._SERIALIZER.pack(*args)  # type: ignore[arg-type]  # redis-py hints args as lists
            return packed


def _tuned(connection_class: type[AbstractConnection]) -> type[AbstractConnection]:
    """``connection_class`` (TCP, TLS or Unix socket, as the URL chose) with :class:`_Tuned`'s
    health check and packing."""
    return type(f"Tuned{connection_class.__name__}", (_Tuned, connection_class), {})
