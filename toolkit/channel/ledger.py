"""One simulated channel's books: payments by merchant order number, refunds, the day's bill.

Amounts in minor currency units; times UTC. A payment is ``unpaid`` (created, pay parameters
handed out), ``paid`` or ``closed`` (the merchant closed it; it can no longer be paid). The
merchant order number is the key, as at real channels (Alipay's ``out_trade_no``): creating the
same order again returns the same payment (a closed one is opened again, same transaction).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import UTC, date, datetime


class Refused(Exception):
    """The channel says no: ``status`` (HTTP), ``code`` (stable word), ``detail``."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Payment:
    """A payment of ``amount`` minor units for merchant order ``order_no``; ``notify_url``
    receives its notifications."""

    channel: str
    order_no: str
    channel_txn_id: str
    amount: int
    currency: str
    notify_url: str
    status: str = "unpaid"
    created_at: datetime = field(default_factory=_now)
    paid_at: datetime | None = None


@dataclass
class Refund:
    """A refund the merchant asked for (``refund_no`` is the merchant's); ``channel_txn_id`` is
    the channel's own id of the refund, ``payment_txn_id`` the payment it refunds. ``status``:
    ``processing``, then ``refunded``, ``failed`` or ``rejected``."""

    refund_no: str
    order_no: str
    channel_txn_id: str
    payment_txn_id: str
    amount: int
    currency: str
    status: str = "processing"
    at: datetime = field(default_factory=_now)


@dataclass(frozen=True)
class BillLine:
    """One line of the day's bill: ``type`` ``payment`` or ``refund``."""

    channel_txn_id: str
    order_no: str
    amount: int
    currency: str
    type: str
    at: datetime


class Ledger:
    """The books of channel ``channel``; single-threaded (one event loop), no locks needed."""

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self.payments: dict[str, Payment] = {}
        self.refunds: dict[str, Refund] = {}
        self.lines: list[BillLine] = []

    def _txn_id(self) -> str:
        return f"{self.channel[:2].upper()}{secrets.token_hex(10)}"

    def create(self, order_no: str, amount: int, currency: str, notify_url: str) -> Payment:
        """The payment for ``order_no``, created on the first call.

        Raises:
            Refused: 409 ``order_terms_differ`` when the order was created with another amount or
                currency; 409 ``already_paid`` is not raised: a paid payment is returned as it is.
        """
        payment = self.payments.get(order_no)
        if payment is None:
            payment = Payment(self.channel, order_no, self._txn_id(), amount, currency, notify_url)
            self.payments[order_no] = payment
            return payment
        if (payment.amount, payment.currency) != (amount, currency):
            raise Refused(409, "order_terms_differ", f"{order_no} was created for {payment.amount} {payment.currency}")
        if payment.status == "closed":
            payment.status = "unpaid"
        payment.notify_url = notify_url
        return payment

    def get(self, order_no: str) -> Payment:
        """Raises: Refused 404 ``payment_not_found``."""
        payment = self.payments.get(order_no)
        if payment is None:
            raise Refused(404, "payment_not_found", f"no payment for {order_no} at {self.channel}")
        return payment

    def pay(self, order_no: str) -> tuple[Payment, bool]:
        """The buyer pays; ``(payment, newly_paid)`` (paying twice charges once).

        Raises: Refused 404 ``payment_not_found``, 409 ``payment_closed``.
        """
        payment = self.get(order_no)
        if payment.status == "paid":
            return payment, False
        if payment.status == "closed":
            raise Refused(409, "payment_closed", f"the payment for {order_no} was closed")
        payment.status = "paid"
        payment.paid_at = _now()
        self.lines.append(
            BillLine(payment.channel_txn_id, order_no, payment.amount, payment.currency, "payment", payment.paid_at)
        )
        return payment, True

    def close(self, order_no: str) -> Payment:
        """Close an unpaid payment (closing a closed one again is fine).

        Raises: Refused 404 ``payment_not_found``, 409 ``already_paid``.
        """
        payment = self.get(order_no)
        if payment.status == "paid":
            raise Refused(409, "already_paid", f"the payment for {order_no} is paid")
        payment.status = "closed"
        return payment

    def refund(self, refund_no: str, order_no: str, amount: int) -> tuple[Refund, bool]:
        """Take refund ``refund_no`` in (``processing``); ``(refund, new)``: the same refund number
        again is the same refund. Its outcome comes later (:meth:`settle`).

        Raises: Refused 404 ``payment_not_found``, 409 ``refund_no_reused`` (another order or amount).
        """
        known = self.refunds.get(refund_no)
        if known is not None:
            if (known.order_no, known.amount) != (order_no, amount):
                raise Refused(409, "refund_no_reused", f"{refund_no} was used for another refund")
            return known, False
        payment = self.get(order_no)
        refund = Refund(refund_no, order_no, self._txn_id(), payment.channel_txn_id, amount, payment.currency)
        self.refunds[refund_no] = refund
        return refund, True

    def settle(self, refund: Refund, fail: bool) -> str:
        """Decide a processing refund: ``rejected`` when the payment is not paid or the amount
        exceeds it, ``failed`` when ``fail``, else ``refunded`` (a bill line). Returns the status."""
        payment = self.payments[refund.order_no]
        if payment.status != "paid" or refund.amount > payment.amount or self._refunded(refund.order_no):
            refund.status = "rejected"
        elif fail:
            refund.status = "failed"
        else:
            refund.status = "refunded"
            refund.at = _now()
            self.lines.append(
                BillLine(refund.channel_txn_id, refund.order_no, refund.amount, refund.currency, "refund", refund.at)
            )
        return refund.status

    def _refunded(self, order_no: str) -> bool:
        return any(r.order_no == order_no and r.status == "refunded" for r in self.refunds.values())

    def bill(self, day: date) -> list[BillLine]:
        """Every payment and refund settled on UTC day ``day``, in order."""
        return [line for line in self.lines if line.at.date() == day]
