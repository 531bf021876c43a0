"""The invariants ``flashsale sale`` proves: the five every flash sale must keep (no oversell,
one order per accepted request, the per-user limit, Redis realigned with MySQL, rejections leave
no trace: :func:`check_invariants`, docs/ARCHITECTURE.md) and three more for the order lifecycle
(:func:`check_lifecycle`), each a :class:`Check` with the numbers behind it; :func:`check_all`
picks what applies to a run. :data:`INVARIANT_TITLES` also names the seven of a sale through the
waiting room, checked by :mod:`toolkit.sale.room_checks`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from db.models import OrderStatus
from service.domain.order_numbers.format import is_valid_order_no
from toolkit.sale.facts import LifecycleRun, Measured, SaleOrderRow, StoreFacts
from toolkit.sale.report import LoadSummary, Summaries, tally


@dataclass(frozen=True, slots=True)
class Check:
    """One invariant: ``ok`` and the numbers behind it."""

    ok: bool
    numbers: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """``{"ok": ..., **numbers}``: the check as it appears in the report."""
        return {"ok": self.ok, **self.numbers}


INVARIANT_TITLES = {
    "trail_complete": "0. the crowd's merged trail holds every request its workers sent, each exactly once",
    "sold_within_stock": (
        "1. the queue drained; units sold <= stock, and = stock when demand exceeded supply; no accepted"
        " order refused for stock"
    ),
    "one_order_per_accepted_request": "2. every 202 has exactly one order row; no request id or order number twice",
    "per_user_limit": "3. no user holds more than the per-user limit (nor was granted more)",
    "realigned": (
        "4. after the final realignment Redis stock + units the waiting room holds = MySQL stock, journal empty,"
        " stock + sold = initial"
    ),
    "rejections_leave_no_trace": (
        "5. rejected requests left no trace (MySQL, RabbitMQ); Redis quotas = units each user holds"
        " (orders not cancelled/rejected)"
    ),
    "lifecycle_units": (
        "6. payment timeouts: stock + sold = initial; sold = paid + resold (pending) units; every unpaid"
        " order swept; the returned units resold when demand exceeded supply"
    ),
    "paid_once": (
        "7. every order a buyer paid at a channel is paid once, whatever was dropped or duplicated; no order paid"
        " twice; no cancelled order paid"
    ),
    "channels_reconciled": (
        "8. every channel payment matched to exactly one order (channel + txn + order) or flagged owed back;"
        " no order paid at a channel cancelled; reconciliation clean"
    ),
    "no_purchase_without_admission": (
        "9. waiting room: every 202 bought with an admission its buyer was given; no admission bought twice"
    ),
    "admitted_once_at_a_time": "10. waiting room: one ticket per buyer; no buyer holds two admissions at once",
    "sold_out_told_in_time": (
        "11. waiting room: every buyer waiting at the last unit told sold_out within its longest poll interval"
        " + 1 s (no buyer left waiting at the deadline)"
    ),
    "scripted_no_larger_share": (
        "12. waiting room: scripted buyers' share of units <= their share of the buyers who stayed (+ 3 standard"
        " deviations of a fair draw)"
    ),
    "turn_is_a_unit": (
        "13. waiting room: no buyer told it is its turn with a unit held failed to buy for lack of stock within"
        " its time"
    ),
    "place_never_moved_back": (
        "14. waiting room: no place shown to a buyer ever moved back (position or ahead), no place shown to two buyers"
    ),
    "departed_never_admitted": (
        "15. waiting room: no buyer silent longer than its departure bound (3 x the longest interval told, plus the"
        " grace) was admitted on its return"
    ),
}

_NOT_HELD = (OrderStatus.REJECTED, OrderStatus.CANCELLED)  # orders whose units went back (or never left)


def _held_by_user(orders: list[SaleOrderRow]) -> Counter[str]:
    """Units each user holds in MySQL (orders not rejected or cancelled)."""
    held: Counter[str] = Counter()
    for row in orders:
        if row.status not in _NOT_HELD:
            held[row.user_id] += row.quantity
    return held


def _check_units(summary: LoadSummary, facts: StoreFacts, stock: int, drained: bool, demand_exceeded: bool) -> Check:
    """Invariant 1; ``demand_exceeded``: the last wave was told ``sold_out``."""
    in_orders = sum(_held_by_user(facts.orders).values())
    # Every row is a 202's: one the consumer refused for stock means Redis sold what MySQL had not.
    refused = sum(1 for row in facts.orders if row.status == OrderStatus.REJECTED and row.reason == "sold_out")
    ok = (
        refused == 0
        and drained
        and facts.mysql_sold <= stock
        and in_orders <= stock
        and facts.mysql_sold == in_orders
        and (not demand_exceeded or facts.mysql_sold == stock)
    )
    return Check(
        ok,
        {
            "initial_stock": stock,
            "mysql_sold": facts.mysql_sold,
            "units_in_orders": in_orders,
            "accepted_units": summary.accepted_units,
            "accepted_refused_for_stock": refused,
            "demand_exceeded_supply": demand_exceeded,
            "drained": drained,
        },
    )


def _check_one_order(summary: LoadSummary, facts: StoreFacts) -> Check:
    rows_by_order_no = {row.order_no: row for row in facts.orders}
    missing = [no for no in summary.accepted if no not in rows_by_order_no]
    unknown = [row for row in facts.orders if row.order_no not in summary.accepted]
    mismatched = [
        row
        for row in facts.orders
        if (told := summary.accepted.get(row.order_no)) is not None
        and (row.request_id, row.user_id, row.quantity) != (told.request_id, told.user, told.quantity)
    ]
    duplicate_order_nos = len(facts.orders) - len(rows_by_order_no)
    duplicate_request_ids = len(facts.orders) - len({row.request_id for row in facts.orders})
    invalid = {no for no in summary.accepted if not is_valid_order_no(no)}
    invalid |= {row.order_no for row in facts.orders if not is_valid_order_no(row.order_no)}
    replay_mismatches = summary.retries - summary.retries_same
    numbers = {
        "accepted_orders": len(summary.accepted),
        "order_rows": len(facts.orders),
        "accepted_without_row": len(missing),
        "rows_without_202": len(unknown),
        "rows_differing_from_202": len(mismatched),
        "duplicate_order_nos": duplicate_order_nos,
        "duplicate_request_ids": duplicate_request_ids,
        "conflicting_202s": summary.answer_conflicts,
        "replays_not_same_order": replay_mismatches,
        "invalid_order_nos": len(invalid),
    }
    ok = all(value == 0 for name, value in numbers.items() if name not in ("accepted_orders", "order_rows"))
    return Check(ok, numbers)


def _check_user_limit(summary: LoadSummary, facts: StoreFacts, limit: int) -> Check:
    held = _held_by_user(facts.orders)
    over = sum(1 for units in held.values() if units > limit)
    return Check(
        over == 0 and summary.limit_probes_accepted == 0,
        {
            "per_user_limit": limit,
            "buyers": len(held),
            "max_units_held": max(held.values(), default=0),
            "users_over_limit": over,
            "limit_probes_after_202": summary.limit_probes,
            "limit_probes_accepted": summary.limit_probes_accepted,
        },
    )


def _check_realigned(facts: StoreFacts, stock: int) -> Check:
    request_ids = {row.request_id for row in facts.orders}
    resolved_in_journal = sum(1 for request_id in facts.journal_ids if request_id in request_ids)
    ok = (
        facts.redis_stock is not None
        and facts.redis_stock + facts.redis_held == facts.mysql_stock
        and resolved_in_journal == 0
        and not facts.journal_ids
        and facts.mysql_stock + facts.mysql_sold == stock
    )
    return Check(
        ok,
        {
            "redis_stock": facts.redis_stock,
            "redis_held_for_admitted": facts.redis_held,
            "mysql_stock": facts.mysql_stock,
            "mysql_sold": facts.mysql_sold,
            "initial_stock": stock,
            "journal_entries": len(facts.journal_ids),
            "resolved_in_journal": resolved_in_journal,
        },
    )


def _check_no_trace(summary: LoadSummary, facts: StoreFacts) -> Check:
    held = _held_by_user(facts.orders)
    quota_mismatches = sum(1 for user in held.keys() | facts.quota.keys() if held[user] != facts.quota.get(user, 0))
    ok = (
        len(facts.orders) == len(summary.accepted)
        and facts.dead_letters == 0
        and facts.queue_messages == 0
        and quota_mismatches == 0
    )
    return Check(
        ok,
        {
            "order_rows": len(facts.orders),
            "accepted_orders": len(summary.accepted),
            "dead_lettered": facts.dead_letters,
            "queue_messages": facts.queue_messages,
            "redis_quota_mismatches": quota_mismatches,
        },
    )


def check_invariants(
    summary: LoadSummary, facts: StoreFacts, stock: int, limit: int, drained: bool, demand_exceeded: bool
) -> dict[str, Check]:
    """The five invariants of every sale (the first keys of :data:`INVARIANT_TITLES`) over every
    wave's answers; ``stock`` and ``limit`` in units; ``demand_exceeded``: the last wave was told
    ``sold_out``."""
    return {
        "sold_within_stock": _check_units(summary, facts, stock, drained, demand_exceeded),
        "one_order_per_accepted_request": _check_one_order(summary, facts),
        "per_user_limit": _check_user_limit(summary, facts, limit),
        "realigned": _check_realigned(facts, stock),
        "rejections_leave_no_trace": _check_no_trace(summary, facts),
    }


def _check_lifecycle_units(
    lifecycle: LifecycleRun, first: LoadSummary, resale: LoadSummary, facts: StoreFacts, stock: int
) -> Check:
    """Invariant 6: where the units went after payments, timeouts and the resale."""
    _, paid_units = tally(facts.orders, OrderStatus.PAID)
    _, pending_units = tally(facts.orders, OrderStatus.PENDING_PAYMENT)
    cancelled_orders, _ = tally(facts.orders, OrderStatus.CANCELLED)
    timed_out_orders, returned_units = tally(facts.orders, OrderStatus.CANCELLED, "payment_timeout")
    resold_units = resale.accepted_units
    ok = (
        facts.mysql_stock + facts.mysql_sold == stock
        and facts.mysql_sold == paid_units + pending_units
        and pending_units == resold_units
        and lifecycle.unpaid == lifecycle.swept == timed_out_orders == cancelled_orders
        and lifecycle.returned == returned_units
        and (not first.sold_out_seen or lifecycle.on_sale == returned_units)
        and (not resale.sold_out_seen or resold_units == lifecycle.on_sale)
    )
    return Check(
        ok,
        {
            "initial_stock": stock,
            "mysql_stock": facts.mysql_stock,
            "mysql_sold": facts.mysql_sold,
            "paid_units": paid_units,
            "pending_units": pending_units,
            "resold_units": resold_units,
            "orders_left_unpaid": lifecycle.unpaid,
            "orders_swept": lifecycle.swept,
            "cancelled_orders": cancelled_orders,
            "cancelled_payment_timeout": timed_out_orders,
            "cancelled_units": returned_units,
            "stock_returned": lifecycle.returned,
            "on_sale_at_resale": lifecycle.on_sale,
            "first_wave_sold_out": first.sold_out_seen,
            "resale_sold_out": resale.sold_out_seen,
        },
    )


def _check_paid_once(lifecycle: LifecycleRun, facts: StoreFacts) -> Check:
    """Invariant 7: the buyers who paid at a channel against the ``orders`` and ``payments`` tables."""
    paid_at_channel = set(lifecycle.paid_at_channel)
    paid = {row.order_no for row in facts.orders if row.status == OrderStatus.PAID}
    cancelled = {row.order_no for row in facts.orders if row.status == OrderStatus.CANCELLED}
    applied = Counter(p.order_no for p in facts.payments if p.event == "paid" and p.status == "applied")
    numbers = {
        "buyers_paid": len(lifecycle.paid_at_channel),
        "answered_paid_by_channel": sum(1 for o in lifecycle.payments.outcomes if o.status == 200),
        "payment_starts_answered_200": sum(1 for o in lifecycle.starts.outcomes if o.status == 200),
        "payment_starts": len(lifecycle.starts.outcomes),
        "paid_orders": len(paid),
        "orders_paid_by_two_buyers": len(lifecycle.paid_at_channel) - len(paid_at_channel),
        "paid_at_channel_not_paid": len(paid_at_channel - paid),
        "paid_without_paying": len(paid - paid_at_channel),
        "paid_without_applied_payment": len(paid - applied.keys()),
        "orders_paid_twice": sum(1 for n in applied.values() if n > 1),
        "cancelled_with_payment": len(cancelled & {p.order_no for p in facts.payments}),
    }
    counts = ("buyers_paid", "answered_paid_by_channel", "payment_starts_answered_200", "payment_starts", "paid_orders")
    ok = (
        numbers["answered_paid_by_channel"] == numbers["buyers_paid"]
        and numbers["payment_starts_answered_200"] == numbers["payment_starts"]
        and all(v == 0 for k, v in numbers.items() if k not in counts)
    )
    return Check(ok, numbers)


_OWED = ("refunding", "duplicate", "mismatch")


def _check_channels(lifecycle: LifecycleRun, facts: StoreFacts) -> Check:
    """Invariant 8: every payment in the channels' bills matched to exactly one order (channel +
    transaction + order) or flagged as owed back; no order paid at a channel is cancelled;
    reconciliation clean."""
    rows: dict[tuple[str, str], list[str]] = {}
    for p in facts.payments:
        if p.event == "paid" and (p.status == "applied" or p.status in _OWED):
            rows.setdefault((p.channel, p.channel_txn_id), []).append(p.order_no)
    unmatched = [c for c in lifecycle.channel_payments if rows.get((c.channel, c.channel_txn_id)) != [c.order_no]]
    cancelled = {row.order_no for row in facts.orders if row.status == OrderStatus.CANCELLED}
    numbers: dict[str, Any] = {
        "channel_payments": len(lifecycle.channel_payments),
        "unmatched_channel_payments": len(unmatched),
        "paid_at_channel_but_cancelled": len({c.order_no for c in lifecycle.channel_payments} & cancelled),
        "notifications": lifecycle.notifications,
        "reconciliation_clean": lifecycle.reconciled_clean,
        "mismatches": lifecycle.mismatches,
    }
    ok = (
        not unmatched
        and numbers["paid_at_channel_but_cancelled"] == 0
        and lifecycle.reconciled_clean
        and len(lifecycle.channel_payments) == len(lifecycle.paid_at_channel)
    )
    return Check(ok, numbers)


def check_lifecycle(
    lifecycle: LifecycleRun, first: LoadSummary, resale: LoadSummary, facts: StoreFacts, stock: int
) -> dict[str, Check]:
    """Invariants 6, 7 and 8 (the last keys of :data:`INVARIANT_TITLES`); ``first`` and ``resale``
    summarize the purchase and resale waves; ``stock`` in units."""
    return {
        "lifecycle_units": _check_lifecycle_units(lifecycle, first, resale, facts, stock),
        "paid_once": _check_paid_once(lifecycle, facts),
        "channels_reconciled": _check_channels(lifecycle, facts),
    }


def _check_trail(measured: Measured) -> Check:
    """Invariant 0: every wave's trail against the plan and the workers' own request counts."""
    numbers = {
        "requests": sum(load.requests for load in measured.loads),
        "waves": len(measured.loads),
        "duplicates": sum(load.duplicates for load in measured.loads),
        "missing": sum(load.missing for load in measured.loads),
    }
    return Check(numbers["duplicates"] == numbers["missing"] == 0, numbers)


def check_all(summaries: Summaries, measured: Measured, stock: int, limit: int) -> dict[str, Check]:
    """Every invariant that applies to the run, keyed as :data:`INVARIANT_TITLES`: the trail's,
    the five over every wave's answers, and the lifecycle's two when orders were paid and resold; ``stock`` and
    ``limit`` in units."""
    facts, lifecycle = measured.facts, measured.lifecycle
    last = summaries.last
    invariants = {"trail_complete": _check_trail(measured)}
    invariants |= check_invariants(summaries.everything, facts, stock, limit, summaries.drained, last.sold_out_seen)
    if lifecycle is not None:
        invariants |= check_lifecycle(lifecycle, summaries.purchase, last, facts, stock)
    return invariants
