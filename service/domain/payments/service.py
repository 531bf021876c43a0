"""Payment notifications and refunds (docs/ARCHITECTURE.md, "Payments": every settlement is
matched by channel, channel transaction id and order).

A channel notification is verified (HMAC-SHA256 over the raw body; fields it does not know are
ignored), then handled in one MySQL transaction that row-locks the order, so it serialises with
a cancel or another notification:

- the ``payments`` row is inserted first; ``UNIQUE(channel, channel_txn_id)`` makes the same
  notification, however often and however late, a no-op ("already processed");
- the row that changes the order gets ``idem_key = biz_type:order_no:event``
  (``pay:FS...:paid``, ``refund:FS...:refunded``) under a UNIQUE index, so one order is paid at
  most once whatever the channel sends;
- money that cannot pay the order (amount or currency mismatch, order cancelled or already paid)
  is recorded and flagged, never applied; money for a cancelled order starts a refund (payment
  status ``refunding``) for operators to settle;
- a refund settles one payment of the notifying channel (channel + transaction + order), never
  another channel's; units go back on sale only once a refund is confirmed, and a failed or
  rejected refund returns the order to ``paid``.
- an order that is accepted but still queued (no row yet) is answered ``409 order_queued`` with
  ``Retry-After``: never a final 404 for money that may be real.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import structlog
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from db.models import OrderStatus as S
from db.queries import attempts, payments, refunds
from service.adapters.channel_client import ChannelClient, ChannelRefused
from service.adapters.redis.stores import RedisStores
from service.domain.errors import Conflict, InvalidInput, OrderNotFound, Unavailable
from service.domain.order_numbers.format import require_valid_order_no
from service.domain.orders import actors
from service.domain.orders.lifecycle import (
    OrderRow,
    ReturnedUnits,
    TransitionLost,
    give_back_to_redis,
    load_order,
    return_stock,
    transition,
)
from service.domain.payments.notification import Notification, verify
from service.domain.payments.refunds import RefundRequest, RefundUnanswered, request_refund
from service.failures import DuplicateKey

log = structlog.get_logger(__name__)


class ChannelTxnReused(Conflict):
    """The channel's transaction id was already recorded for another order (``channel_txn_reused``)."""

    code = "channel_txn_reused"

    def __init__(self, channel_txn_id: str) -> None:
        super().__init__(f"Channel transaction {channel_txn_id} belongs to another order.")


class OrderQueued(Conflict):
    """The order was accepted but MySQL has no row for it yet (``order_queued``, retry after 1 s):
    never a final 404 for money that may be real."""

    code = "order_queued"

    def __init__(self, order_no: str) -> None:
        super().__init__(f"Order {order_no} is still queued; retry in a moment.", retry_after=1)


class RefundRefused(Conflict):
    """The channel refused the refund (``refund_refused``): final, in the channel's words."""

    code = "refund_refused"

    def __init__(self, refusal: ChannelRefused) -> None:
        super().__init__(f"{refusal.channel} refused the refund: {refusal.code}: {refusal.detail}")


class ChannelDown(Unavailable):
    """A payment channel did not answer (``channel_unavailable``, retry after 1 s)."""

    code = "channel_unavailable"

    def __init__(self, channel: str) -> None:
        super().__init__(f"Channel {channel} did not answer; retry.")


@dataclass(frozen=True, slots=True)
class NotifyResult:
    """``result``: ``paid``, ``refunded``, ``already_processed``, ``amount_mismatch``,
    ``refund_started`` (money for a cancelled or rejected order), ``duplicate_payment``
    (another transaction already paid it), ``unexpected`` (recorded and flagged).
    ``order_status``: the order's status label afterwards."""

    result: str
    order_status: str


async def _record(conn: AsyncConnection, note: Notification, raw: str, status: str, flagged: bool) -> int | None:
    """Insert the payments row; None when this channel transaction was recorded before."""
    try:
        inserted = await conn.execute(
            payments.INSERT,
            {
                "order_no": note.order_no,
                "channel": note.channel,
                "txn": note.channel_txn_id,
                "event": note.event,
                "amount": note.amount,
                "currency": note.currency,
                "status": status,
                "flagged": flagged,
                "raw": raw,
            },
        )
    except DuplicateKey:
        return None
    return inserted.lastrowid


async def _settle(
    conn: AsyncConnection, payment_id: int, status: str, *, flagged: bool = False, idem_key: str | None = None
) -> None:
    await conn.execute(
        payments.SETTLE,
        {"status": status, "flagged": flagged, "idem": idem_key, "id": payment_id},
    )


@dataclass(frozen=True, slots=True)
class Applied:
    """What :func:`handle_notification` did: the answer, and units a confirmed refund with
    restock returned to MySQL (to be given back to Redis after the commit), else None."""

    result: NotifyResult
    returned: ReturnedUnits | None = None


async def handle_notification(
    engine: AsyncEngine, note: Notification, raw: bytes, currency: str, actor: str | None = None
) -> Applied:
    """Apply a verified notification (see the module docstring), one transaction.

    ``currency`` is the shop's currency (orders carry amounts in its minor units). ``actor``
    (:mod:`service.domain.orders.actors`) is logged with each status change: by default the channel
    (``channel:<name>``), ``system:reconciliation`` when a bill line is applied.

    Raises:
        OrderNotFound: no order row ``note.order_no`` (nothing is recorded).
        ChannelTxnReused: the channel transaction id belongs to another order (nothing is recorded).
    """
    returned = None
    by = actor or actors.channel(note.channel)
    async with engine.begin() as conn:
        order = await load_order(conn, note.order_no, for_update=True)
        if order is None:
            raise OrderNotFound(note.order_no)
        payment_id = await _record(conn, note, raw.decode(), "received", False)
        if payment_id is None:
            recorded_for = (
                await conn.execute(
                    payments.ORDER_OF_TXN,
                    {"c": note.channel, "t": note.channel_txn_id},
                )
            ).scalar()
            if recorded_for != note.order_no:
                raise ChannelTxnReused(note.channel_txn_id)
            return Applied(NotifyResult("already_processed", order.status.label))
        if note.event == "paid":
            result = await _paid(conn, payment_id, note, order.amount, order.status, currency, by)
        elif note.event == "refunded":
            result, returned = await _refunded(conn, payment_id, note, order, currency, by)
        else:
            result = await _refund_failed(conn, payment_id, note, order.status, by)
        after = await load_order(conn, note.order_no)
        assert after is not None  # row-locked since the start of this transaction
        status = after.status
    log.info("payment_notification", order_no=note.order_no, channel=note.channel, kind=note.event, result=result)
    return Applied(NotifyResult(result, status.label), returned)


def _matches(note: Notification, amount: int, currency: str) -> bool:
    return note.amount == amount and note.currency == currency


async def _paid(
    conn: AsyncConnection, payment_id: int, note: Notification, amount: int, status: S, currency: str, actor: str
) -> str:
    if not _matches(note, amount, currency):
        await _settle(conn, payment_id, "mismatch", flagged=True)
        return "amount_mismatch"
    if status is S.PENDING_PAYMENT:
        await transition(conn, note.order_no, S.PENDING_PAYMENT, S.PAID, f"channel:{note.channel}", actor=actor)
        await _settle(conn, payment_id, "applied", idem_key=f"pay:{note.order_no}:paid")
        await conn.execute(attempts.SET_STATUS, {"s": "paid", "o": note.order_no, "c": note.channel})
        return "paid"
    if status in (S.CANCELLED, S.REJECTED):
        # The cancel won; the money goes back. The order never becomes paid.
        await _settle(conn, payment_id, "refunding", flagged=True)
        return "refund_started"
    await _settle(conn, payment_id, "duplicate", flagged=True)
    return "duplicate_payment"


_OWED = ("refunding", "duplicate", "mismatch")
"""Statuses of a ``paid`` payment that could not pay its order: money owed back to the payer."""


async def _refunded(
    conn: AsyncConnection, payment_id: int, note: Notification, order: OrderRow, currency: str, actor: str
) -> tuple[str, ReturnedUnits | None]:
    """A refund settles one payment of the notifying channel, matched by channel + transaction +
    order: the one ``payment_txn_id`` names; without it, money owed back at that channel first,
    then the payment of that channel that paid the order. Never another channel's payment."""
    if note.payment_txn_id is not None:
        target = (
            await conn.execute(payments.PAID_PAYMENT, {"o": note.order_no, "c": note.channel, "t": note.payment_txn_id})
        ).first()
        if target is None or target.status not in (*_OWED, "applied"):
            await _settle(conn, payment_id, "unexpected", flagged=True)
            return "unexpected", None
        if not _matches(note, target.amount, target.currency):
            await _settle(conn, payment_id, "mismatch", flagged=True)
            return "amount_mismatch", None
        if target.status in _OWED:
            return await _settle_owed(conn, payment_id, target.id), None
    else:
        owed = (
            await conn.execute(
                payments.OWED_PAYMENT,
                {"o": note.order_no, "c": note.channel, "amount": note.amount, "currency": note.currency},
            )
        ).scalar()
        if owed is not None:
            return await _settle_owed(conn, payment_id, owed), None
        paying = (await conn.execute(payments.APPLIED_PAYMENT, {"idem": f"pay:{note.order_no}:paid"})).first()
        if paying is None or paying.channel != note.channel:
            await _settle(conn, payment_id, "unexpected", flagged=True)
            return "unexpected", None
        if not _matches(note, order.amount, currency):
            await _settle(conn, payment_id, "mismatch", flagged=True)
            return "amount_mismatch", None
    return await _refund_order(conn, payment_id, note, order, actor)


async def _settle_owed(conn: AsyncConnection, payment_id: int, owed_id: int) -> str:
    await conn.execute(payments.MARK_REFUNDED, {"id": owed_id})
    await _settle(conn, payment_id, "applied")
    return "refunded"


async def _refund_order(
    conn: AsyncConnection, payment_id: int, note: Notification, order: OrderRow, actor: str
) -> tuple[str, ReturnedUnits | None]:
    """``refunding -> refunded`` (``paid -> refunding`` first when the channel refunded on its
    own); the open refund request is settled and, if it asked for it, the units go back on sale."""
    reason = f"channel:{note.channel}"
    status = order.status
    if status is S.PAID:
        await transition(conn, note.order_no, S.PAID, S.REFUNDING, reason, actor=actor)
        status = S.REFUNDING
    if status is not S.REFUNDING:
        await _settle(conn, payment_id, "unexpected", flagged=True)
        return "unexpected", None
    await transition(conn, note.order_no, S.REFUNDING, S.REFUNDED, reason, actor=actor)
    await _settle(conn, payment_id, "applied", idem_key=f"refund:{note.order_no}:refunded")
    request = (await conn.execute(refunds.OPEN_OF_ORDER, {"o": note.order_no})).first()
    returned = None
    if request is not None:
        await conn.execute(refunds.SETTLE, {"s": "refunded", "r": request.refund_no})
        if request.restock:
            returned = await return_stock(conn, order, release_quota=False)
    return "refunded", returned


async def _refund_failed(conn: AsyncConnection, payment_id: int, note: Notification, status: S, actor: str) -> str:
    """``refund_failed`` / ``refund_rejected`` from the channel asked: ``refunding -> paid``."""
    request = (await conn.execute(refunds.OPEN_OF_ORDER, {"o": note.order_no})).first()
    if (
        status is not S.REFUNDING
        or request is None
        or request.channel != note.channel
        or note.refund_no not in (None, request.refund_no)
    ):
        await _settle(conn, payment_id, "unexpected", flagged=True)
        return "unexpected"
    await transition(conn, note.order_no, S.REFUNDING, S.PAID, f"channel:{note.channel}", actor=actor)
    await conn.execute(refunds.SETTLE, {"s": note.event.removeprefix("refund_"), "r": request.refund_no})
    await _settle(conn, payment_id, "applied", idem_key=f"refund:{request.refund_no}:{note.event}")
    return note.event


_notification = msgspec.json.Decoder(Notification)


class PaymentService:
    """Payment use cases: a channel's signed notification, an operator's refund. One per process.

    ``secrets``: channel -> HMAC-SHA256 secret; ``currency``: the shop's ISO 4217 code;
    ``channels``: the channels' HTTP API (refunds are asked of the channel that took the payment
    when it has a URL; otherwise its ``refunded`` notification is awaited as it comes).
    """

    def __init__(
        self,
        engine: AsyncEngine,
        store: RedisStores,
        secrets: dict[str, str],
        currency: str,
        channels: ChannelClient | None = None,
    ) -> None:
        self._engine = engine
        self._store = store
        self._secrets = secrets
        self._currency = currency
        self._channels = channels

    async def notify(self, raw: bytes, signature: str | None) -> NotifyResult:
        """Decode, verify (``signature`` = hex HMAC-SHA256 of ``raw``) and apply a notification.

        Raises:
            InvalidInput: not a notification (``body``) or ``invalid_order_no``.
            SignatureInvalid: unknown channel, missing or wrong signature.
            Conflict: ``order_queued`` (with ``retry_after``): the order is accepted but its row
                is not written yet; the channel's retry will find it.
            OrderNotFound, ChannelTxnReused: see :func:`handle_notification`.
        """
        try:
            note = _notification.decode(raw)
        except msgspec.ValidationError as exc:
            raise InvalidInput("body", str(exc)) from None
        except msgspec.DecodeError:
            raise InvalidInput("body", "not a JSON notification") from None
        verify(self._secrets, note.channel, raw, signature)
        require_valid_order_no(note.order_no)
        return await self.apply(note, raw)

    async def apply(self, note: Notification, raw: bytes, actor: str | None = None) -> NotifyResult:
        """Apply a verified notification (or a channel query's answer in its form), give units a
        confirmed refund returned back to Redis; the errors of :meth:`notify` but the decoding.
        ``actor``: who the status changes are logged for (default: the channel)."""
        try:
            applied = await handle_notification(self._engine, note, raw, self._currency, actor)
        except OrderNotFound:
            if await self._store.reservations.queued_order(note.order_no) is not None:
                raise OrderQueued(note.order_no) from None
            raise
        if applied.returned is not None:
            await give_back_to_redis(self._store, applied.returned)
        return applied.result

    async def refund(self, order_no: str, restock: bool, admin_id: str) -> RefundRequest:
        """Start the refund of a paid order (``paid -> refunding``, by operator ``admin_id``); with
        ``restock`` its units go back on sale once the channel confirms it (the buyer keeps the
        per-user quota).

        Raises:
            InvalidInput: ``invalid_order_no``.
            OrderNotFound: unknown order.
            Conflict: ``order_not_refundable`` (not paid, still queued, a repeated refund included).
            RefundRefused: the channel said no (no such payment, ...); the order stays ``paid``
                with nothing in its history.
            ChannelDown: the channel did not answer; the order is ``paid`` again.
        """
        require_valid_order_no(order_no)
        channels = self._channels

        async def ask(request: RefundRequest) -> None:
            if channels is not None and request.channel in channels.channels:  # else left to its notification
                await channels.refund(request.channel, request.refund_no, order_no, request.amount)

        try:
            return await request_refund(self._engine, order_no, restock, actors.admin(admin_id), ask)
        except ChannelRefused as refusal:
            log.warning(
                "refund_refused", order_no=order_no, channel=refusal.channel, code=refusal.code, detail=refusal.detail
            )
            raise RefundRefused(refusal) from None
        except RefundUnanswered as unanswered:
            raise ChannelDown(unanswered.request.channel) from None
        except TransitionLost as lost:
            raise Conflict(f"The order is {lost.current.label}.", code="order_not_refundable") from None
        except OrderNotFound:
            if (
                await self._store.reservations.queued_order(order_no) is not None
            ):  # accepted, not paid: nothing to refund
                raise Conflict("The order is still queued.", code="order_not_refundable") from None
            raise
