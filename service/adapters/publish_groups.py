"""Group publishing: the orders of one order queue that arrive within a short linger leave in one
AMQP message (the broker's group commit; docs/ARCHITECTURE.md, "Order messages and groups").

:class:`Grouper` holds one open group per order queue. The first order opens it and starts the
linger; the group is sent when the linger is up or at once when it is full
(``FLASHSALE_AMQP__GROUP_MAX``). The linger adapts to the queue's pace (:class:`service.pace.Pace`,
``FLASHSALE_AMQP__GROUP_LINGER_ADAPTIVE``): while orders come further apart than
``FLASHSALE_AMQP__GROUP_LINGER_MS``, a group waits for nothing but the orders of the same
event-loop turn (a quiet sale pays no linger); as they come closer, it waits the time the group
takes to fill at that pace, never more than the setting (a stampede fills groups). Every order
of a group gets the outcome of that one message: each caller's wait ends when the broker
confirmed it, or raises the same :class:`PublishFailed` when it was nacked, returned or not
confirmed in time, so each caller releases its own reservation exactly as for a message of its own.

An order may come with an action to run once its message is confirmed (:data:`AfterConfirm`,
the purchase path's mark-queued writes): the group's task runs it for all its orders at once,
before any of their waits ends, so a caller's one wait covers the confirm and the action.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog

from service.failures import PublishFailed
from service.model.order_message import OrderMessage
from service.pace import Pace

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class Group:
    """Orders on their way in one message: ``id`` (the message's ``message_id`` when it carries
    more than one order), the orders in arrival order and the HTTP request each came with."""

    queue: str
    id: str = field(default_factory=lambda: os.urandom(16).hex())
    orders: list[OrderMessage] = field(default_factory=list)
    http_request_ids: list[str | None] = field(default_factory=list)
    waiters: list[asyncio.Future[None]] = field(default_factory=list)
    after: list[AfterConfirm | None] = field(default_factory=list)
    timer: asyncio.Handle | None = None


AfterConfirm = Callable[[list[OrderMessage]], Awaitable[None]]
"""Runs once the broker confirmed the message carrying these orders; it handles its own
failures (an exception from it is logged, and the orders count as published all the same)."""
Send = Callable[[Group], Awaitable[None]]
"""Publishes one group and returns once the broker confirmed it (raises :class:`PublishFailed`)."""


class Grouper:
    """Collects orders into groups per order queue and sends each with ``send``: at most
    ``max_size`` orders, the first waiting at most ``linger_seconds`` (0: the orders added in
    the same turn of the event loop); with ``adaptive``, as long as the queue's
    :class:`~service.pace.Pace` says, else always that long."""

    def __init__(self, send: Send, max_size: int, linger_seconds: float, *, adaptive: bool = False) -> None:
        self._send = send
        self._max = max_size
        self._linger = linger_seconds
        self._adaptive = adaptive and linger_seconds > 0
        self._paces: dict[str, Pace] = {}
        self._open: dict[str, Group] = {}
        self._sending: set[asyncio.Task[None]] = set()

    async def publish(
        self, queue: str, order: OrderMessage, http_request_id: str | None, after: AfterConfirm | None = None
    ) -> None:
        """Add ``order`` to the open group of ``queue`` and wait for that group's confirm (and,
        once confirmed, ``after`` run for the group's orders that came with it).

        Raises:
            PublishFailed: the group's message was nacked, returned, not confirmed in time, or
                the publisher closed before sending it.
        """
        loop = asyncio.get_running_loop()
        linger = self._linger
        if self._adaptive:
            pace = self._paces.get(queue)
            if pace is None:
                pace = self._paces[queue] = Pace(self._linger, self._max)
            pace.arrived(loop.time())
            linger = pace.linger()
        group = self._open.get(queue)
        if group is None:
            group = self._open[queue] = Group(queue)
            group.timer = (
                loop.call_later(linger, self._flush, group) if linger > 0 else loop.call_soon(self._flush, group)
            )
        waiter = loop.create_future()
        group.orders.append(order)
        group.http_request_ids.append(http_request_id)
        group.waiters.append(waiter)
        group.after.append(after)
        if len(group.orders) >= self._max:
            self._flush(group)
        await waiter

    def _flush(self, group: Group) -> None:
        if self._open.get(group.queue) is not group:
            return  # sent already (full before its linger was up)
        del self._open[group.queue]
        if group.timer is not None:
            group.timer.cancel()
        task = asyncio.create_task(self._send_group(group))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send_group(self, group: Group) -> None:
        failure: PublishFailed | None = None
        try:
            await self._send(group)
        except PublishFailed as exc:
            failure = exc
        except Exception as exc:  # never leave a waiter hanging: its request would never answer
            log.exception("group_publish_failed", group=group.id, orders=len(group.orders))
            failure = PublishFailed(repr(exc))
        if failure is None and any(group.after):
            await _run_after(group)
        for waiter in group.waiters:
            if not waiter.done():  # a waiter whose request was cancelled is done
                if failure is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(failure)

    async def close(self) -> None:
        """Fail the groups not sent yet (their callers release their reservations) and wait for
        the ones being sent."""
        for group in list(self._open.values()):
            del self._open[group.queue]
            if group.timer is not None:
                group.timer.cancel()
            for waiter in group.waiters:
                if not waiter.done():
                    waiter.set_exception(PublishFailed("publisher closed"))
        await asyncio.gather(*self._sending, return_exceptions=True)


async def _run_after(group: Group) -> None:
    """Each distinct :data:`AfterConfirm` of the confirmed ``group``, once, with its orders."""
    actions: dict[AfterConfirm, list[OrderMessage]] = {}
    for order, after in zip(group.orders, group.after, strict=True):
        if after is not None:
            actions.setdefault(after, []).append(order)
    for after, orders in actions.items():
        try:
            await after(orders)
        except Exception:  # the orders are queued: only the action is lost, and said so
            log.exception("after_confirm_failed", group=group.id, orders=len(orders))
