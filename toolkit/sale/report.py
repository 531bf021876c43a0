"""The summary numbers of ``flashsale sale``: the answers of a wave counted
(:func:`summarize`: answers by reason, replays, limit probes, requests without a key), latency
percentiles (ms) and throughput (requests/s), and the report's number sections
(:func:`sections`). The invariants are :mod:`toolkit.sale.invariants`; the JSON document and the
tables are :mod:`toolkit.sale.render`.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from db.models import OrderStatus
from toolkit.sale.facts import LifecycleRun, Measured, SaleOrderRow, StoreFacts
from toolkit.sale.plan import ACCEPTED, Answer, Job, Kind, Wave


@dataclass(frozen=True, slots=True)
class AcceptedOrder:
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
    accepted: dict[str, AcceptedOrder]
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
        """Units of the distinct accepted orders."""
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


def _latency_ms(outcomes: list[Answer]) -> dict[str, float]:
    """Latency percentiles ``p50``, ``p95``, ``p99``, ``max`` in milliseconds."""
    ordered = sorted(o.latency for o in outcomes)
    points = {"p50": 0.50, "p95": 0.95, "p99": 0.99, "max": 1.0}
    return {name: round(_percentile(ordered, q) * 1000, 1) for name, q in points.items()}


def _collect_accepted(jobs: list[Job], outcomes: list[Answer]) -> tuple[dict[str, AcceptedOrder], int]:
    """Distinct accepted orders and the number of conflicting 202s (see :class:`LoadSummary`)."""
    accepted: dict[str, AcceptedOrder] = {}
    order_of_request: dict[str, str] = {}
    conflicts = 0
    for job in jobs:
        for shot in job.shots:
            outcome = outcomes[shot.index]
            if outcome.code != ACCEPTED or outcome.order_no is None or outcome.request_id is None:
                continue
            known = accepted.setdefault(outcome.order_no, AcceptedOrder(outcome.request_id, shot.user, shot.quantity))
            if known.request_id != outcome.request_id:
                conflicts += 1
            if order_of_request.setdefault(outcome.request_id, outcome.order_no) != outcome.order_no:
                conflicts += 1
    return accepted, conflicts


def summarize(jobs: list[Job], outcomes: list[Answer]) -> LoadSummary:
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


def combined(*waves: Wave) -> tuple[list[Job], list[Answer]]:
    """The jobs and outcomes of ``waves`` as one plan (for :func:`summarize`): each wave's shot
    indices shifted past the outcomes of the waves before it."""
    jobs: list[Job] = []
    outcomes: list[Answer] = []
    for wave in waves:
        offset = len(outcomes)
        jobs += [
            Job(job.kind, tuple(replace(shot, index=shot.index + offset) for shot in job.shots)) for job in wave.jobs
        ]
        outcomes += wave.outcomes
    return jobs, outcomes


def tally(orders: list[SaleOrderRow], status: OrderStatus, reason: str | None = None) -> tuple[int, int]:
    """Orders and units in ``status`` (and with ``reason`` when given)."""
    rows = [row for row in orders if row.status == status and (reason is None or row.reason == reason)]
    return len(rows), sum(row.quantity for row in rows)


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
    paid_orders, paid_units = tally(facts.orders, OrderStatus.PAID)
    timed_out_orders, timed_out_units = tally(facts.orders, OrderStatus.CANCELLED, "payment_timeout")
    return {
        "pay_share": lifecycle.pay_share,
        "payment_window_seconds": lifecycle.window_seconds,
        "payment_starts": {
            **_wave_numbers(lifecycle.starts),
            "answers": dict(Counter(o.code for o in lifecycle.starts.outcomes).most_common()),
            "abandoned": lifecycle.abandoned,
        },
        "buyers_paying": {
            **_wave_numbers(lifecycle.payments),
            "answers": dict(Counter(o.code for o in lifecycle.payments.outcomes).most_common()),
        },
        "notifications": lifecycle.notifications,
        "paid_orders": paid_orders,
        "paid_units": paid_units,
        "orders_left_unpaid": lifecycle.unpaid,
        "window_wait_seconds": _seconds(lifecycle.wait_seconds),
        "sweep": "one pass in the sale's own process, as flashsale sweep runs it (each channel asked first)",
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
        "reconciliation": {"clean": lifecycle.reconciled_clean, "mismatches": lifecycle.mismatches},
    }


@dataclass(frozen=True, slots=True)
class Summaries:
    """A run's answers counted: ``purchase`` the purchase wave; ``last`` the last wave that bought
    (the resale when there was one, else the purchase wave); ``everything`` every wave that bought
    together; ``drained`` every drain finished."""

    purchase: LoadSummary
    last: LoadSummary
    everything: LoadSummary
    drained: bool


def summarize_run(measured: Measured) -> Summaries:
    """Count the answers of the purchase wave and, after the lifecycle phases, the resale wave."""
    purchase = summarize(measured.purchase.jobs, measured.purchase.outcomes)
    lifecycle = measured.lifecycle
    if lifecycle is None:
        return Summaries(purchase, purchase, purchase, measured.drain_seconds is not None)
    return Summaries(
        purchase=purchase,
        last=summarize(lifecycle.resale.jobs, lifecycle.resale.outcomes),
        everything=summarize(*combined(measured.purchase, lifecycle.resale)),
        drained=measured.drain_seconds is not None and lifecycle.drain_seconds is not None,
    )


def sections(measured: Measured, summaries: Summaries, wall_seconds: float) -> dict[str, Any]:
    """The report's number sections, in report order: ``responses``, ``replays`` (the purchase
    wave's), ``orders_by_status``, ``performance`` (the purchase wave's, seconds, requests/s, ms;
    ``wall_seconds`` from start to report), ``ceiling`` (see :func:`_ceiling_section`) and
    ``lifecycle`` (None without payments)."""
    lifecycle, facts = measured.lifecycle, measured.facts
    performance = {
        "token_seconds": _seconds(measured.token_seconds),
        **_wave_numbers(measured.purchase),
        "drain_seconds": _seconds(measured.drain_seconds),
        "wall_seconds": _seconds(wall_seconds),
    }
    return {
        "responses": _responses_section(summaries.purchase),
        "replays": _replays_section(summaries.purchase),
        "orders_by_status": _orders_by_status(facts),
        "performance": performance,
        "ceiling": _ceiling_section(performance, measured.noop, measured.noop_skipped),
        "lifecycle": None if lifecycle is None else _lifecycle_section(lifecycle, summaries.last, facts),
    }
