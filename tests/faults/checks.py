"""The fault suite's checker: after the load and the fault, wait for a case's sale to settle,
count what the rows and the answers say, and check that it recovered by itself; the result is
the case's :class:`tests.faults.report.Row` (its columns: tests/faults/harness.py)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
from sqlalchemy import bindparam, text

from db.models import OrderStatus
from db.queries import orders as order_queries
from tests.faults import availability, terms
from tests.faults.report import Row
from tests.faults.terms import LIMIT, RECOVERY_TIMEOUT, STRANDED_BOUND, monotonic
from toolkit.sale.plan import Answer
from toolkit.sale.report import LoadSummary, summarize

if TYPE_CHECKING:
    from tests.faults.harness import FaultSale

_RELEASED = [OrderStatus.REJECTED, OrderStatus.CANCELLED]
_HELD_BY_USER = text(
    "SELECT user_id, SUM(quantity) FROM orders WHERE product_id = :p AND status NOT IN :released GROUP BY user_id"
).bindparams(bindparam("released", expanding=True))
_INVENTORY = text("SELECT stock, sold FROM inventory WHERE product_id = :p")


@dataclass
class _Counted:
    """What MySQL holds for the sale, beside what the buyers were told."""

    stock: int
    sold: int
    units: int
    unread: set[str]
    differing: int


async def finish(sale: FaultSale) -> Row:
    """Wait for the load and for the sale to settle; the row of the table."""
    row = Row(sale.fault)
    if sale.load_task is not None:
        await sale.load_task
    if sale.fault_end is None:
        sale.fault_end = sale.fault_start or monotonic()
    quiet = max(sale.fault_end, sale.load_end or monotonic())
    summary = summarize(sale.buyers.jobs, [o or Answer(0, "not_sent", None, None, 0.0) for o in sale.buyers.outcomes])
    settled_at, last = await _wait_settled(sale, [order.request_id for order in summary.accepted.values()], quiet)
    # the stranded-reservation bound runs at least its length past the fault
    while monotonic() < quiet + STRANDED_BOUND + 1.5:
        await asyncio.sleep(0.25)
    ready_now = await sale.ready(timeout=10)
    counted = await _count(sale, summary, row)

    checks: list[str] = []
    if settled_at is None:
        checks.append(f"not settled {RECOVERY_TIMEOUT:.0f}s after the load: {json.dumps(last)}")
    if not ready_now:
        checks.append("API not ready at the end")
    if sale.supervisor.exits:
        checks.append("exited: " + ", ".join(sorted(set(sale.supervisor.exits))))
    dead = await _dead_letter_checks(sale, checks)
    recovered_at = _first_canary_row_after(sale, sale.fault_end)
    if recovered_at is None:
        checks.append("no purchase accepted and written after the fault")
    for check in sale.extra_checks:
        if problem := await check():
            checks.append(problem)
    served = _availability_checks(sale, checks)
    row.share_503, row.longest_503 = served.share, served.longest_worker
    row.recovered = not checks
    row.time_to_recover = None if recovered_at is None else round(max(recovered_at - sale.fault_end, 0.0), 1)
    row.failed_checks = checks + sale.notes
    row.details = {
        "run_id": sale.run_id,
        "answers": dict(Counter(o.code for o in sale.buyers.outcomes if o is not None)),
        "tries": len(sale.buyers.tries),
        "tries_503": sum(1 for t in sale.buyers.tries if t.status == 503),
        **served.details(),
        "mysql_stock": counted.stock,
        "mysql_sold": counted.sold,
        "units_held": counted.units,
        "unreadable_202s": len(counted.unread),
        "conflicting_202s": summary.answer_conflicts,
        "rows_differing_from_202": counted.differing,
        "dead_letters": dead,
        "republished": await sale.republished(),
        "canary_orders": len(sale.canary),
        "canary_longest_wait_for_row": sale.longest_canary_wait(),
        "settled_after_load_seconds": None if settled_at is None else round(settled_at - quiet, 1),
        "process_starts": sale.supervisor.starts(),
        "logs": str(sale.log_dir),
    }
    return row


async def _wait_settled(
    sale: FaultSale, accepted_ids: list[str], quiet: float
) -> tuple[float | None, dict[str, Any] | None]:
    """When the sale settled (None: not within :data:`RECOVERY_TIMEOUT` of ``quiet``) and what
    was still unsettled at the last look: every 202 has its row, Redis = MySQL, the journal and
    the queue empty."""
    last: dict[str, Any] | None = None
    while monotonic() - quiet < RECOVERY_TIMEOUT:
        last = await _unsettled(sale, accepted_ids)
        if last is None:
            return monotonic(), None
        await asyncio.sleep(0.5)
    return None, last


async def _unsettled(sale: FaultSale, accepted_ids: list[str]) -> dict[str, Any] | None:
    """What is not settled yet (None when everything is): rows, journal, Redis = MySQL."""
    assert sale.engine is not None and sale.store is not None
    try:
        present = await sale.present_request_ids(accepted_ids)
        journal = await sale.store.stock.journal(sale.product_id)
        redis_stock = await sale.store.stock.units(sale.product_id)
        quota = await sale.store.stock.quota(sale.product_id)
        async with sale.engine.connect() as conn:
            stock = (await conn.execute(_INVENTORY, {"p": sale.product_id})).one().stock
            held = {
                user_id: int(units)
                for user_id, units in await conn.execute(_HELD_BY_USER, {"p": sale.product_id, "released": _RELEASED})
            }
        depth = await sale.queue_depth()
    except Exception as exc:
        return {"error": repr(exc)[:200]}
    waiting = {
        "without_row": len(accepted_ids) - len(present),
        "journal": len(journal),
        "redis_stock": redis_stock,
        "mysql_stock": stock,
        "quota_mismatches": sum(1 for user in held.keys() | quota.keys() if held.get(user, 0) != quota.get(user, 0)),
        "queued": depth,
    }
    settled = waiting["without_row"] == waiting["journal"] == waiting["quota_mismatches"] == depth == 0
    return None if settled and redis_stock == stock else waiting


async def _count(sale: FaultSale, summary: LoadSummary, row: Row) -> _Counted:
    """Fill ``row``'s counts (accepted, rows, lost, duplicate, no 202, oversold, over-limit,
    stranded) from MySQL's rows of the sale and the answers the buyers got."""
    assert sale.engine is not None
    async with sale.engine.connect() as conn:
        rows = list(await conn.execute(order_queries.OF_PRODUCT, {"p": sale.product_id}))
        stock, sold = (await conn.execute(_INVENTORY, {"p": sale.product_id})).one()
    by_request: dict[str, list[Any]] = {}
    for r in rows:
        by_request.setdefault(r.request_id, []).append(r)
    told = {order.request_id: (order_no, order) for order_no, order in summary.accepted.items()}
    # lost: no row for the 202's request, or GET /orders/{order_no} does not show the order written
    unread = await _unreadable(sale, summary)
    lost = {rid for rid in told if rid not in by_request} | unread
    duplicates = sum(len(found) - 1 for found in by_request.values() if len(found) > 1)
    differing = sum(
        1
        for rid, (_, order) in told.items()
        for r in by_request.get(rid, [])[:1]
        if (r.user_id, r.quantity) != (order.user, order.quantity)
    )
    held: Counter[str] = Counter()
    for r in rows:
        if r.status not in _RELEASED:
            held[r.user_id] += r.quantity
    units = sum(held.values())
    row.accepted = len(summary.accepted)
    row.rows = len(rows)
    row.lost = len(lost)
    row.duplicate = duplicates + summary.answer_conflicts + differing
    row.no_202 = sum(1 for rid in by_request if rid not in told)
    row.oversold = max(units - terms.STOCK, sold - terms.STOCK, 0)
    row.over_limit = sum(1 for units_held in held.values() if units_held > LIMIT)
    row.stranded = len(sale.stranded)
    return _Counted(stock, sold, units, unread, differing)


async def _dead_letter_checks(sale: FaultSale, checks: list[str]) -> dict[str, int]:
    """The sale's messages in the dead-letter queue by kind; a failed check for any of them."""
    try:
        dead = await sale.dead_letters()
    except Exception as exc:
        checks.append(f"dead-letter queue unreadable: {exc!r}")
        return {"error": 1}
    if dead.get("sale") or dead.get("canary"):
        checks.append(f"dead-lettered orders: {dead.get('sale', 0)} of the sale, {dead.get('canary', 0)} canary")
    return dead


def _first_canary_row_after(sale: FaultSale, after: float) -> float | None:
    """When the first canary order sent at or after ``after`` got its row (None: none did)."""
    return next(
        (
            entry["row"]
            for entry in sorted(sale.canary, key=lambda e: e["sent"])
            if entry["sent"] >= after and entry["row"] is not None
        ),
        None,
    )


def _availability_checks(sale: FaultSale, checks: list[str]) -> availability.Availability:
    """The 503s the buyers got, measured against the fault's own recovery and the API's log."""
    assert sale.fault_end is not None
    served = availability.measure(sale.buyers.tries)
    own = sale.recovery if sale.recovery is not None else sale.fault_end - (sale.fault_start or sale.fault_end)
    if problem := availability.verdict(served, own):
        checks.append(problem)
    if silent := availability.silent_windows(served.windows, sale.supervisor.log_text("api")):
        since = silent[0].start - (sale.fault_start or silent[0].start)
        checks.append(f"{len(silent)} 503 windows without a logged cause, the first {since:.1f}s after the fault")
    return served


async def _unreadable(sale: FaultSale, summary: LoadSummary) -> set[str]:
    """Request ids of 202s whose ``GET /orders/{order_no}`` (as the buyer) does not answer
    200 with the order written (a ``queued`` answer comes from Redis: no row yet)."""
    bad: set[str] = set()
    gate = asyncio.Semaphore(16)
    async with httpx.AsyncClient(base_url=sale.url, timeout=15, trust_env=False) as http:

        async def read(order_no: str, request_id: str, user: str) -> None:
            async with gate:
                for _ in range(3):
                    try:
                        response = await http.get(
                            f"/api/v1/orders/{order_no}", headers={"Authorization": sale.buyers.token(user)}
                        )
                    except httpx.HTTPError:
                        await asyncio.sleep(0.5)
                        continue
                    if response.status_code == 200 and response.json().get("status") != "queued":
                        return
                    if response.status_code not in (503,):
                        break
                    await asyncio.sleep(0.5)
                bad.add(request_id)

        await asyncio.gather(
            *(read(order_no, order.request_id, order.user) for order_no, order in summary.accepted.items())
        )
    return bad
