"""An operator's refund request: ``paid -> refunding`` and the ``refunds`` row, asked of the
channel while the order's row is locked (docs/ARCHITECTURE.md, "Order lifecycle").

- The channel takes it in: committed; its notification ends the refund.
- The channel refuses (a definite no: no such payment, ...): rolled back, so a refusal leaves
  no ``paid -> refunding -> paid`` pair in the order's history and no ``refunds`` row.
- The channel does not answer: it may have taken the request in, so the request is committed
  and then undone (``refunding -> paid``, the refund ``failed``); a late ``refunded``
  notification still refunds the order from ``paid``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from db.models import OrderStatus as S
from db.queries import payments, refunds
from service.adapters.channel_client import ChannelUnavailable
from service.domain.errors import OrderNotFound
from service.domain.orders.lifecycle import load_order, transition


@dataclass(frozen=True, slots=True)
class RefundRequest:
    """A refund to ask of ``channel``: its transaction ``payment_txn_id`` of order ``order_no``,
    ``amount`` minor units in ``currency``; ``refund_no`` is ours (``<order_no>R<n>``)."""

    refund_no: str
    order_no: str
    channel: str
    payment_txn_id: str
    amount: int
    currency: str


Ask = Callable[[RefundRequest], Awaitable[None]]
"""Puts a refund request to its channel (:meth:`ChannelClient.refund`), or does nothing for a
channel this process has no URL of."""


class RefundUnanswered(Exception):
    """The channel did not answer ``request``; it was undone (:func:`abandon_refund`)."""

    def __init__(self, request: RefundRequest) -> None:
        super().__init__(f"{request.channel} did not answer refund {request.refund_no}")
        self.request = request


async def request_refund(engine: AsyncEngine, order_no: str, restock: bool, actor: str, ask: Ask) -> RefundRequest:
    """Operator refund of a paid order: ``paid -> refunding`` (logged with ``actor``, the
    operator) and a ``refunds`` row for the channel that took the payment, one transaction, in
    which ``ask`` puts the request to the channel. ``restock``: the units go back on sale once
    the channel confirms the refund (never before: it may still fail). The order's row stays
    locked across the channel call (bounded by the channel timeout), as a payment start's does.

    Raises:
        OrderNotFound: unknown order.
        TransitionLost: the order is not paid (already refunding, cancelled, ...).
        ChannelRefused: the channel said no; nothing was written.
        RefundUnanswered: the channel did not answer; the request was undone.
    """
    unanswered = False
    async with engine.begin() as conn:
        order = await load_order(conn, order_no, for_update=True)
        if order is None:
            raise OrderNotFound(order_no)
        reason = "admin:refund_restock" if restock else "admin:refund"
        await transition(conn, order_no, S.PAID, S.REFUNDING, reason, actor=actor)
        paying = (await conn.execute(payments.APPLIED_PAYMENT, {"idem": f"pay:{order_no}:paid"})).one()
        count = (await conn.execute(refunds.COUNT_OF_ORDER, {"o": order_no})).scalar_one()
        request = RefundRequest(
            f"{order_no}R{count + 1}", order_no, paying.channel, paying.channel_txn_id, paying.amount, paying.currency
        )
        await conn.execute(
            refunds.INSERT,
            {
                "r": request.refund_no,
                "o": order_no,
                "c": request.channel,
                "t": request.payment_txn_id,
                "amount": request.amount,
                "restock": restock,
            },
        )
        try:
            await ask(request)
        except ChannelUnavailable:
            unanswered = True  # committed all the same: the channel may have taken it in
    if unanswered:
        await abandon_refund(engine, request, actor)
        raise RefundUnanswered(request)
    return request


async def abandon_refund(engine: AsyncEngine, request: RefundRequest, actor: str) -> None:
    """The channel did not take ``request`` in: ``refunding -> paid`` (logged with ``actor``, the
    operator whose request it undoes), the refund ``failed``. Should the channel have refunded
    after all, its ``refunded`` notification (naming the payment) still refunds the order from
    ``paid``."""
    async with engine.begin() as conn:
        await conn.execute(refunds.SETTLE, {"s": "failed", "r": request.refund_no})
        await transition(conn, request.order_no, S.REFUNDING, S.PAID, "channel_unavailable", actor=actor)
