"""Paying an order at a channel, and asking the channel before giving up on an order (docs/ARCHITECTURE.md,
"Payments").

- One order, one merchant order number (the order number itself), reused on every click,
  refresh and retry and at every channel: the channel keys its payment by it, so a retry can
  never charge twice at one channel.
- Parallel channel attempts: an order has at most one ``open`` attempt. Paying at another
  channel first closes the open one at its channel; only a confirmed close lets the new attempt
  open (``409 payment_in_progress`` otherwise), and a close refused because the buyer already
  paid there applies that payment instead. A start holds the order's row lock across its calls
  to the channels (each bounded by the channel timeout), so the starts of one order are
  serialised: no create can reach a channel after the close of its own attempt.
- Active query: before the payment-timeout sweep cancels an order it asks every channel where
  an attempt was opened; paid there -> the order is paid through the same path and
  idempotency keys as the notification (``UNIQUE(channel, channel_txn_id)``, ``pay:<order>:paid``),
  so a notification arriving at the same time is a no-op; not paid -> closed at the channel, and
  the order is cancelled only once every attempt is closed (every channel where it ever had an
  attempt is asked, so a payment created after a close is still found).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from db.models import OrderStatus as S
from db.queries import attempts
from service.adapters.channel_client import ChannelClient, ChannelPayment, ChannelUnavailable
from service.adapters.redis.stores import RedisStores
from service.domain.errors import Conflict, InvalidInput, OrderNotFound
from service.domain.order_numbers.format import require_valid_order_no
from service.domain.orders.lifecycle import load_order
from service.domain.payments.notification import Notification
from service.domain.payments.service import ChannelDown, NotifyResult, OrderQueued, PaymentService

log = structlog.get_logger(__name__)


class PayParameters(msgspec.Struct):
    """What the buyer needs to pay at ``channel``: ``pay_url`` (the channel's pay parameter),
    the channel's transaction id, ``amount`` in minor units of ``currency``."""

    order_no: str
    channel: str
    channel_txn_id: str
    amount: int
    currency: str
    pay_url: str
    status: str


@dataclass(frozen=True, slots=True)
class ChannelState:
    """What one channel said about an order in a sync: ``status`` ``paid``/``unpaid``/``closed``/
    ``unknown`` (no payment there)/``unavailable``; ``applied``: the notify result when a payment
    was applied from it."""

    channel: str
    status: str
    applied: str | None = None


class Checkout:
    """Starting a payment, syncing an order with its channels, and the sweep's question
    "may this order be cancelled?". One per process."""

    def __init__(
        self,
        engine: AsyncEngine,
        store: RedisStores,
        channels: ChannelClient,
        payments: PaymentService,
        currency: str,
        notify_url: str,
    ) -> None:
        self._engine = engine
        self._store = store
        self._channels = channels
        self._payments = payments
        self._currency = currency
        self._notify_url = notify_url

    async def start(self, user_id: str, order_no: str, channel: str) -> PayParameters:
        """Start or resume ``user_id``'s payment of ``order_no`` at ``channel``.

        Raises:
            InvalidInput: ``invalid_order_no``, or an unknown ``channel``.
            OrderNotFound: unknown, or someone else's.
            Conflict: ``order_queued`` (retry), ``order_not_payable`` (not pending payment; a
                payment found at the previous channel included), ``payment_in_progress`` (the
                open attempt at another channel could not be closed there; retry).
            Unavailable: ``channel_unavailable``: the channel did not answer (retry).
        """
        require_valid_order_no(order_no)
        if channel not in self._channels.channels:
            raise InvalidInput("channel", f"unknown channel; one of {sorted(self._channels.channels)}")
        paid_elsewhere: ChannelPayment | None = None
        created: ChannelPayment | None = None
        async with self._engine.begin() as conn:
            order = await load_order(conn, order_no, for_update=True)
            if order is None or order.user_id != user_id:
                queued = await self._store.reservations.queued_order(order_no) if order is None else None
                if queued is not None and queued.user_id == user_id:
                    raise OrderQueued(order_no)
                raise OrderNotFound(order_no)
            if order.status is not S.PENDING_PAYMENT:
                raise Conflict(f"The order is {order.status.label}.", code="order_not_payable")
            rows = (await conn.execute(attempts.OF_ORDER, {"o": order_no})).all()
            for other in [row.channel for row in rows if row.status == "open" and row.channel != channel]:
                try:
                    closed = await self._channels.close(other, order_no)
                except ChannelUnavailable:
                    raise Conflict(
                        f"The payment at {other} could not be closed; retry.",
                        code="payment_in_progress",
                        retry_after=1,
                    ) from None
                if closed is not None and closed.status == "paid":
                    paid_elsewhere = closed
                    break
                await conn.execute(attempts.SET_STATUS, {"s": "closed", "o": order_no, "c": other})
            else:
                await conn.execute(attempts.OPEN, {"o": order_no, "c": channel})
                try:
                    created = await self._channels.create(
                        channel, order_no, order.amount, self._currency, self._notify_url
                    )
                except ChannelUnavailable as exc:  # the attempt stays open: the channel may have it
                    log.warning("channel_create_failed", order_no=order_no, channel=channel, error=str(exc))
        if paid_elsewhere is not None:  # applied outside the row lock: the notification path takes it
            await self._apply(paid_elsewhere)
            raise Conflict(f"The order was paid at {paid_elsewhere.channel}.", code="order_not_payable")
        if created is None:
            raise ChannelDown(channel)
        return PayParameters(
            order_no, channel, created.channel_txn_id, created.amount, created.currency, created.pay_url, created.status
        )

    async def _close(self, order_no: str, channel: str) -> ChannelState:
        """Close ``order_no``'s payment at ``channel``: ``closed``/``unknown`` mark the attempt
        closed; ``paid`` (close refused) applies the payment."""
        try:
            payment = await self._channels.close(channel, order_no)
        except ChannelUnavailable:
            return ChannelState(channel, "unavailable")
        if payment is not None and payment.status == "paid":
            return ChannelState(channel, "paid", (await self._apply(payment)).result)
        async with self._engine.begin() as conn:
            await conn.execute(attempts.SET_STATUS, {"s": "closed", "o": order_no, "c": channel})
        return ChannelState(channel, "closed" if payment is not None else "unknown")

    async def _apply(self, payment: ChannelPayment) -> NotifyResult:
        """A payment the channel reports as paid, applied as its ``paid`` notification would be."""
        note = Notification(
            payment.channel, payment.channel_txn_id, payment.order_no, payment.amount, payment.currency, "paid"
        )
        result = await self._payments.apply(note, msgspec.json.encode(payment))
        log.info("payment_found_by_query", order_no=payment.order_no, channel=payment.channel, result=result.result)
        return result

    async def _open_channels(self, order_no: str) -> list[str]:
        async with self._engine.connect() as conn:
            return list((await conn.execute(attempts.CHANNELS_OF_ORDER, {"o": order_no})).scalars())

    async def sync(self, order_no: str) -> list[ChannelState]:
        """Ask every channel where ``order_no`` has an attempt (closed ones too: a create still on
        the wire when the close arrived may have left a payment there); a payment found paid
        there is applied (``flashsale payments sync``). Nothing is closed.

        Raises: InvalidInput ``invalid_order_no``.
        """
        require_valid_order_no(order_no)
        states = []
        for channel in await self._open_channels(order_no):
            try:
                payment = await self._channels.query(channel, order_no)
            except ChannelUnavailable:
                states.append(ChannelState(channel, "unavailable"))
                continue
            if payment is None:
                states.append(ChannelState(channel, "unknown"))
            elif payment.status == "paid":
                states.append(ChannelState(channel, "paid", (await self._apply(payment)).result))
            else:
                states.append(ChannelState(channel, payment.status))
        return states

    async def may_cancel(self, order_no: str) -> bool:
        """The sweep's question before cancelling an unpaid order: True only when every attempt
        of it is closed at its channel (or the channel never heard of it). A payment found on
        the way is applied (the order is then paid and the cancel loses its race)."""
        for state in await self.sync(order_no):
            if state.status == "paid":
                return False
            if state.status in ("unpaid", "unknown", "closed"):
                closed = await self._close(order_no, state.channel)
                if closed.status in ("paid", "unavailable"):
                    return False
            elif state.status == "unavailable":
                return False
        return True
