"""What ``flashsale sale`` measured and what it proves.

- The load plan's shapes (:class:`Kind`, :class:`Shot`, :class:`Job`), the answer to each
  request (:class:`Outcome`) and one phase's requests and answers (:class:`Wave`).
- What the stores hold after the sale (:class:`StoreFacts`) and everything the sale observed
  (:class:`Measured`, with :class:`LifecycleRun` when orders were paid, let lapse and resold).
- :func:`summarize` (answers by reason, replays, limit probes) and :func:`check_invariants`
  (the five invariants of the design brief, each with its numbers, and two more for the order
  lifecycle: :func:`check_lifecycle`).
- :func:`build_report` puts it all in one JSON-ready dict, the no-op ceiling next to the purchase
  load; :func:`render` prints that dict as rich tables.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

from db.models import OrderStatus
from service.cli.render import print_reports
from service.domain.order_no import is_valid_order_no
from service.domain.realign import RealignReport

ACCEPTED = "accepted"  # the code recorded for a 202


class Kind(StrEnum):
    """What a job of the load plan exercises."""

    BUY = "buy"  # one request, with or without an Idempotency-Key
    RETRY = "retry"  # the same request twice in a row, same key: the second replays the first
    DUPLICATE = "duplicate"  # the same request twice at once, same key: at most one order
    OVER_LIMIT = "over_limit"  # the whole per-user allowance, then one unit more: limit_exceeded
    PAY = "pay"  # a payment channel's signed notification for one order (not a purchase)


@dataclass(frozen=True, slots=True)
class Shot:
    """One request of a plan (a purchase, or a notification for ``user``'s order of ``quantity``).
    ``index`` is its position in the request and outcome lists; ``quantity`` in units; ``key`` is
    the Idempotency-Key (None: the server mints the request id, or no purchase)."""

    index: int
    user: str
    quantity: int
    key: str | None


@dataclass(frozen=True, slots=True)
class Job:
    """Requests one buyer sends together (see :class:`Kind`)."""

    kind: Kind
    shots: tuple[Shot, ...]


@dataclass(frozen=True, slots=True)
class Outcome:
    """The answer to one request. ``status`` 0 = no HTTP answer (``code`` ``connection_error`` or
    ``timeout``); ``code`` is ``accepted`` for a 202, a payment notification's ``result`` for a 200
    (``paid``, ...), else the problem's ``code`` (``http_<status>`` when the body has none);
    ``latency`` in seconds."""

    status: int
    code: str
    order_no: str | None
    request_id: str | None
    latency: float


@dataclass(frozen=True, slots=True)
class Wave:
    """One phase of requests (no-op, purchase, payments, resale): ``outcomes[shot.index]`` answers
    each shot of ``jobs``; ``seconds`` from the first request to the last answer."""

    jobs: list[Job]
    outcomes: list[Outcome]
    seconds: float


@dataclass(frozen=True, slots=True)
class OrderRow:
    """One row of ``orders`` for the sale's product (``quantity`` in units, ``status`` a code,
    ``reason`` of the last change: ``payment_timeout``, ``sold_out``, ...)."""

    order_no: str
    request_id: str
    user_id: str
    quantity: int
    status: int
    reason: str | None


@dataclass(frozen=True, slots=True)
class PaymentRow:
    """One row of ``payments`` for an order of the sale's product (``event`` ``paid``/``refunded``;
    ``status`` ``applied``, ``duplicate``, ``refunding``, ...)."""

    order_no: str
    event: str
    status: str


@dataclass(frozen=True, slots=True)
class StoreFacts:
    """The stores after drain and realignment. Stock in units; ``redis_stock`` None when the key
    is missing; ``quota`` user -> units Redis counts as held; ``dead_letters`` and
    ``queue_messages`` are messages added to the dead-letter queue by this sale and messages
    still ready in the order queue."""

    mysql_stock: int
    mysql_sold: int
    orders: list[OrderRow]
    payments: list[PaymentRow]
    redis_stock: int | None
    journal_ids: list[str]
    quota: dict[str, int]
    dead_letters: int
    queue_messages: int


@dataclass(frozen=True, slots=True)
class LifecycleRun:
    """What the lifecycle phases did (``flashsale sale --pay-share``), after the first drain.

    ``payments``: one ``paid`` notification per order of ``notified`` (``notified[shot.index]``);
    ``unpaid``: orders left to lapse; ``wait_seconds``: waiting for the ``window_seconds``
    payment window to lapse; ``swept``: orders the payment-timeout sweep cancelled; ``returned``
    and ``on_sale``: MySQL stock gained by the sweep and MySQL stock after it (units); ``resale``:
    the new buyers' wave; ``drain_seconds``: the second drain (None = the queue did not drain).
    """

    pay_share: float
    window_seconds: int
    payments: Wave
    notified: list[str]
    unpaid: int
    wait_seconds: float
    swept: int
    returned: int
    on_sale: int
    resale: Wave
    drain_seconds: float | None


@dataclass(frozen=True, slots=True)
class Measured:
    """Everything the sale observed. ``noop`` is the framework-ceiling wave (None: skipped, for
    the reason in ``noop_skipped``); ``lifecycle`` None when orders were not paid and resold.
    Seconds for the timings; ``drain_seconds`` None = the queue did not drain."""

    purchase: Wave
    noop: Wave | None
    noop_skipped: str | None
    lifecycle: LifecycleRun | None
    token_seconds: float
    drain_seconds: float | None
    realignment: RealignReport
    facts: StoreFacts


@dataclass(frozen=True, slots=True)
class Accepted:
    """What a 202 told the buyer about one order."""

    request_id: str
    user: str
    quantity: int


@dataclass
class LoadSummary:
    """The answers of the load phase.

    ``accepted`` maps each distinct order number answered with 202 to what the buyer was told;
    ``answer_conflicts`` counts 202s whose order number and request id disagree with an earlier
    202 (one request, two orders, or one order, two requests); ``retries``/``retries_same`` count
    retries after a 202 and those answered with the same order number; ``duplicates_*`` describe
    pairs sent at once with one key; ``limit_probes`` counts over-limit attempts after the
    allowance was granted, ``limit_probes_refused``/``_accepted`` those answered
    ``limit_exceeded``/202;
    ``without_key*`` count requests sent without an Idempotency-Key and their 202s.
    """

    sent: int
    by_code: Counter[str]
    by_status: Counter[int]
    accepted: dict[str, Accepted]
    answer_conflicts: int
    retries: int = 0
    retries_same: int = 0
    duplicate_pairs: int = 0
    duplicates_both_accepted: int = 0
    duplicates_in_progress: int = 0
    limit_probes: int = 0
    limit_probes_refused: int = 0
    limit_probes_accepted: int = 0
    without_key: int = 0
    without_key_accepted: int = 0

    @property
    def accepted_units(self) -> int:
        return sum(a.quantity for a in self.accepted.values())

    @property
    def sold_out_seen(self) -> bool:
        """Some buyer was told ``sold_out``: demand exceeded supply."""
        return self.by_code["sold_out"] > 0


def _percentile(ordered: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list (0.0 when empty)."""
    if not ordered:
        return 0.0
    return ordered[max(math.ceil(fraction * len(ordered)) - 1, 0)]


def _latency_ms(outcomes: list[Outcome]) -> dict[str, float]:
    """Latency percentiles ``p50``, ``p95``, ``p99``, ``max`` in milliseconds."""
    ordered = sorted(o.latency for o in outcomes)
    points = {"p50": 0.50, "p95": 0.95, "p99": 0.99, "max": 1.0}
    return {name: round(_percentile(ordered, q) * 1000, 1) for name, q in points.items()}


def _collect_accepted(jobs: list[Job], outcomes: list[Outcome]) -> tuple[dict[str, Accepted], int]:
    """Distinct accepted orders and the number of conflicting 202s (see :class:`LoadSummary`)."""
    accepted: dict[str, Accepted] = {}
    order_of_request: dict[str, str] = {}
    conflicts = 0
    for job in jobs:
        for shot in job.shots:
            outcome = outcomes[shot.index]
            if outcome.code != ACCEPTED or outcome.order_no is None or outcome.request_id is None:
                continue
            known = accepted.setdefault(outcome.order_no, Accepted(outcome.request_id, shot.user, shot.quantity))
            if known.request_id != outcome.request_id:
                conflicts += 1
            if order_of_request.setdefault(outcome.request_id, outcome.order_no) != outcome.order_no:
                conflicts += 1
    return accepted, conflicts


def summarize(jobs: list[Job], outcomes: list[Outcome]) -> LoadSummary:
    """Summarize the answers; ``outcomes[shot.index]`` is the answer to each shot of ``jobs``."""
    accepted, conflicts = _collect_accepted(jobs, outcomes)
    summary = LoadSummary(
        sent=len(outcomes),
        by_code=Counter(o.code for o in outcomes),
        by_status=Counter(o.status for o in outcomes),
        accepted=accepted,
        answer_conflicts=conflicts,
    )
    for job in jobs:
        for shot in job.shots:
            if shot.key is None:
                summary.without_key += 1
                summary.without_key_accepted += outcomes[shot.index].code == ACCEPTED
        if len(job.shots) != 2:
            continue
        first, second = (outcomes[shot.index] for shot in job.shots)
        if job.kind is Kind.RETRY and first.code == ACCEPTED:
            summary.retries += 1
            summary.retries_same += second.code == ACCEPTED and second.order_no == first.order_no
        elif job.kind is Kind.DUPLICATE:
            summary.duplicate_pairs += 1
            codes = {first.code, second.code}
            summary.duplicates_both_accepted += codes == {ACCEPTED}
            summary.duplicates_in_progress += codes == {ACCEPTED, "request_in_progress"}
        elif job.kind is Kind.OVER_LIMIT and first.code == ACCEPTED:
            summary.limit_probes += 1
            summary.limit_probes_refused += second.code == "limit_exceeded"
            summary.limit_probes_accepted += second.code == ACCEPTED
    return summary


def combined(*waves: Wave) -> tuple[list[Job], list[Outcome]]:
    """The jobs and outcomes of ``waves`` as one plan (for :func:`summarize`): each wave's shot
    indices shifted past the outcomes of the waves before it."""
    jobs: list[Job] = []
    outcomes: list[Outcome] = []
    for wave in waves:
        offset = len(outcomes)
        jobs += [Job(job.kind, tuple(replace(shot, index=shot.index + offset) for shot in job.shots)) for job in wave.jobs]
        outcomes += wave.outcomes
    return jobs, outcomes


@dataclass(frozen=True, slots=True)
class Check:
    """One invariant: ``ok`` and the numbers behind it."""

    ok: bool
    numbers: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, **self.numbers}


INVARIANT_TITLES = {
    "sold_within_stock": "1. the queue drained; units sold <= stock, and = stock when demand exceeded supply",
    "one_order_per_accepted_request": "2. every 202 has exactly one order row; no request id or order number twice",
    "per_user_limit": "3. no user holds more than the per-user limit (nor was granted more)",
    "realigned": "4. after the final realignment Redis stock = MySQL stock, journal empty, stock + sold = initial",
    "rejections_leave_no_trace": (
        "5. rejected requests left no trace (MySQL, RabbitMQ); Redis quotas = units each user holds"
        " (orders not cancelled/rejected)"
    ),
    "lifecycle_units": (
        "6. payment timeouts: stock + sold = initial; sold = paid + resold (pending) units; every unpaid"
        " order swept; the returned units resold when demand exceeded supply"
    ),
    "paid_once": "7. every notification answered paid once; no order paid twice; no cancelled order paid",
}

_NOT_HELD = (OrderStatus.REJECTED, OrderStatus.CANCELLED)  # orders whose units went back (or never left)


def _held_by_user(orders: list[OrderRow]) -> Counter[str]:
    """Units each user holds in MySQL (orders not rejected or cancelled)."""
    held: Counter[str] = Counter()
    for row in orders:
        if row.status not in _NOT_HELD:
            held[row.user_id] += row.quantity
    return held


def _tally(orders: list[OrderRow], status: OrderStatus, reason: str | None = None) -> tuple[int, int]:
    """Orders and units in ``status`` (and with ``reason`` when given)."""
    rows = [row for row in orders if row.status == status and (reason is None or row.reason == reason)]
    return len(rows), sum(row.quantity for row in rows)


def _check_units(summary: LoadSummary, facts: StoreFacts, stock: int, drained: bool, demand_exceeded: bool) -> Check:
    """Invariant 1; ``demand_exceeded``: the last wave was told ``sold_out``."""
    in_orders = sum(_held_by_user(facts.orders).values())
    ok = (
        drained
        and facts.mysql_sold <= stock
        and in_orders <= stock
        and facts.mysql_sold == in_orders
        and (not demand_exceeded or facts.mysql_sold == stock)
    )
    return Check(ok, {
        "initial_stock": stock,
        "mysql_sold": facts.mysql_sold,
        "units_in_orders": in_orders,
        "accepted_units": summary.accepted_units,
        "demand_exceeded_supply": demand_exceeded,
        "drained": drained,
    })


def _check_one_order(summary: LoadSummary, facts: StoreFacts) -> Check:
    rows_by_order_no = {row.order_no: row for row in facts.orders}
    missing = [no for no in summary.accepted if no not in rows_by_order_no]
    unknown = [row for row in facts.orders if row.order_no not in summary.accepted]
    mismatched = [
        row for row in facts.orders
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
    return Check(over == 0 and summary.limit_probes_accepted == 0, {
        "per_user_limit": limit,
        "buyers": len(held),
        "max_units_held": max(held.values(), default=0),
        "users_over_limit": over,
        "limit_probes_after_202": summary.limit_probes,
        "limit_probes_accepted": summary.limit_probes_accepted,
    })


def _check_realigned(facts: StoreFacts, stock: int) -> Check:
    request_ids = {row.request_id for row in facts.orders}
    resolved_in_journal = sum(1 for request_id in facts.journal_ids if request_id in request_ids)
    ok = (
        facts.redis_stock == facts.mysql_stock
        and resolved_in_journal == 0
        and not facts.journal_ids
        and facts.mysql_stock + facts.mysql_sold == stock
    )
    return Check(ok, {
        "redis_stock": facts.redis_stock,
        "mysql_stock": facts.mysql_stock,
        "mysql_sold": facts.mysql_sold,
        "initial_stock": stock,
        "journal_entries": len(facts.journal_ids),
        "resolved_in_journal": resolved_in_journal,
    })


def _check_no_trace(summary: LoadSummary, facts: StoreFacts) -> Check:
    held = _held_by_user(facts.orders)
    quota_mismatches = sum(1 for user in held.keys() | facts.quota.keys() if held[user] != facts.quota.get(user, 0))
    ok = (
        len(facts.orders) == len(summary.accepted)
        and facts.dead_letters == 0
        and facts.queue_messages == 0
        and quota_mismatches == 0
    )
    return Check(ok, {
        "order_rows": len(facts.orders),
        "accepted_orders": len(summary.accepted),
        "dead_lettered": facts.dead_letters,
        "queue_messages": facts.queue_messages,
        "redis_quota_mismatches": quota_mismatches,
    })


def check_invariants(
    summary: LoadSummary, facts: StoreFacts, stock: int, limit: int, drained: bool, demand_exceeded: bool
) -> dict[str, Check]:
    """The five invariants of the brief (the first keys of :data:`INVARIANT_TITLES`) over every
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
    _, paid_units = _tally(facts.orders, OrderStatus.PAID)
    _, pending_units = _tally(facts.orders, OrderStatus.PENDING_PAYMENT)
    cancelled_orders, _ = _tally(facts.orders, OrderStatus.CANCELLED)
    timed_out_orders, returned_units = _tally(facts.orders, OrderStatus.CANCELLED, "payment_timeout")
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
    return Check(ok, {
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
    })


def _check_paid_once(lifecycle: LifecycleRun, facts: StoreFacts) -> Check:
    """Invariant 7: the notifications' answers against the ``orders`` and ``payments`` tables."""
    notified = set(lifecycle.notified)
    paid = {row.order_no for row in facts.orders if row.status == OrderStatus.PAID}
    cancelled = {row.order_no for row in facts.orders if row.status == OrderStatus.CANCELLED}
    applied = Counter(p.order_no for p in facts.payments if p.event == "paid" and p.status == "applied")
    numbers = {
        "notifications": len(lifecycle.notified),
        "answered_paid": sum(1 for o in lifecycle.payments.outcomes if o.code == "paid"),
        "paid_orders": len(paid),
        "orders_notified_twice": len(lifecycle.notified) - len(notified),
        "notified_not_paid": len(notified - paid),
        "paid_not_notified": len(paid - notified),
        "paid_without_applied_payment": len(paid - applied.keys()),
        "orders_paid_twice": sum(1 for n in applied.values() if n > 1),
        "cancelled_with_payment": len(cancelled & {p.order_no for p in facts.payments}),
    }
    counts = ("notifications", "answered_paid", "paid_orders")
    ok = numbers["answered_paid"] == numbers["notifications"] and all(v == 0 for k, v in numbers.items() if k not in counts)
    return Check(ok, numbers)


def check_lifecycle(
    lifecycle: LifecycleRun, first: LoadSummary, resale: LoadSummary, facts: StoreFacts, stock: int
) -> dict[str, Check]:
    """Invariants 6 and 7 (the last keys of :data:`INVARIANT_TITLES`); ``first`` and ``resale``
    summarize the purchase and resale waves; ``stock`` in units."""
    return {
        "lifecycle_units": _check_lifecycle_units(lifecycle, first, resale, facts, stock),
        "paid_once": _check_paid_once(lifecycle, facts),
    }


def _orders_by_status(facts: StoreFacts) -> dict[str, int]:
    """Order rows per status label (``pending_payment``, ``rejected``, ...)."""
    return dict(Counter(OrderStatus(row.status).label for row in facts.orders))


def _by_status(counts: Counter[int]) -> dict[str, int]:
    """Answers per HTTP status (``"0"`` = no HTTP answer), in status order."""
    return {str(status): n for status, n in sorted(counts.items())}


def _rejected_by_code(summary: LoadSummary) -> dict[str, int]:
    """Answers other than 202 per code, most frequent first."""
    return {code: n for code, n in summary.by_code.most_common() if code != ACCEPTED}


def _responses_section(summary: LoadSummary) -> dict[str, Any]:
    """The ``responses`` part of the report."""
    return {
        "sent": summary.sent,
        "accepted_responses": summary.by_code[ACCEPTED],
        "accepted_orders": len(summary.accepted),
        "accepted_units": summary.accepted_units,
        "rejected_by_code": _rejected_by_code(summary),
        "by_status": _by_status(summary.by_status),
    }


def _replays_section(summary: LoadSummary) -> dict[str, int]:
    """The ``replays`` part of the report: retries, concurrent duplicates, limit probes, and
    requests without an Idempotency-Key."""
    return {
        "retries_after_202": summary.retries,
        "retries_same_order_no": summary.retries_same,
        "concurrent_duplicate_pairs": summary.duplicate_pairs,
        "concurrent_both_202_same_order_no": summary.duplicates_both_accepted,
        "concurrent_202_and_in_progress": summary.duplicates_in_progress,
        "limit_probes_after_202": summary.limit_probes,
        "limit_probes_limit_exceeded": summary.limit_probes_refused,
        "requests_without_key": summary.without_key,
        "requests_without_key_202": summary.without_key_accepted,
    }


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else round(numerator / denominator, 3)


def _wave_numbers(wave: Wave) -> dict[str, Any]:
    """``requests``, ``load_seconds``, ``throughput_rps`` (requests/s) and ``latency_ms`` of one wave."""
    sent = len(wave.outcomes)
    return {
        "requests": sent,
        "load_seconds": _seconds(wave.seconds),
        "throughput_rps": round(sent / wave.seconds, 1) if wave.seconds else None,
        "latency_ms": _latency_ms(wave.outcomes),
    }


def _ceiling_section(purchase: dict[str, Any], noop: Wave | None, skipped: str | None) -> dict[str, Any]:
    """The ``ceiling`` part: the no-op wave's numbers (as in ``performance``), its answers by
    status, and ``purchase_over_noop`` ratios of throughput and latency p50/p95/p99; or
    ``{"skipped": why}``. ``purchase`` is the ``performance`` part."""
    if noop is None:
        return {"skipped": skipped}
    numbers = _wave_numbers(noop)
    ratios = {"throughput": _ratio(purchase["throughput_rps"], numbers["throughput_rps"])}
    for point in ("p50", "p95", "p99"):
        ratios[f"latency_{point}"] = _ratio(purchase["latency_ms"][point], numbers["latency_ms"][point])
    return {**numbers, "by_status": _by_status(Counter(o.status for o in noop.outcomes)), "purchase_over_noop": ratios}


def _lifecycle_section(lifecycle: LifecycleRun, resale: LoadSummary, facts: StoreFacts) -> dict[str, Any]:
    """The ``lifecycle`` part: payments (answers by result), timeouts, stock returned, resale."""
    paid_orders, paid_units = _tally(facts.orders, OrderStatus.PAID)
    timed_out_orders, timed_out_units = _tally(facts.orders, OrderStatus.CANCELLED, "payment_timeout")
    payments = lifecycle.payments
    return {
        "pay_share": lifecycle.pay_share,
        "payment_window_seconds": lifecycle.window_seconds,
        "payments": {**_wave_numbers(payments), "answers": dict(Counter(o.code for o in payments.outcomes).most_common())},
        "paid_orders": paid_orders,
        "paid_units": paid_units,
        "orders_left_unpaid": lifecycle.unpaid,
        "window_wait_seconds": _seconds(lifecycle.wait_seconds),
        "sweep": "service.domain.lifecycle.expire_unpaid, in-process, once",
        "swept_orders": lifecycle.swept,
        "cancelled_payment_timeout_orders": timed_out_orders,
        "cancelled_payment_timeout_units": timed_out_units,
        "stock_returned": lifecycle.returned,
        "on_sale_at_resale": lifecycle.on_sale,
        "resale": {
            **_wave_numbers(lifecycle.resale),
            "users": len({shot.user for job in lifecycle.resale.jobs for shot in job.shots}),
            "accepted_orders": len(resale.accepted),
            "resold_units": resale.accepted_units,
            "rejected_by_code": _rejected_by_code(resale),
            "drain_seconds": _seconds(lifecycle.drain_seconds),
        },
    }


def build_report(run: dict[str, Any], measured: Measured, wall_seconds: float, exit_codes: dict[str, int]) -> dict[str, Any]:
    """The whole report as one JSON-ready dict.

    ``run`` describes the sale (``run_id``, ``product_id``, ``stock``, ``per_user_limit``,
    ``requests``, ``users``, ``pay_share``, ...); ``wall_seconds`` from start to report;
    ``exit_codes`` per subprocess. ``responses``, ``replays`` and ``performance`` are the
    purchase wave's; ``ceiling`` the no-op wave's (see :func:`_ceiling_section`); ``lifecycle``
    None without payments. The invariants span every wave. ``ok`` is True when every invariant
    holds; ``logs`` is filled in by the caller.
    """
    purchase = summarize(measured.purchase.jobs, measured.purchase.outcomes)
    lifecycle = measured.lifecycle
    last, everything, drained = purchase, purchase, measured.drain_seconds is not None
    if lifecycle is not None:
        last = summarize(lifecycle.resale.jobs, lifecycle.resale.outcomes)
        everything = summarize(*combined(measured.purchase, lifecycle.resale))
        drained = drained and lifecycle.drain_seconds is not None
    facts, stock = measured.facts, run["stock"]
    invariants = check_invariants(everything, facts, stock, run["per_user_limit"], drained, last.sold_out_seen)
    if lifecycle is not None:
        invariants |= check_lifecycle(lifecycle, purchase, last, facts, stock)
    performance = {
        "token_seconds": _seconds(measured.token_seconds),
        **_wave_numbers(measured.purchase),
        "drain_seconds": _seconds(measured.drain_seconds),
        "wall_seconds": _seconds(wall_seconds),
    }
    return {
        "run": run,
        "responses": _responses_section(purchase),
        "replays": _replays_section(purchase),
        "orders_by_status": _orders_by_status(facts),
        "performance": performance,
        "ceiling": _ceiling_section(performance, measured.noop, measured.noop_skipped),
        "lifecycle": None if lifecycle is None else _lifecycle_section(lifecycle, last, facts),
        "realignment": msgspec.structs.asdict(measured.realignment),
        "processes": exit_codes,
        "invariants": {name: check.as_dict() for name, check in invariants.items()},
        "ok": all(check.ok for check in invariants.values()),
        "logs": None,
    }


def _label(name: str) -> str:
    return name.replace("_", " ")


def _table(title: str, rows: list[tuple[Any, ...]], columns: tuple[str, ...] = ("", "value")) -> Table:
    """A table of ``rows`` (one value per column; None shows as ``-``), values right-aligned."""
    table = Table(title=title, title_justify="left")
    table.add_column(columns[0])
    for column in columns[1:]:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*("-" if value is None else str(value) for value in row))
    return table


def _performance_table(perf: dict[str, Any], ceiling: dict[str, Any]) -> Table:
    """The purchase wave next to the no-op ceiling (``-`` where there is no such number)."""
    noop_latency, ratios = ceiling.get("latency_ms", {}), ceiling.get("purchase_over_noop", {})
    latency = [
        (f"latency {point} (ms)", value, noop_latency.get(point), ratios.get(f"latency_{point}"))
        for point, value in perf["latency_ms"].items()
    ]
    return _table("performance", [
        ("requests", perf["requests"], ceiling.get("requests"), None),
        ("load phase (s)", perf["load_seconds"], ceiling.get("load_seconds"), None),
        ("throughput (requests/s)", perf["throughput_rps"], ceiling.get("throughput_rps"), ratios.get("throughput")),
        *latency,
        ("token minting (s)", perf["token_seconds"], None, None),
        ("drain time (s)", perf["drain_seconds"], None, None),
        ("wall clock (s)", perf["wall_seconds"], None, None),
    ], ("", "purchase", "no-op (ceiling)", "purchase / no-op"))


def _rows(section: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``section`` as (label, value) rows; a nested dict's keys are prefixed with its own label."""
    rows: list[tuple[str, Any]] = []
    for key, value in section.items():
        if isinstance(value, dict):
            rows += _rows(value, f"{prefix}{_label(key)}: ")
        else:
            rows.append((f"{prefix}{_label(key)}", value))
    return rows


def _invariants_table(invariants: dict[str, dict[str, Any]]) -> Table:
    table = Table(title="invariants", title_justify="left", show_lines=True)
    table.add_column("invariant")
    table.add_column("result", justify="center")
    table.add_column("numbers")
    for name, check in invariants.items():
        result = "[bold green]PASS[/]" if check["ok"] else "[bold red]FAIL[/]"
        numbers = "\n".join(f"{_label(key)}: {value}" for key, value in check.items() if key != "ok")
        table.add_row(INVARIANT_TITLES[name], result, numbers)
    return table


def _headline(run: dict[str, Any]) -> str:
    where = f"{run['workers']} API workers" if run["isolated"] else f"API at {run['url']}"
    lifecycle = f", pay share {run['pay_share']} (window {run['payment_window_seconds']}s)" if run["pay_share"] else ""
    return (
        f"[bold]flash sale {run['run_id']}[/]: product {run['product_id']}, stock {run['stock']}, "
        f"limit {run['per_user_limit']}/user, {run['requests']} requests from {run['users']} users, "
        f"concurrency {run['concurrency']}, {where}, {run['consumers']} consumers, "
        f"{run['noop_requests']} no-op requests{lifecycle}"
    )


def render(report: dict[str, Any], console: Console) -> None:
    """Print ``report`` (from :func:`build_report`) as rich tables."""
    responses, ceiling = report["responses"], report["ceiling"]
    console.print(_headline(report["run"]))
    console.print(_table("responses", [
        ("sent", responses["sent"]),
        ("accepted (202)", responses["accepted_responses"]),
        ("accepted orders (distinct)", responses["accepted_orders"]),
        ("accepted units", responses["accepted_units"]),
        *((f"rejected: {code}", n) for code, n in responses["rejected_by_code"].items()),
    ]))
    console.print(_table("replays, limit probes, requests without key", _rows(report["replays"])))
    console.print(_table("orders in MySQL", [(_label(k), v) for k, v in sorted(report["orders_by_status"].items())], ("status", "rows")))
    console.print(_performance_table(report["performance"], ceiling))
    if "skipped" in ceiling:
        console.print(f"no-op ceiling skipped: {ceiling['skipped']}")
    elif set(ceiling["by_status"]) != {"202"}:
        console.print(f"[yellow]no-op answers by status:[/] {ceiling['by_status']}")
    if report["lifecycle"] is not None:
        console.print(_table("order lifecycle: payments, payment timeout, resale", _rows(report["lifecycle"])))
    elif report["run"]["pay_share"]:
        console.print("[yellow]order lifecycle not run: the queue did not drain after the purchase wave[/]")
    print_reports([RealignReport(**report["realignment"])], False, console)
    console.print(_invariants_table(report["invariants"]))
    codes = ", ".join(f"{name} {code}" for name, code in report["processes"].items())
    console.print(f"process exit codes: {codes}")
    failed = [name for name, check in report["invariants"].items() if not check["ok"]]
    if failed:
        console.print(f"[bold red]{len(failed)} invariant(s) FAILED:[/] {', '.join(failed)}")
    else:
        console.print("[bold green]all invariants hold[/]")
    if report["logs"]:
        console.print(f"process logs: {report['logs']}")
