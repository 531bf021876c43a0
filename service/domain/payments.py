"""Payment notifications and refunds (seeds "Payment Order Number Design and Idempotency Tables"
and the dedup-table design notes).

A channel notification is verified (HMAC-SHA256 over the raw body), then handled in one MySQL
transaction that row-locks the order, so it serialises with a cancel or another notification:

- the ``payments`` row is inserted first; ``UNIQUE(channel, channel_txn_id)`` makes the same
  notification, however often and however late, a no-op ("already processed");
- the row that changes the order gets ``idem_key = biz_type:order_no:event``
  (``pay:FS...:paid``, ``refund:FS...:refunded``) under a UNIQUE index, so one order is paid at
  most once whatever the channel sends;
- money that cannot pay the order (amount or currency mismatch, order cancelled or already paid)
  is recorded and flagged, never applied; money for a cancelled order starts a refund (payment
  status ``refunding``) for operators to settle.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Annotated, Literal

import msgspec
import structlog
from msgspec import Meta
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from db.engine import as_duplicate_key
from db.models import OrderStatus as S
from db.queries import payments
from service.adapters.redis.stock_store import StockStore
from service.domain.errors import Conflict, DomainError, InvalidInput, OrderNotFound
from service.domain.lifecycle import (
    ReturnedUnits,
    TransitionLost,
    give_back_to_redis,
    load_order,
    return_stock,
    transition,
)
from service.domain.order_no import require_valid_order_no

log = structlog.get_logger(__name__)


class Notification(msgspec.Struct, forbid_unknown_fields=True):
    """A channel's notification. ``amount`` in minor currency units; ``currency`` ISO 4217."""

    channel: Annotated[str, Meta(pattern=r"^[a-z0-9_-]{1,32}$")]
    channel_txn_id: Annotated[str, Meta(pattern=r"^[\x21-\x7e]{1,64}$")]
    order_no: Annotated[str, Meta(min_length=26, max_length=26)]
    amount: Annotated[int, Meta(ge=0, le=2**62)]
    currency: Annotated[str, Meta(pattern=r"^[A-Z]{3}$")]
    event: Literal["paid", "refunded"]


class ChannelTxnReused(Conflict):
    """The channel's transaction id was already recorded for another order (``channel_txn_reused``)."""

    code = "channel_txn_reused"

    def __init__(self, channel_txn_id: str) -> None:
        super().__init__(f"Channel transaction {channel_txn_id} belongs to another order.")


class SignatureInvalid(DomainError):
    """Missing or wrong ``X-Signature``, or a channel without a configured secret (``invalid_signature``)."""

    code = "invalid_signature"

    def __init__(self, channel: str) -> None:
        super().__init__("Missing or wrong X-Signature for this channel.")
        self.channel = channel


@dataclass(frozen=True, slots=True)
class NotifyResult:
    """``result``: ``paid``, ``refunded``, ``already_processed``, ``amount_mismatch``,
    ``refund_started`` (money for a cancelled or rejected order), ``duplicate_payment``
    (another transaction already paid it), ``unexpected`` (recorded and flagged).
    ``order_status``: the order's status label afterwards."""

    result: str
    order_status: str


def sign(secret: str, body: bytes) -> str:
    """``hex(HMAC-SHA256(secret, body))``, as a channel signs a notification."""
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def signed(secret: str, note: Notification) -> tuple[bytes, dict[str, str]]:
    """The raw JSON body of ``note`` and its headers (``X-Signature`` = :func:`sign` of that body),
    as a channel sends them."""
    body = msgspec.json.encode(note)
    return body, {"Content-Type": "application/json", "X-Signature": sign(secret, body)}


def verify(secrets: dict[str, str], channel: str, body: bytes, signature: str | None) -> None:
    """Constant-time check of ``signature`` over the raw ``body`` with ``channel``'s secret.

    Raises:
        SignatureInvalid: unknown channel, missing or wrong signature.
    """
    secret = secrets.get(channel)
    if secret is None or not signature or not signature.isascii():
        raise SignatureInvalid(channel)
    if not hmac.compare_digest(sign(secret, body).encode(), signature.lower().encode()):
        raise SignatureInvalid(channel)


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
    except IntegrityError as exc:
        if as_duplicate_key(exc) is None:
            raise
        return None
    return inserted.lastrowid


async def _settle(
    conn: AsyncConnection, payment_id: int, status: str, *, flagged: bool = False, idem_key: str | None = None
) -> None:
    await conn.execute(
        payments.SETTLE,
        {"status": status, "flagged": flagged, "idem": idem_key, "id": payment_id},
    )


async def handle_notification(engine: AsyncEngine, note: Notification, raw: bytes, currency: str) -> NotifyResult:
    """Apply a verified notification (see the module docstring), one transaction.

    ``currency`` is the shop's currency (orders carry amounts in its minor units).

    Raises:
        OrderNotFound: no order ``note.order_no`` (nothing is recorded).
        ChannelTxnReused: the channel transaction id belongs to another order (nothing is recorded).
    """
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
            return NotifyResult("already_processed", order.status.label)
        if note.event == "paid":
            result = await _paid(conn, payment_id, note, order.amount, order.status, currency)
        else:
            result = await _refunded(conn, payment_id, note, order.amount, order.status, currency)
        after = await load_order(conn, note.order_no)
        assert after is not None  # row-locked since the start of this transaction
        status = after.status
    log.info("payment_notification", order_no=note.order_no, kind=note.event, result=result)
    return NotifyResult(result, status.label)


async def _paid(
    conn: AsyncConnection, payment_id: int, note: Notification, amount: int, status: S, currency: str
) -> str:
    if note.amount != amount or note.currency != currency:
        await _settle(conn, payment_id, "mismatch", flagged=True)
        return "amount_mismatch"
    if status is S.PENDING_PAYMENT:
        await transition(conn, note.order_no, S.PENDING_PAYMENT, S.PAID, f"{note.channel}:{note.channel_txn_id}")
        await _settle(conn, payment_id, "applied", idem_key=f"pay:{note.order_no}:paid")
        return "paid"
    if status in (S.CANCELLED, S.REJECTED):
        # The cancel won; the money goes back. The order never becomes paid.
        await _settle(conn, payment_id, "refunding", flagged=True)
        return "refund_started"
    await _settle(conn, payment_id, "duplicate", flagged=True)
    return "duplicate_payment"


async def _refunded(
    conn: AsyncConnection, payment_id: int, note: Notification, amount: int, status: S, currency: str
) -> str:
    # Money owed back for a payment that could not pay the order (late, duplicate or mismatched)
    # is what a refund settles first: a paid order is refunded only when nothing else is owed.
    settled = await conn.execute(
        payments.SETTLE_OWED_REFUND,
        {"o": note.order_no, "amount": note.amount, "currency": note.currency},
    )
    if settled.rowcount == 1:
        await _settle(conn, payment_id, "applied")
        return "refunded"
    if status in (S.PAID, S.REFUNDING) and (note.amount != amount or note.currency != currency):
        await _settle(conn, payment_id, "mismatch", flagged=True)
        return "amount_mismatch"
    if status is S.PAID:  # refund started at the channel: paid -> refunding -> refunded
        await transition(conn, note.order_no, S.PAID, S.REFUNDING, "channel_refund")
        status = S.REFUNDING
    if status is S.REFUNDING:
        await transition(conn, note.order_no, S.REFUNDING, S.REFUNDED, f"{note.channel}:{note.channel_txn_id}")
        await _settle(conn, payment_id, "applied", idem_key=f"refund:{note.order_no}:refunded")
        return "refunded"
    await _settle(conn, payment_id, "unexpected", flagged=True)
    return "unexpected"


async def request_refund(engine: AsyncEngine, order_no: str, restock: bool) -> ReturnedUnits | None:
    """Operator refund of a paid order: ``paid -> refunding``. With ``restock`` the units go back
    to MySQL stock in the same transaction (returned for the caller to give back to Redis).

    Raises:
        OrderNotFound: unknown order.
        TransitionLost: the order is not paid (already refunding, cancelled, ...).
    """
    async with engine.begin() as conn:
        order = await load_order(conn, order_no, for_update=True)
        if order is None:
            raise OrderNotFound(order_no)
        await transition(conn, order_no, S.PAID, S.REFUNDING, "refund_restock" if restock else "refund")
        return await return_stock(conn, order, release_quota=False) if restock else None


_notification = msgspec.json.Decoder(Notification)


class PaymentService:
    """Payment use cases: a channel's signed notification, an operator's refund. One per process.

    ``secrets``: channel -> HMAC-SHA256 secret; ``currency``: the shop's ISO 4217 code.
    """

    def __init__(self, engine: AsyncEngine, store: StockStore, secrets: dict[str, str], currency: str) -> None:
        self._engine = engine
        self._store = store
        self._secrets = secrets
        self._currency = currency

    async def notify(self, raw: bytes, signature: str | None) -> NotifyResult:
        """Decode, verify (``signature`` = hex HMAC-SHA256 of ``raw``) and apply a notification.

        Raises:
            InvalidInput: not a notification (``body``) or ``invalid_order_no``.
            SignatureInvalid: unknown channel, missing or wrong signature.
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
        return await handle_notification(self._engine, note, raw, self._currency)

    async def refund(self, order_no: str, restock: bool) -> None:
        """Start the refund of a paid order (``paid -> refunding``); with ``restock`` its units go
        back on sale in MySQL and then in Redis (the buyer keeps the per-user quota).

        Raises:
            InvalidInput: ``invalid_order_no``.
            OrderNotFound: unknown order.
            Conflict: ``order_not_refundable`` (not paid, a repeated refund included).
        """
        require_valid_order_no(order_no)
        try:
            returned = await request_refund(self._engine, order_no, restock)
        except TransitionLost as lost:
            raise Conflict(f"The order is {lost.current.label}.", code="order_not_refundable") from None
        if returned is not None:
            await give_back_to_redis(self._store, returned)
