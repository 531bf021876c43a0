"""The sale's invariant checker has teeth: it passes a clean sale and fails each broken invariant (no server)."""

from __future__ import annotations

from dataclasses import replace

from service.domain.order_numbers.format import compose_order_no
from toolkit.sale.facts import SaleOrderRow as OrderRow
from toolkit.sale.facts import StoreFacts
from toolkit.sale.invariants import check_invariants
from toolkit.sale.plan import ACCEPTED, Job, Kind, Shot
from toolkit.sale.plan import Answer as Outcome
from toolkit.sale.report import summarize


def _one_accepted_order() -> tuple[list[Job], list[Outcome], OrderRow]:
    order_no = compose_order_no("FS", "20261130000000", 1, 1)
    jobs = [Job(Kind.BUY, (Shot(0, "u1", 1, "k0"),))]
    outcomes = [Outcome(202, ACCEPTED, order_no, "r" * 32, 0.01)]
    return jobs, outcomes, OrderRow(order_no, "r" * 32, "u1", 1, 0, None)


def _facts(row: OrderRow, **changes) -> StoreFacts:
    facts = StoreFacts(
        mysql_stock=0,
        mysql_sold=1,
        orders=[row],
        payments=[],
        redis_stock=0,
        journal_ids=[],
        quota={"u1": 1},
        dead_letters=0,
        queue_messages=0,
    )
    return replace(facts, **changes)


def test_the_checker_passes_a_clean_sale_and_fails_each_broken_invariant():
    jobs, outcomes, row = _one_accepted_order()
    summary = summarize(jobs, outcomes)

    def verdict(facts: StoreFacts) -> dict[str, bool]:
        return {name: check.ok for name, check in check_invariants(summary, facts, 1, 1, True, True).items()}

    assert all(verdict(_facts(row)).values())
    oversold = _facts(row, mysql_sold=2, orders=[row, replace(row, order_no="X", request_id="s" * 32)])
    assert not verdict(oversold)["sold_within_stock"]
    assert not verdict(_facts(row, orders=[]))["one_order_per_accepted_request"]
    assert not verdict(_facts(row, redis_stock=1))["realigned"]
    assert not verdict(_facts(row, dead_letters=1))["rejections_leave_no_trace"]
    over_limit = _facts(row, orders=[replace(row, quantity=2)], mysql_sold=2, quota={"u1": 2})
    assert not verdict(over_limit)["per_user_limit"]
