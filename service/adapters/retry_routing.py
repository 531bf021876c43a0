"""Where the consumer sends a delivery it does not write now: a retry queue, or the dead-letter queue.

Both are a confirmed publish of a copy (same body, ``message_id``, ``correlation_id``, content
type; persistent; mandatory, so an unroutable copy raises) through the default exchange to the
queue named, after which the consumer acks the delivery. Nothing of it waits in the consumer's
prefetch window, and neither spends the order queue's delivery limit:

- a retry copy goes to the retry queue of its turn (:meth:`AMQPSettings.retry_queue`) of the
  partition it came from (:meth:`RetryRouter.partition_of`) and comes back to that order queue by
  itself when that queue's TTL is up (see :mod:`service.adapters.broker_topology`), carrying
  :data:`RETRIES` (how many times it was sent there);
- a dead-letter copy goes straight to the dead-letter queue, carrying why: :data:`REASON`
  (``invalid_order``, ``unknown_product``, ``order_no_conflict``, ``write_failed``), :data:`ERROR`
  (the detail, at most 200 characters), :data:`DEATHS` (how many times it was dead-lettered so,
  redrives included), :data:`DIED_IN` (the order queue it came from) and :data:`DIED_AT`.
  ``flashsale dlq`` shows them (:mod:`service.adapters.dead_letters`).

A copy may also carry part of a group the delivery carried (its own body and ids): an order of
a group is dead-lettered alone, as a single-order message under its request id, and the orders
of a group retried while others were written go to the retry queue together
(:mod:`consumers.settlements`).

A crash between the publish and the ack leaves both copies: the order's idempotency
(``UNIQUE(request_id)``) makes the second one a duplicate, as for any redelivery.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel
from aio_pika.exceptions import CONNECTION_EXCEPTIONS, AMQPError

from service.adapters.broker_topology import partition_of_body
from service.adapters.subscription import Delivery
from service.failures import PublishFailed
from service.settings import AMQPSettings

RETRIES = "x-flashsale-retries"
REASON = "x-flashsale-reason"
ERROR = "x-flashsale-error"
DEATHS = "x-flashsale-deaths"
DIED_IN = "x-flashsale-queue"
DIED_AT = "x-flashsale-died-at"

_BROKER_HEADERS = ("x-delivery-count", "x-death")
"""Headers of one trip through a queue, set by the broker: not carried over to a copy (nor the
``x-first-death-*`` / ``x-last-death-*`` ones)."""


def times_retried(message: Delivery) -> int:
    """How many times ``message`` was sent to a retry queue before (0 for a first delivery)."""
    value = message.headers.get(RETRIES)
    return value if isinstance(value, int) and value >= 0 else 0


def _carried(headers: dict[str, Any]) -> dict[str, Any]:
    return {
        key: value
        for key, value in headers.items()
        if key not in _BROKER_HEADERS and not key.startswith(("x-first-death-", "x-last-death-"))
    }


class RetryRouter:
    """Publishes retry and dead-letter copies on ``channel`` (a confirming channel of the
    consumer's connection: ``publisher_confirms=True, on_return_raises=True``); ``reopen`` gives a
    new one when the broker closed it (a robust channel comes back by itself only after a
    connection loss)."""

    def __init__(
        self,
        channel: AbstractChannel,
        settings: AMQPSettings,
        reopen: Callable[[], Awaitable[AbstractChannel]] | None = None,
    ) -> None:
        self._channel = channel
        self._settings = settings
        self._reopen = reopen

    def retry_delay(self, retries: int) -> float:
        """Seconds the retry after ``retries`` earlier ones waits."""
        delays = self._settings.retry_delays
        return delays[min(retries, len(delays) - 1)]

    async def retry(
        self, message: Delivery, why: str, *, body: bytes | None = None, message_id: str | None = None
    ) -> float:
        """Send a copy of ``message`` (with ``body`` and ``message_id`` instead of its own when
        given: part of its group) to the retry queue of its turn; returns the delay.

        Raises:
            service.failures.PublishFailed: not confirmed.
        """
        retries = times_retried(message)
        delay = self.retry_delay(retries)
        headers = _carried(message.headers) | {RETRIES: retries + 1, ERROR: why[:200]}
        queue = self._settings.retry_queue(delay, self.partition_of(message))
        await self._publish(message, headers, queue, body, message_id, message.correlation_id)
        return delay

    def partition_of(self, message: Delivery) -> int:
        """The partition ``message`` was delivered from: the one whose queue its routing key names
        (each order queue is bound with its own name, and its retry queues dead-letter back with
        it), else the partition of the product in its body, else 0."""
        partition = self._settings.partition_of_queue(message.routing_key)
        if partition is None:
            partition = partition_of_body(self._settings, message.body)
        return partition or 0

    async def dead_letter(
        self,
        message: Delivery,
        reason: str,
        error: str,
        *,
        body: bytes | None = None,
        message_id: str | None = None,
        correlation_id: str | None = None,
    ) -> None:
        """Send a copy of ``message`` (with ``body``, ``message_id`` and ``correlation_id``
        instead of its own when ``body`` is given: one order of its group) to the dead-letter
        queue with why it died.

        Raises:
            service.failures.PublishFailed: not confirmed.
        """
        headers = message.headers
        deaths = headers.get(DEATHS)
        headers = _carried(headers) | {
            REASON: reason,
            ERROR: error[:200],
            DEATHS: (deaths if isinstance(deaths, int) else 0) + 1,
            DIED_IN: self._settings.partition_queue(self.partition_of(message)),
            DIED_AT: datetime.now(UTC).replace(microsecond=0),
        }
        if body is None:
            correlation_id = message.correlation_id
        await self._publish(message, headers, self._settings.dead_letter_queue, body, message_id, correlation_id)

    async def _publish(
        self,
        message: Delivery,
        headers: dict[str, Any],
        queue: str,
        body: bytes | None,
        message_id: str | None,
        correlation_id: str | None,
    ) -> None:
        if self._channel.is_closed and self._reopen is not None:
            self._channel = await self._reopen()
        copy = aio_pika.Message(
            message.body if body is None else body,
            headers=headers,
            content_type=message.content_type,
            message_id=message.message_id if message_id is None else message_id,
            correlation_id=correlation_id,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        try:
            await self._channel.default_exchange.publish(
                copy, routing_key=queue, mandatory=True, timeout=self._settings.confirm_timeout
            )
        except (AMQPError, TimeoutError, *CONNECTION_EXCEPTIONS) as exc:
            raise PublishFailed(repr(exc)) from exc
