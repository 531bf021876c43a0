"""RabbitMQ: the confirmed publisher of order messages
(:mod:`service.model.order_message`), on the topology of :mod:`service.adapters.broker_topology`.
"""

from __future__ import annotations

import asyncio
import time
from time import perf_counter
from typing import cast

import aio_pika
import aiormq
import structlog
from aio_pika.abc import (
    AbstractChannel,
    AbstractRobustConnection,
)
from aio_pika.exceptions import CONNECTION_EXCEPTIONS

from service import metrics
from service.adapters.broker_connection import connect_robust, quiet_connect_logs
from service.adapters.broker_topology import declare_topology, queue_depth, queue_depths
from service.adapters.publish_groups import AfterConfirm, Group, Grouper
from service.failures import PublishFailed
from service.log_setup import HTTP_REQUEST_ID
from service.model.order_message import (
    GROUP_FORMAT,
    OrderGroup,
    OrderMessage,
    encode_group,
    encode_order,
)
from service.settings import AMQPSettings

log = structlog.get_logger(__name__)
_CONFIRM_SECONDS = metrics.local_histogram(metrics.PUBLISH_CONFIRM_SECONDS)
_PUBLISH_FAILURES = metrics.local_counter(metrics.PUBLISH_FAILURES)
_PERSISTENT = int(aio_pika.DeliveryMode.PERSISTENT)


REOPEN_INTERVAL_SECONDS = 1.0
"""Least time between two attempts to re-open one of the publisher's channels (no reopen storm)."""


class Publisher:
    """One robust connection and ``settings.publish_channels`` confirming channels per process,
    used in turn (confirms on one channel come back in order; several channels let the broker
    confirm concurrent publishes side by side).

    ``publish`` returns only after the broker confirmed the message that carries the order
    (persistent, mandatory): with ``group_max`` > 1 the orders of one order queue published
    within one linger (at most ``group_linger_ms``) share one message
    (:mod:`service.adapters.publish_groups`).

    A channel the broker closed (e.g. 404 NOT_FOUND after the exchange was deleted; aio-pika's
    robust channels come back only after a *connection* loss, and not at all when restoring
    them fails) is replaced: the next publish on its turn, or :meth:`check` (the readiness
    probe), opens a new channel and declares the topology again, at most once per
    ``REOPEN_INTERVAL_SECONDS`` per channel; until then a publish on its turn fails
    (:class:`PublishFailed`).
    """

    def __init__(self, settings: AMQPSettings) -> None:
        self._settings = settings
        self._connection: AbstractRobustConnection | None = None
        self._channels: list[AbstractChannel] = []
        self._reopen_locks: list[asyncio.Lock] = []
        self._next_reopen: list[float] = []
        self._turn = 0
        self._reading: AbstractChannel | None = None
        self._replacing: set[AbstractChannel] = set()  # nacked channels being closed
        self._grouper = (
            Grouper(
                self._send_group,
                settings.group_max,
                settings.group_linger_ms / 1000,
                adaptive=settings.group_linger_adaptive,
            )
            if settings.group_max > 1
            else None
        )

    async def connect(self) -> None:
        """Open the robust connection and the confirming channels; declare the topology.

        Raises:
            aio_pika.exceptions.AMQPConnectionError: the broker did not answer (the caller
                waits for it and says so: the drivers' own log lines are held back).
        """
        with quiet_connect_logs():
            self._connection = await connect_robust(self._settings)
        for _ in range(self._settings.publish_channels):
            self._channels.append(await self._open_channel(declare=not self._channels))
            self._reopen_locks.append(asyncio.Lock())
            self._next_reopen.append(0.0)

    async def _open_channel(self, *, declare: bool) -> AbstractChannel:
        """A new confirming channel, unroutable publishes raising, on which the whole topology
        was declared (``declare``) or the order exchange was found (looked up passively)."""
        assert self._connection is not None
        channel = await self._connection.channel(publisher_confirms=True, on_return_raises=True)
        try:
            if declare:
                await declare_topology(channel, self._settings)
            else:
                await channel.get_exchange(self._settings.exchange)
        except BaseException:
            await _close_quietly(channel)
            raise
        return channel

    async def close(self) -> None:
        """Fail the groups not sent yet, wait for those being sent, close the connection (and
        its channels)."""
        if self._grouper is not None:
            await self._grouper.close()
        if self._connection is not None:
            await self._connection.close()

    async def queue_depths(self) -> tuple[int, int]:
        """Messages ready in the order queues (every partition's together) and in the dead-letter
        queue, asked of the broker now on a channel of their own (opened on first use, not one of
        the publishing channels).

        Raises:
            PublishFailed: the connection is down.
            aio_pika.exceptions.AMQPError: the broker refused (e.g. a queue was deleted).
        """
        if self._connection is None or self._connection.is_closed:
            raise PublishFailed("broker connection is down")
        if self._reading is None or self._reading.is_closed:
            self._reading = await self._connection.channel()
        return (
            await queue_depths(self._reading, self._settings.partition_queues()),
            await queue_depth(self._reading, self._settings.dead_letter_queue),
        )

    async def orders_waiting(self) -> int:
        """Order messages the broker holds ready for a consumer: in the order queues and in their
        retry queues together, asked now (not the deliveries consumers hold unacknowledged).

        Raises:
            PublishFailed: the connection is down or the broker did not answer as asked.
        """
        if self._connection is None or self._connection.is_closed:
            raise PublishFailed("broker connection is down")
        try:
            if self._reading is None or self._reading.is_closed:
                self._reading = await self._connection.channel()
            return await queue_depths(
                self._reading, [*self._settings.partition_queues(), *self._settings.retry_queues()]
            )
        except aio_pika.exceptions.AMQPError as exc:
            raise PublishFailed(f"queue depths not read: {exc!r}") from exc

    @property
    def ready(self) -> bool:
        """True when the connection and every channel are open."""
        return (
            self._connection is not None
            and not self._connection.is_closed
            and bool(self._channels)
            and not any(channel.is_closed for channel in self._channels)
        )

    async def check(self) -> bool:
        """The readiness probe: re-open the channels the broker closed (throttled as for
        publishing), then :attr:`ready`. Never raises."""
        if self._connection is None or self._connection.is_closed:
            return False
        closed = [index for index, channel in enumerate(self._channels) if channel.is_closed]
        # side by side: a probe waits at most about one confirm_timeout, however many are closed
        await asyncio.gather(*(self._channel_at(index) for index in closed), return_exceptions=True)
        return self.ready

    async def _channel_at(self, index: int) -> AbstractChannel:
        """Channel ``index``, re-opened (and the topology declared again) when the broker closed
        it and its last attempt is ``REOPEN_INTERVAL_SECONDS`` old.

        Raises:
            PublishFailed: the channel is closed and could not be re-opened now.
        """
        if not self._channels[index].is_closed:
            return self._channels[index]
        async with self._reopen_locks[index]:
            if not self._channels[index].is_closed:  # re-opened while this call waited
                return self._channels[index]
            now = time.monotonic()
            if now < self._next_reopen[index]:
                raise PublishFailed("broker channel closed (re-opening shortly)")
            self._next_reopen[index] = now + REOPEN_INTERVAL_SECONDS
            old = self._channels[index]
            try:
                channel = await asyncio.wait_for(
                    self._open_channel(declare=True), timeout=self._settings.confirm_timeout
                )
            except (TimeoutError, *CONNECTION_EXCEPTIONS) as exc:
                log.warning("publisher_channel_reopen_failed", channel=index, error=repr(exc))
                raise PublishFailed(f"broker channel closed: {exc!r}") from exc
            self._channels[index] = channel
            await _close_quietly(old)  # a robust channel would otherwise keep trying to restore itself
            log.info("publisher_channel_reopened", channel=index)
            return channel

    async def publish(self, order: OrderMessage, after: AfterConfirm | None = None) -> None:
        """Publish ``order`` and wait for the publisher confirm of the message carrying it (alone,
        or in its group), observed in ``flashsale_publish_confirm_duration_seconds`` and
        ``flashsale_publish_failures_total`` (per order). Once confirmed, ``after`` runs with the
        order (in a group: once for the group's orders that came with it) before this returns.

        Raises:
            PublishFailed: see :meth:`_publish`; for a group, every order of it.
        """
        started = perf_counter()
        queue = self._settings.queue_of(order.product_id)
        try:
            if self._grouper is None:
                await self._publish(encode_order(order), order.request_id, queue, HTTP_REQUEST_ID.get())
            else:
                await self._grouper.publish(queue, order, HTTP_REQUEST_ID.get(), after)
        except PublishFailed:
            _PUBLISH_FAILURES.inc()
            raise
        _CONFIRM_SECONDS.observe(perf_counter() - started)
        if self._grouper is None and after is not None:
            await after([order])

    async def _send_group(self, group: Group) -> None:
        """Publish ``group``: a single order in its own format, several in a group body whose
        ``message_id`` is the group's id."""
        if len(group.orders) == 1:
            order = group.orders[0]
            await self._publish(encode_order(order), order.request_id, group.queue, group.http_request_ids[0])
            return
        http_request_ids = group.http_request_ids if any(group.http_request_ids) else None
        body = encode_group(OrderGroup(GROUP_FORMAT, group.id, group.orders, http_request_ids))
        await self._publish(body, group.id, group.queue, None, orders=len(group.orders))

    async def _publish(
        self, body: bytes, message_id: str, queue: str, correlation_id: str | None, orders: int = 1
    ) -> None:
        """Publish ``body`` to ``queue`` and wait for the publisher confirm.

        Raises:
            PublishFailed: nack, unroutable (returned), no confirm within ``confirm_timeout``
                seconds, the connection is down, or this turn's channel was closed by the broker
                and could not be re-opened yet. The message may still have reached the broker
                after a timeout; the consumer's claim on the reservation settles that.
        """
        if self._connection is None or self._connection.is_closed or not self._channels:
            raise PublishFailed("broker connection is down")
        self._turn = turn = (self._turn + 1) % len(self._channels)
        # Straight to the channel's aiormq layer with the properties built here: aio-pika's
        # Message and Exchange.publish rebuild them and wait for the socket to drain, and that
        # drain holds the channel's lock, so one channel wrote one publish per loop turn.
        # The one deadline covers waiting for a reconnecting connection too.
        properties = aiormq.spec.Basic.Properties(
            content_type="application/json",
            delivery_mode=_PERSISTENT,
            message_id=message_id,
            correlation_id=correlation_id,  # the consumer's log lines name the HTTP request
        )
        try:
            async with asyncio.timeout(self._settings.confirm_timeout):
                # the concrete aiormq channel aio-pika hands out: its basic_publish takes ``wait``
                channel = cast(aiormq.Channel, await (await self._channel_at(turn)).get_underlay_channel())
                await channel.basic_publish(
                    body,
                    exchange=self._settings.exchange,
                    routing_key=queue,
                    properties=properties,
                    mandatory=True,  # unroutable: the channel raises (on_return_raises)
                    wait=False,  # the confirm is what is awaited, not the socket's drain
                )
        except (TimeoutError, *CONNECTION_EXCEPTIONS) as exc:
            log.warning("publish_failed", message_id=message_id, orders=orders, error=repr(exc))
            if _is_nack(exc):
                self._replace(turn)
            raise PublishFailed(repr(exc)) from exc

    def _replace(self, index: int) -> None:
        """Close channel ``index`` (in the background) so that its next turn opens a new one
        (:meth:`_channel_at`). A channel that was nacked while an order queue elected a new
        leader (its node killed) goes on being nacked after the new leader is up, until the old
        one is back (RabbitMQ 3.10, measured: docs/RELIABILITY.md), while a new channel on the
        same connection is acked."""
        channel = self._channels[index]
        if channel.is_closed or channel in self._replacing:
            return
        self._replacing.add(channel)
        task = asyncio.create_task(_close_quietly(channel))
        task.add_done_callback(lambda _: self._replacing.discard(channel))


def _is_nack(exc: BaseException) -> bool:
    """The broker answered the publish with a nack (not a return: that is a routing problem)."""
    return (
        isinstance(exc, aiormq.exceptions.DeliveryError)
        and not isinstance(exc, aiormq.exceptions.PublishError)
        and isinstance(exc.frame, aiormq.spec.Basic.Nack)
    )


async def _close_quietly(channel: AbstractChannel) -> None:
    try:
        await channel.close()
    except Exception as exc:  # closed by the broker already
        log.debug("channel_close_failed", error=repr(exc))
