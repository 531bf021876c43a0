"""What ``flashsale sale`` measured and what it proves.

- The load plan's shapes (:class:`Kind`, :class:`Shot`, :class:`Job`) and the answer to each
  request (:class:`Outcome`).
- What the stores hold after the sale (:class:`StoreFacts`).
- :func:`summarize` (answers by reason, replays, limit probes, latency) and
  :func:`check_invariants` (the five invariants of the design brief, each with its numbers).
- :func:`build_report` puts it all in one JSON-ready dict; :func:`render` prints that dict as
  rich tables.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

from consumers.realign import RealignReport
from db.models import OrderStatus
from service.order_no import is_valid_order_no
from service.realign_cli import print_reports

ACCEPTED = "accepted"  # the code recorded for a 202


class Kind(StrEnum):
    """What a job of the load plan exercises."""

    BUY = "buy"  # one request, with or without an Idempotency-Key
    RETRY = "retry"  # the same request twice in a row, same key: the second replays the first
    DUPLICATE = "duplicate"  # the same request twice at once, same key: at most one order
    OVER_LIMIT = "over_limit"  # the whole per-user allowance, then one unit more: limit_exceeded


@dataclass(frozen=True, slots=True)
class Shot:
    """One purchase request. ``index`` is its position in the request and outcome lists;
    ``quantity`` in units; ``key`` is the Idempotency-Key (None: the server mints the request id)."""

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
    ``timeout``); ``code`` is ``accepted`` for a 202, else the problem's ``code`` (``http_<status>``
    when the body has none); ``latency`` in seconds."""

    status: int
    code: str
    order_no: str | None
    request_id: str | None
    latency: float


@dataclass(frozen=True, slots=True)
class OrderRow:
    """One row of ``orders`` for the sale's product (``quantity`` in units, ``status`` a code)."""

    order_no: str
    request_id: str
    user_id: str
    quantity: int
    status: int


@dataclass(frozen=True, slots=True)
class StoreFacts:
    """The stores after drain and realignment. Stock in units; ``redis_stock`` None when the key
    is missing; ``quota`` user -> units Redis counts as held; ``dead_letters`` and
    ``queue_messages`` are messages added to the dead-letter queue by this sale and messages
    still ready in the order queue."""

    mysql_stock: int
    mysql_sold: int
    orders: list[OrderRow]
    redis_stock: int | None
    journal_ids: list[str]
    quota: dict[str, int]
    dead_letters: int
    queue_messages: int


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
    ``without_key*`` count requests sent without an Idempotency-Key and their 202s. Latency in
    milliseconds over every request.
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
    latency_ms: dict[str, float] = field(default_factory=dict)

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
        latency_ms=_latency_ms(outcomes),
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
    "realigned": "4. after realignment Redis stock = MySQL stock, journal empty, stock + sold = initial",
    "rejections_leave_no_trace": "5. rejected requests left no trace (MySQL, RabbitMQ, Redis quotas)",
}


def _held_by_user(orders: list[OrderRow]) -> Counter[str]:
    """Units each user holds in MySQL (orders not rejected)."""
    held: Counter[str] = Counter()
    for row in orders:
        if row.status != OrderStatus.REJECTED:
            held[row.user_id] += row.quantity
    return held


def _check_units(summary: LoadSummary, facts: StoreFacts, stock: int, drained: bool) -> Check:
    in_orders = sum(_held_by_user(facts.orders).values())
    ok = (
        drained
        and facts.mysql_sold <= stock
        and in_orders <= stock
        and facts.mysql_sold == in_orders
        and (not summary.sold_out_seen or facts.mysql_sold == stock)
    )
    return Check(ok, {
        "initial_stock": stock,
        "mysql_sold": facts.mysql_sold,
        "units_in_orders": in_orders,
        "accepted_units": summary.accepted_units,
        "demand_exceeded_supply": summary.sold_out_seen,
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


def check_invariants(summary: LoadSummary, facts: StoreFacts, stock: int, limit: int, drained: bool) -> dict[str, Check]:
    """The five invariants (keys of :data:`INVARIANT_TITLES`); ``stock`` and ``limit`` in units."""
    return {
        "sold_within_stock": _check_units(summary, facts, stock, drained),
        "one_order_per_accepted_request": _check_one_order(summary, facts),
        "per_user_limit": _check_user_limit(summary, facts, limit),
        "realigned": _check_realigned(facts, stock),
        "rejections_leave_no_trace": _check_no_trace(summary, facts),
    }


def _orders_by_status(facts: StoreFacts) -> dict[str, int]:
    """Order rows per status label (``pending_payment``, ``rejected``, ...)."""
    return dict(Counter(OrderStatus(row.status).label for row in facts.orders))


def _responses_section(summary: LoadSummary) -> dict[str, Any]:
    """The ``responses`` part of the report."""
    return {
        "sent": summary.sent,
        "accepted_responses": summary.by_code[ACCEPTED],
        "accepted_orders": len(summary.accepted),
        "accepted_units": summary.accepted_units,
        "rejected_by_code": {code: n for code, n in summary.by_code.most_common() if code != ACCEPTED},
        "by_status": {str(status): n for status, n in sorted(summary.by_status.items())},
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


def build_report(
    run: dict[str, Any],
    jobs: list[Job],
    outcomes: list[Outcome],
    facts: StoreFacts,
    realignment: RealignReport,
    timings: dict[str, float | None],
    exit_codes: dict[str, int],
) -> dict[str, Any]:
    """The whole report as one JSON-ready dict.

    ``run`` describes the sale (``run_id``, ``product_id``, ``stock``, ``per_user_limit``,
    ``requests``, ``users``, ...); ``timings`` in seconds: ``token_seconds``, ``load_seconds``,
    ``drain_seconds`` (None = the queue did not drain), ``wall_seconds``; ``exit_codes`` per
    subprocess. ``ok`` is True when every invariant holds; ``logs`` is filled in by the caller.
    """
    summary = summarize(jobs, outcomes)
    drained = timings["drain_seconds"] is not None
    invariants = check_invariants(summary, facts, run["stock"], run["per_user_limit"], drained)
    load_seconds = timings["load_seconds"] or 0.0
    return {
        "run": run,
        "responses": _responses_section(summary),
        "replays": _replays_section(summary),
        "orders_by_status": _orders_by_status(facts),
        "performance": {
            "token_seconds": _seconds(timings["token_seconds"]),
            "load_seconds": _seconds(load_seconds),
            "throughput_rps": round(summary.sent / load_seconds, 1) if load_seconds else None,
            "latency_ms": summary.latency_ms,
            "drain_seconds": _seconds(timings["drain_seconds"]),
            "wall_seconds": _seconds(timings["wall_seconds"]),
        },
        "realignment": msgspec.structs.asdict(realignment),
        "processes": exit_codes,
        "invariants": {name: check.as_dict() for name, check in invariants.items()},
        "ok": all(check.ok for check in invariants.values()),
        "logs": None,
    }


def _label(name: str) -> str:
    return name.replace("_", " ")


def _table(title: str, rows: list[tuple[str, Any]], columns: tuple[str, str] = ("", "value")) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column(columns[0])
    table.add_column(columns[1], justify="right")
    for name, value in rows:
        table.add_row(name, "-" if value is None else str(value))
    return table


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
    return (
        f"[bold]flash sale {run['run_id']}[/]: product {run['product_id']}, stock {run['stock']}, "
        f"limit {run['per_user_limit']}/user, {run['requests']} requests from {run['users']} users, "
        f"concurrency {run['concurrency']}, {where}, {run['consumers']} consumers"
    )


def render(report: dict[str, Any], console: Console) -> None:
    """Print ``report`` (from :func:`build_report`) as rich tables."""
    responses, perf = report["responses"], report["performance"]
    console.print(_headline(report["run"]))
    console.print(_table("responses", [
        ("sent", responses["sent"]),
        ("accepted (202)", responses["accepted_responses"]),
        ("accepted orders (distinct)", responses["accepted_orders"]),
        ("accepted units", responses["accepted_units"]),
        *((f"rejected: {code}", n) for code, n in responses["rejected_by_code"].items()),
    ]))
    console.print(_table("replays, limit probes, requests without key", [(_label(k), v) for k, v in report["replays"].items()]))
    console.print(_table("orders in MySQL", [(_label(k), v) for k, v in sorted(report["orders_by_status"].items())], ("status", "rows")))
    console.print(_table("performance", [
        ("token minting (s)", perf["token_seconds"]),
        ("load phase (s)", perf["load_seconds"]),
        ("throughput (requests/s)", perf["throughput_rps"]),
        *((f"latency {name} (ms)", value) for name, value in perf["latency_ms"].items()),
        ("drain time (s)", perf["drain_seconds"]),
        ("wall clock (s)", perf["wall_seconds"]),
    ]))
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
