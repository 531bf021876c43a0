"""Auto-pipelining: Redis commands issued at the same time by many requests share one round trip.

Used by :class:`~service.adapters.redis.stock_store.StockStore` for the hot path (the reserve
script and the mark-queued writes). Each request still gets its own reply or error; what it
saves is the round trip (a socket write and read, the dominant CPU cost per call) for all but
one of the commands that were waiting together.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.exceptions import ConnectionError

from service.adapters.redis.client import RedisClient

MAX_BATCH = 512
"""Commands per pipeline at most; more wait for the next one."""

Command = tuple[Any, ...]
"""A Redis command as ``execute_command`` takes it: ``("HSET", key, field, value)``."""


class CommandBatcher:
    """Queues commands from concurrent callers and sends them as non-transactional pipelines.

    While no pipeline is in flight, a command leaves on the next turn of the event loop (no
    added wait); while one is in flight, new commands gather and leave together as soon as it
    returns. One pipeline is in flight at a time, so the hot path holds one pooled connection.
    Commands are sent in the order they were queued; a pipeline is not atomic.
    """

    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis
        self._queue: list[tuple[Command, asyncio.Future[Any]]] = []
        self._flusher: asyncio.Task[None] | None = None

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
                try:
                    async with self._redis.pipeline(transaction=False) as pipe:
                        for command, _ in batch:
                            pipe.execute_command(*command)
                        replies = await pipe.execute(raise_on_error=False)
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


def _fail(batch: list[tuple[Command, asyncio.Future[Any]]], exc: BaseException) -> None:
    for _, future in batch:
        if not future.done():
            future.set_exception(exc)
