"""Reconciliation: a channel's daily bill against the ``payments`` table (every settlement
keyed by channel + channel transaction id + order; docs/ARCHITECTURE.md, "Payments").

Kinds of mismatch, per channel and UTC day:

- ``missing_here``: a payment in the channel's bill that we never recorded (its notification was
  lost): the one safe fix, applied with ``apply`` exactly as its ``paid`` notification would be;
- ``missing_at_channel``: a payment or refund we recorded for that day that the channel's bill
  does not have (a forged or mistaken notification): reported;
- ``amount_mismatch``: both sides know the transaction, with different amounts or orders:
  reported;
- ``owed_back``: a payment that could not pay its order (duplicate, late, mismatched) and is
  still owed back to the payer: reported until a refund settles it.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta

import msgspec
import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from db.queries import payments
from service.adapters.channel_client import BillLine, ChannelClient, ChannelUnavailable
from service.domain.errors import DomainError, InvalidInput
from service.domain.orders import actors
from service.domain.payments.notification import Notification
from service.domain.payments.service import PaymentService

log = structlog.get_logger(__name__)

_EVENT_OF = {"payment": "paid", "refund": "refunded"}
_BILLED_EVENTS = frozenset(_EVENT_OF.values())


class Mismatch(msgspec.Struct):
    """One difference; amounts in minor units (None where that side has nothing). ``fixed``: the
    result of applying it (``--apply``; only ``missing_here`` payments), else None."""

    kind: str
    channel: str
    channel_txn_id: str
    order_no: str
    channel_amount: int | None
    our_amount: int | None
    fixed: str | None = None


class ChannelReport(msgspec.Struct):
    """One channel's reconciliation: transactions in its bill, how many matched ours exactly,
    the mismatches; ``error`` when the bill could not be fetched."""

    channel: str
    bill_transactions: int
    matched: int
    mismatches: list[Mismatch]
    error: str | None = None


class ReconcileReport(msgspec.Struct):
    """``clean``: every bill fetched, and no mismatch left unfixed."""

    date: date
    channels: list[ChannelReport]
    clean: bool


class Reconciler:
    """Compares channels' bills with ``payments``; one per process."""

    def __init__(self, engine: AsyncEngine, channels: ChannelClient, payments_: PaymentService, currency: str) -> None:
        self._engine = engine
        self._channels = channels
        self._payments = payments_
        self._currency = currency

    async def reconcile(self, day: date, channel: str | None = None, *, apply: bool = False) -> ReconcileReport:
        """Reconcile UTC day ``day`` for ``channel`` (or every channel with a URL); with ``apply``
        the payments missing here are applied.

        Raises:
            InvalidInput: ``channel`` has no URL.
        """
        names = sorted(self._channels.channels) if channel is None else [channel]
        if channel is not None and channel not in self._channels.channels:
            raise InvalidInput("channel", f"unknown channel; one of {sorted(self._channels.channels)}")
        reports = [await self._one(name, day, apply) for name in names]
        clean = all(r.error is None and all(m.fixed is not None for m in r.mismatches) for r in reports)
        return ReconcileReport(day, reports, clean)

    async def _one(self, channel: str, day: date, apply: bool) -> ChannelReport:
        try:
            bill = await self._channels.bill(channel, day)
        except ChannelUnavailable as exc:
            return ChannelReport(channel, 0, 0, [], error=str(exc))
        start = datetime.combine(day, datetime.min.time())
        async with self._engine.connect() as conn:
            ours = {
                row.channel_txn_id: row
                for row in await conn.execute(
                    payments.OF_CHANNEL_DAY, {"c": channel, "start": start, "end": start + timedelta(days=1)}
                )
            }
            known = {}
            for line in bill:
                row = ours.get(line.channel_txn_id)
                if row is None:
                    row = (
                        await conn.execute(payments.BY_CHANNEL_TXN, {"c": channel, "t": line.channel_txn_id})
                    ).first()
                known[line.channel_txn_id] = row
            owed = list(await conn.execute(payments.OWED_BACK, {"c": channel}))
        mismatches: list[Mismatch] = []
        matched = 0
        for line in bill:
            row = known[line.channel_txn_id]
            if row is None:
                mismatches.append(await self._missing_here(channel, line, apply))
            elif row.amount != line.amount or row.order_no != line.order_no or row.event != _EVENT_OF[line.type]:
                mismatches.append(
                    Mismatch("amount_mismatch", channel, line.channel_txn_id, line.order_no, line.amount, row.amount)
                )
            else:
                matched += 1
        billed = {line.channel_txn_id for line in bill}
        mismatches += [
            Mismatch("missing_at_channel", channel, txn, row.order_no, None, row.amount)
            for txn, row in ours.items()
            if txn not in billed and row.event in _BILLED_EVENTS
        ]
        mismatches += [Mismatch("owed_back", channel, o.channel_txn_id, o.order_no, None, o.amount) for o in owed]
        return ChannelReport(channel, len(bill), matched, mismatches)

    async def _missing_here(self, channel: str, line: BillLine, apply: bool) -> Mismatch:
        mismatch = Mismatch("missing_here", channel, line.channel_txn_id, line.order_no, line.amount, None)
        if apply and line.type == "payment":
            note = Notification(channel, line.channel_txn_id, line.order_no, line.amount, line.currency, "paid")
            try:
                raw = msgspec.json.encode(line)
                mismatch.fixed = (await self._payments.apply(note, raw, actors.RECONCILIATION)).result
            except DomainError as exc:  # the order is unknown or still queued: left for an operator
                log.warning("reconcile_apply_failed", channel=channel, txn=line.channel_txn_id, code=exc.code)
        return mismatch
