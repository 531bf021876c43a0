"""Publishing off the request path (``FLASHSALE_ORDERS__PUBLISH_MODE=async``), confirms awaited in batches.

The API answers 202 once the reservation is in Redis; the reservation journal is the outbox.
This publisher only makes the message reach RabbitMQ soon: it never gives a reservation back.
What it cannot deliver (the process dies, or the broker stays down past shutdown) stays in the
journal, and realignment publishes it again after its grace period.
"""

from __future__ import annotations

import asyncio

import structlog

from service.adapters.broker import Publisher
from service.model.order_message import OrderMessage
from service.runtime import stop_task

log = structlog.get_logger(__name__)

BATCH = 128
"""Messages published before their confirms are awaited together."""
MAX_QUEUED = 100_000
"""Messages held in memory at most; beyond it a message is left to realignment (logged)."""
RETRY_FIRST = 0.1
RETRY_MAX = 5.0
"""Seconds between tries after a failed batch: doubling from the first to the max."""


class BackgroundPublisher:
    """One task per process draining an in-memory queue onto the confirming :class:`Publisher`.

    The task takes up to :data:`BATCH` queued messages, publishes them all and awaits their
    publisher confirms together (one round of confirms instead of one wait per message; the
    publisher puts the orders of one queue into groups, :mod:`service.adapters.publish_groups`). A
    message that was not confirmed (nack, unroutable, timeout, connection down) is queued again
    and retried after a backoff; the consumer's ``UNIQUE(request_id)`` makes a second copy
    harmless. Call :meth:`start` inside the event loop, :meth:`close` on shutdown.
    """

    def __init__(self, publisher: Publisher) -> None:
        self._publisher = publisher
        self._queue: asyncio.Queue[OrderMessage] = asyncio.Queue()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._in_flight = 0

    def start(self) -> None:
        """Start the draining task."""
        self._task = asyncio.create_task(self._run())

    def submit(self, message: OrderMessage) -> None:
        """Queue ``message`` for publishing; returns at once, never raises (a full queue leaves
        the message to realignment)."""
        if self._queue.qsize() >= MAX_QUEUED:
            log.error("background_publish_queue_full", request_id=message.request_id)
            return
        self._idle.clear()
        self._queue.put_nowait(message)

    @property
    def pending(self) -> int:
        """Messages not confirmed yet: waiting, being retried, or in the batch in flight."""
        return self._queue.qsize() + self._in_flight

    async def _run(self) -> None:
        backoff = RETRY_FIRST
        while True:
            batch = [await self._queue.get()]
            while len(batch) < BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            self._in_flight = len(batch)
            results = await asyncio.gather(*(self._publisher.publish(m) for m in batch), return_exceptions=True)
            self._in_flight = 0
            failed = [message for message, result in zip(batch, results, strict=True) if result is not None]
            for message in failed:
                self._queue.put_nowait(message)
            if failed:
                log.warning("background_publish_retry", failed=len(failed), retry_in=backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RETRY_MAX)
            else:
                backoff = RETRY_FIRST
            if self._queue.empty():
                self._idle.set()

    async def close(self, flush_seconds: float) -> None:
        """Publish what is queued (waiting up to ``flush_seconds``), then stop the task. What is
        still unconfirmed then is logged and left to realignment."""
        if self._task is None:
            return
        try:
            async with asyncio.timeout(flush_seconds):
                await self._idle.wait()
        except TimeoutError:
            log.warning("background_publish_unflushed", left=self.pending)
        await stop_task(self._task)
        self._task = None
