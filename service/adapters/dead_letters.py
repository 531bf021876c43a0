"""The dead-letter queue, as the operator sees it: read its messages without losing them, put
chosen ones back on the order queue (redrive), or drop them. One dead-letter queue serves every
partition of the order queues; a redriven order goes to its product's partition.

Every operation takes the whole queue on one channel of its own (``basic.get``, unacked, at most
``limit`` messages), settles the chosen messages and puts the others back (nack, requeue; a
connection that drops does the same). Nothing is held between calls, so a message is never
lost by an operator who stops halfway.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage
from aio_pika.exceptions import CONNECTION_EXCEPTIONS, AMQPError

from service.adapters import retry_routing
from service.adapters.broker_connection import connect_once
from service.adapters.broker_topology import declare_topology, partition_of_body, queue_depth
from service.failures import PublishFailed
from service.settings import AMQPSettings

RETURN_PATIENCE_SECONDS = 5.0
"""How long an operation waits to see the messages it put back in the queue again."""
DEFAULT_LIMIT = 10_000
"""Messages one operation looks at, at most (they are held unacked, in memory, meanwhile)."""

_DROPPED_ON_REDRIVE = ("x-delivery-count", retry_routing.RETRIES)
"""Headers that belong to one trip through the order queue (and its retry queues); x-death and
the consumer's death count are kept, so a message that dies again shows how often it died."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One message in the dead-letter queue.

    ``id``: its AMQP ``message_id`` (the order's request id) or, for a message without one,
    ``sha256:`` + the first 16 hex digits of its body's SHA-256. For a message the consumer
    dead-lettered (:mod:`service.adapters.retry_routing`), ``reason`` is the consumer's
    (``invalid_order``, ``unknown_product``, ``order_no_conflict``, ``write_failed``), ``count``
    how many times it was dead-lettered, ``queue`` and ``died_at`` where and when; for one the
    broker dead-lettered (``delivery_limit``, ``rejected``, ``expired``, ...) they come from the
    newest ``x-death`` entry (how many times it died that way; the broker's time of that death,
    None when the header lacks it). ``error``: the consumer's detail, when it gave one.
    """

    id: str
    body: bytes
    reason: str | None
    count: int
    queue: str | None
    died_at: datetime | None
    headers: dict[str, Any]
    error: str | None = None


def dead_letter_id(message_id: str | None, body: bytes) -> str:
    """The id :class:`DeadLetter` carries (see there)."""
    return message_id or "sha256:" + hashlib.sha256(body).hexdigest()[:16]


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _dead_letter(message: AbstractIncomingMessage) -> DeadLetter:
    headers = dict(message.headers or {})
    deaths = headers.get("x-death")
    newest: dict[str, Any] = deaths[0] if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict) else {}
    count, died_at = headers.get(retry_routing.DEATHS), headers.get(retry_routing.DIED_AT)
    broker_time = newest.get("time")
    if retry_routing.REASON in headers and not (  # dead-lettered by the consumer, with its reason, last
        isinstance(broker_time, datetime) and isinstance(died_at, datetime) and broker_time > died_at
    ):
        return DeadLetter(
            id=dead_letter_id(message.message_id, message.body),
            body=message.body,
            reason=_text(headers[retry_routing.REASON]),
            count=count if isinstance(count, int) else 1,
            queue=_text(headers.get(retry_routing.DIED_IN)),
            died_at=died_at if isinstance(died_at, datetime) else None,
            headers=headers,
            error=_text(headers.get(retry_routing.ERROR)),
        )
    count = newest.get("count")
    died_at = broker_time
    return DeadLetter(
        id=dead_letter_id(message.message_id, message.body),
        body=message.body,
        reason=_text(newest.get("reason")),
        count=count if isinstance(count, int) else 0,
        queue=_text(newest.get("queue")),
        died_at=died_at if isinstance(died_at, datetime) else None,
        headers=headers,
    )


@dataclass
class _Taken:
    """Messages taken from the dead-letter queue on ``channel``; ``acked`` the ones settled."""

    channel: AbstractChannel
    messages: list[AbstractIncomingMessage] = field(default_factory=list)
    acked: set[AbstractIncomingMessage] = field(default_factory=set)

    async def ack(self, message: AbstractIncomingMessage) -> None:
        await message.ack()
        self.acked.add(message)


class DeadLetterQueue:
    """The dead-letter queue of ``settings`` (topology declared on first use)."""

    def __init__(self, settings: AMQPSettings) -> None:
        self._settings = settings

    @contextlib.asynccontextmanager
    async def _taken(self, limit: int) -> AsyncIterator[_Taken]:
        """Up to ``limit`` messages of the queue, unacked on a confirming channel. Whatever the
        block did not :meth:`_Taken.ack` is put back (nack, requeue) and, before this returns,
        seen back in the queue (up to :data:`RETURN_PATIENCE_SECONDS`), so the next operation
        finds it there."""
        connection = await connect_once(self._settings)
        try:
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            await declare_topology(channel, self._settings)
            queue = await channel.get_queue(self._settings.dead_letter_queue)
            taken = _Taken(channel)
            while len(taken.messages) < limit:
                message = await queue.get(no_ack=False, fail=False)
                if message is None:
                    break
                taken.messages.append(message)
            try:
                yield taken
            finally:
                kept = [message for message in taken.messages if message not in taken.acked]
                for message in kept:
                    await message.nack(requeue=True)
                deadline = time.monotonic() + RETURN_PATIENCE_SECONDS
                while kept and await queue_depth(channel, self._settings.dead_letter_queue) < len(kept):
                    if time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.01)
        finally:
            await connection.close()

    async def peek(self, limit: int = DEFAULT_LIMIT) -> list[DeadLetter]:
        """The messages in the queue (oldest first, at most ``limit``); all stay there."""
        async with self._taken(limit) as taken:
            return [_dead_letter(message) for message in taken.messages]

    async def settle(
        self,
        chosen: Callable[[DeadLetter], bool],
        action: Callable[[DeadLetter], Awaitable[bool]],
        limit: int = DEFAULT_LIMIT,
    ) -> list[DeadLetter]:
        """For each message ``chosen`` accepts, run ``action``; when it returns True the message
        leaves the queue (acked), else it stays. Returns the messages that left. An exception
        from ``action`` leaves that message and every later one in the queue."""
        settled: list[DeadLetter] = []
        async with self._taken(limit) as taken:
            for message in taken.messages:
                letter = _dead_letter(message)
                if chosen(letter) and await action(letter):
                    await taken.ack(message)
                    settled.append(letter)
        return settled

    async def redrive(self, ids: Collection[str] | None, limit: int = DEFAULT_LIMIT) -> list[DeadLetter]:
        """Publish the messages whose id is in ``ids`` (every message when None) to the order
        exchange again, each to its partition's queue (:meth:`_home_queue`; persistent, confirmed,
        same body, id and headers but the delivery count), and remove each from the dead-letter
        queue once the broker confirmed it. A later message with an id already redriven is the
        same order dead-lettered twice: removed, not published again. Returns those published.

        Raises:
            service.failures.PublishFailed: a publish was not confirmed; that message and the
                later ones stay in the dead-letter queue.
        """
        async with self._taken(limit) as taken:
            exchange = await taken.channel.get_exchange(self._settings.exchange)
            moved: list[DeadLetter] = []
            for message in taken.messages:
                letter = _dead_letter(message)
                if ids is not None and letter.id not in ids:
                    continue
                if any(letter.id == done.id for done in moved):
                    await taken.ack(message)
                    continue
                headers = {k: v for k, v in letter.headers.items() if k not in _DROPPED_ON_REDRIVE}
                copy = aio_pika.Message(
                    message.body,
                    headers=headers,
                    content_type=message.content_type,
                    message_id=message.message_id,
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                )
                try:
                    await exchange.publish(
                        copy,
                        routing_key=self._home_queue(letter),
                        mandatory=True,
                        timeout=self._settings.confirm_timeout,
                    )
                except (AMQPError, TimeoutError, *CONNECTION_EXCEPTIONS) as exc:
                    raise PublishFailed(repr(exc)) from exc
                await taken.ack(message)
                moved.append(letter)
            return moved

    def _home_queue(self, letter: DeadLetter) -> str:
        """The order queue (routing key) a redriven ``letter`` goes to: its product's partition;
        for a body that is no order, the partition queue it died in, else partition 0's (the
        consumer dead-letters it again)."""
        partition = partition_of_body(self._settings, letter.body)
        if partition is None:
            partition = self._settings.partition_of_queue(letter.queue)
        return self._settings.partition_queue(partition or 0)
