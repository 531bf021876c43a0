"""Auto-pipelining: Redis commands issued at the same time by many requests share one round trip.

Used by :class:`~service.adapters.redis.reservations.Reservations` for the hot path (the reserve
script and the mark-queued writes). Each request still gets its own reply or error; what it
saves is the round trip (a socket write and read, the dominant CPU cost per call) for all but
one of the commands that were waiting together.

On one Redis server the batcher keeps a connection of its own and bounds each whole round trip
by one deadline (the client's ``socket_timeout``). redis-py's pipeline on a pooled connection
took a pool checkout, a ``wait_for`` task for the write and an ``asyncio.timeout`` for every
reply read: together more than a third of the batcher's CPU in the accept path's profile
(docs/BENCHMARKS.md). The connection is redis-py's own (same class, options, hiredis packing
and parser, idle health check); only the per-read timers are replaced by the one deadline. On a
Redis Cluster the cluster client's pipeline splits the batch by node. The deadline counts the
time the process could have read the replies: one that passes while the event loop was stalled
is put off by the stall (:class:`_Deadline`), so a starved process does not answer ``503`` for a
Redis that answered in time.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from service.adapters.redis.client import RedisClient

MAX_BATCH = 512
"""Commands per pipeline at most; more wait for the next one."""

LATE_SECONDS = 0.05
"""A deadline check that runs this much later than due found the event loop blocked or starved
(a long synchronous call, a GC pause, a CPU-starved process): replies may be waiting unread."""

Command = tuple[Any, ...]
"""A Redis command as ``execute_command`` takes it: ``("HSET", key, field, value)``."""


class CommandBatcher:
    """Queues commands from concurrent callers and sends them as non-transactional pipelines.

    While no pipeline is in flight, a command leaves on the next turn of the event loop (no
    added wait); while one is in flight, new commands gather and leave together as soon as it
    returns. One pipeline is in flight at a time, on one connection. Commands are sent in the
    order they were queued; a pipeline is not atomic. Replies are the server's (decoded as the
    client decodes), without redis-py's per-command response callbacks (``SET`` answers
    ``"OK"``, not ``True``).
    """

    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis
        self._queue: list[tuple[Command, asyncio.Future[Any]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._connection: AbstractConnection | None = None
        self._deadline: float | None = None
        if isinstance(redis, Redis):
            pool = redis.connection_pool
            options = pool.connection_kwargs
            self._deadline = options.get("socket_timeout")
            # The deadline covers the whole round trip, so the connection sets no timer of its own.
            self._connection = pool.connection_class(**{**options, "socket_timeout": None})

    async def aclose(self) -> None:
        """Close the batcher's own connection (the client's pool is the client's to close)."""
        if self._connection is not None:
            await self._connection.disconnect()

    async def call(self, *command: Any) -> Any:
        """Send one command; returns its reply.

        Raises:
            redis.exceptions.ResponseError: Redis rejected this command (e.g. NOSCRIPT).
            redis.exceptions.RedisError, OSError: the round trip failed (the command may or may
                not have run).
        """
        return (await self.call_many(command))[0]

    async def call_many(self, *commands: Command) -> list[Any]:
        """Send ``commands`` in the same pipeline, in order; returns their replies.

        Raises: as :meth:`call`, the first error among the commands.
        """
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in commands]
        self._queue.extend(zip(commands, futures, strict=True))
        if self._flusher is None:
            self._flusher = loop.create_task(self._flush())
        return [await future for future in futures]

    async def _flush(self) -> None:
        batch: list[tuple[Command, asyncio.Future[Any]]] = []
        try:
            while self._queue:
                batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                commands = [command for command, _ in batch]
                try:
                    if self._connection is None:
                        replies = await self._cluster_round_trip(commands)
                    else:
                        replies = await self._round_trip(self._connection, commands)
                except Exception as exc:  # the whole round trip failed: every caller hears it
                    _fail(batch, exc)
                    continue
                for (_, future), reply in zip(batch, replies, strict=True):
                    if future.done():  # the caller gave up (cancelled)
                        continue
                    if isinstance(reply, Exception):
                        future.set_exception(reply)
                    else:
                        future.set_result(reply)
        except BaseException as exc:  # cancelled (shutdown): nobody may wait forever
            _fail([*batch, *self._queue], ConnectionError(f"Redis batch abandoned: {exc!r}"))
            self._queue = []
            raise
        finally:
            self._flusher = None

    async def _round_trip(self, connection: AbstractConnection, commands: list[Command]) -> list[Any]:
        """One write of every command and the read of every reply, within the deadline. A
        connection the server closed while it was idle is replaced before the write; one that
        fails mid-way is closed by redis-py (on any error, the cancellation of the deadline
        included), so the next round trip connects afresh.

        Raises:
            redis.exceptions.TimeoutError: the deadline passed (the commands may have run).
            redis.exceptions.ConnectionError: the socket failed.
        """
        replies: list[Any] = []
        try:
            async with asyncio.timeout(None) as scope:
                deadline = _Deadline(scope, self._deadline) if self._deadline is not None else None
                try:
                    await self._exchange(connection, commands, replies)
                finally:
                    if deadline is not None:
                        deadline.cancel()
        except TimeoutError as exc:
            await connection.disconnect(nowait=True)
            raise RedisTimeoutError(f"Redis round trip of {len(commands)} commands timed out") from exc
        return replies

    @staticmethod
    async def _exchange(connection: AbstractConnection, commands: list[Command], replies: list[Any]) -> None:
        """Write ``commands`` and read their replies into ``replies`` (an error reply as its
        exception)."""
        if connection.is_connected and await connection.can_read():
            # As the pool checks a connection it hands out: data or EOF waiting on an idle
            # connection (the server closed it: CLIENT KILL, a restart, a NAT reset), so
            # nothing of this batch has been sent on it yet. Connect afresh.
            await connection.disconnect()
        await connection.send_packed_command(connection.pack_commands(commands))
        for _ in commands:
            try:
                replies.append(await connection.read_response())
            except ResponseError as exc:  # this command's error reply; the stream is intact
                replies.append(exc)

    async def _cluster_round_trip(self, commands: list[Command]) -> list[Any]:
        async with self._redis.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            replies: list[Any] = await pipe.execute(raise_on_error=False)
        return replies


class _Deadline:
    """Expires ``scope`` after ``seconds`` of time in which this process could have read the
    replies. A check that runs late (by more than :data:`LATE_SECONDS`) means the event loop did
    not run meanwhile, so replies that Redis sent in time may be waiting unread: the deadline is
    put off by that lateness, at most ``seconds`` in all, rather than blaming Redis for the
    process's own stall (a ``503`` for a Redis that answered in microseconds).
    """

    __slots__ = ("_handle", "_loop", "_scope", "_spare")

    def __init__(self, scope: asyncio.Timeout, seconds: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._scope = scope
        self._spare = seconds
        due = self._loop.time() + seconds
        self._handle = self._loop.call_at(due, self._check, due)

    def _check(self, due: float) -> None:
        now = self._loop.time()
        late = now - due
        if late > LATE_SECONDS and self._spare > 0:
            put_off = min(late, self._spare)
            self._spare -= put_off
            self._handle = self._loop.call_at(now + put_off, self._check, now + put_off)
            return
        self._scope.reschedule(now)

    def cancel(self) -> None:
        self._handle.cancel()


def _fail(batch: list[tuple[Command, asyncio.Future[Any]]], exc: BaseException) -> None:
    for _, future in batch:
        if not future.done():
            future.set_exception(exc)
