"""The fairness figures of a crowd sale (``flashsale sale --waiting-room`` or ``--crowd``), the
same for a run with the room and one without it: units per distinct buyer, the scripted buyers'
share of units against their share of buyers, how far the order in which buyers got their turn
strays from the order they came in, and how long after the last unit the buyers still waiting
were told ``sold_out``. Plain computations over :class:`~toolkit.sale.crowd.CrowdRun`.

"Got their turn" is, with the room, the admission (dated by the server: the token's expiry minus
its lifetime); without it, the first ``202``. "Came in" is, with the room, when the first join
was answered (the server had put the buyer in line by then: the time a join waited for a
connection of the sale's own client is not the room's doing); without it, the arrival (there is
no line: whoever came first was first). Every buyer who came in before the room opened (the
sale's opening plus the room's opening draw) ties with every other such buyer (the room draws
their order by lottery), and comes before every later one.
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_right, insort
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from toolkit.sale.crowd import Behaviour, CrowdRun, Trail
from toolkit.sale.plan import ACCEPTED

SHARE_SIGMAS = 3.0
"""How many standard deviations of a fair draw the scripted buyers' share of units may exceed
their share of buyers by before it counts as an edge (a fair lottery over few units strays)."""
TOLD_SLACK = 1.0
"""Seconds a waiting buyer may be told ``sold_out`` later than its longest poll interval after
the last unit (the poll in flight, the answer's way back)."""


def discordant_pairs(pairs: Sequence[tuple[float, float]]) -> tuple[int, int]:
    """For (came-in key, turn key) pairs: how many pairs of buyers got their turn in the reverse
    of the order they came in, and how many pairs had an order at all (ties in the came-in key
    are not ordered; ties in the turn key are not reversed). Their ratio is the normalised
    Kendall tau distance (0: the same order, 1: reversed)."""
    ordered = sorted(pairs)
    seen: list[float] = []  # turn keys of the buyers who came in strictly earlier
    discordant = comparable = 0
    start = 0
    while start < len(ordered):
        end = start
        while end < len(ordered) and ordered[end][0] == ordered[start][0]:
            end += 1
        group = ordered[start:end]
        for _, turn in group:
            discordant += len(seen) - bisect_right(seen, turn)
            comparable += len(seen)
        for _, turn in group:
            insort(seen, turn)
        start = end
    return discordant, comparable


def displacements(pairs: Sequence[tuple[float, float]]) -> list[int]:
    """How many places each buyer moved between the came-in order and the turn order (ties in
    either key broken by the other key, so a tie moves nobody)."""
    by_came = sorted(range(len(pairs)), key=lambda i: pairs[i])
    by_turn = sorted(range(len(pairs)), key=lambda i: (pairs[i][1], pairs[i][0]))
    turn_rank = {index: rank for rank, index in enumerate(by_turn)}
    return [abs(rank - turn_rank[index]) for rank, index in enumerate(by_came)]


def fair_share_bound(share: float, draws: int, population: int) -> float:
    """The largest share of ``draws`` units a group holding ``share`` of ``population`` buyers
    gets from a fair draw without luck beyond :data:`SHARE_SIGMAS` standard deviations (the
    hypergeometric standard deviation of the share; no slack when every buyer gets a unit)."""
    if draws <= 0 or population <= 1 or draws >= population:
        return share
    sd = math.sqrt(share * (1 - share) / draws * (population - draws) / (population - 1))
    return share + SHARE_SIGMAS * sd


@dataclass(frozen=True, slots=True)
class BuyerOutcome:
    """What one buyer ended with: distinct orders accepted (``units``, one each), when it came in
    (``early``: before the opening, with the room before it opened; ``came_in``, see above;
    ``arrived``: when it first acted), when it got its turn (``turn``: seconds, None when never),
    when it was first told ``sold_out`` (None: never) and when it stopped trying (``done``: its
    unit, a final answer or leaving; None: never)."""

    behaviour: Behaviour
    units: int
    early: bool
    came_in: float
    arrived: float
    turn: float | None
    told_sold_out: float | None
    done: float | None
    left: bool


def admitted_at(run: CrowdRun, expires_at_ms: int) -> float:
    """When the server admitted a token expiring at ``expires_at_ms`` (epoch ms), in epoch seconds."""
    return expires_at_ms / 1000 - run.token_seconds


def outcome_of(run: CrowdRun, trail: Trail) -> BuyerOutcome:
    """One buyer's :class:`BuyerOutcome`."""
    accepted = [p for p in trail.purchases if p.answer.code == ACCEPTED]
    units = len({p.answer.order_no for p in accepted})
    if run.room:
        admissions = [t for t in trail.told() if t.state == "admitted" and t.admission_expires_at is not None]
        turn = admitted_at(run, admissions[0].admission_expires_at or 0) if admissions else None
    else:
        turn = min((p.answer.finished for p in accepted), default=None)
    came_in = trail.joins[0].at if run.room and trail.joins else trail.arrived
    told = [t.at for t in trail.told() if t.state == "sold_out"]
    told += [p.answer.finished for p in trail.purchases if p.answer.code == "sold_out"]
    told_sold_out = min(told, default=None)
    final = [t.at for t in trail.told() if t.state in ("sold_out", "closed")]
    final += [p.answer.finished for p in accepted]
    ends = [moment for moment in (min(final, default=None), trail.left) if moment is not None]
    return BuyerOutcome(
        trail.buyer.behaviour,
        units,
        came_in < run.opened + (run.opening_draw_ms / 1000 if run.room else 0.0),
        came_in,
        trail.arrived,
        turn,
        told_sold_out,
        min(ends, default=None),
        trail.left is not None,
    )


def _order_figures(outcomes: list[BuyerOutcome]) -> dict[str, Any]:
    """Came-in order against turn order, over the buyers who got a turn."""
    turns = sum(1 for o in outcomes if o.turn is not None)
    late = [(o.came_in, o.turn) for o in outcomes if o.turn is not None and not o.early]
    discordant, comparable = discordant_pairs(late)
    moved = displacements(late)
    early_turns = [turn for early, turn in ((o.early, o.turn) for o in outcomes) if early and turn is not None]
    last_early = max(early_turns, default=None)
    return {
        "buyers_with_a_turn": turns,
        "after_opening": {
            "buyers": len(late),
            "kendall_tau_distance": round(discordant / comparable, 4) if comparable else None,
            "discordant_pairs": discordant,
            "pairs": comparable,
            "max_displacement": max(moved, default=0),
            "mean_displacement": round(statistics.fmean(moved), 2) if moved else 0.0,
        },
        "late_turn_before_an_early_buyer": sum(1 for _, turn in late if last_early is not None and turn < last_early),
    }


def _share_figures(outcomes: list[BuyerOutcome]) -> dict[str, Any]:
    """Units per distinct buyer, and the scripted buyers' share of units against their share of
    buyers (all, and those who stayed until told: impatient buyers who left had no turn to take)."""
    units = sum(o.units for o in outcomes)
    scripted = [o for o in outcomes if o.behaviour is Behaviour.SCRIPTED]
    stayed = [o for o in outcomes if not o.left]
    scripted_stayed = sum(1 for o in stayed if o.behaviour is Behaviour.SCRIPTED)
    share_stayed = scripted_stayed / len(stayed) if stayed else 0.0
    holders = [o.units for o in outcomes if o.units]
    return {
        "units": units,
        "buyers": len(outcomes),
        "buyers_with_units": len(holders),
        "units_per_buying_buyer": round(units / len(holders), 3) if holders else None,
        "max_units_one_buyer": max(holders, default=0),
        "units_by_behaviour": {b.value: sum(o.units for o in outcomes if o.behaviour is b) for b in Behaviour},
        "buyers_by_behaviour": dict(Counter(o.behaviour.value for o in outcomes)),
        "scripted_share_of_buyers": round(len(scripted) / len(outcomes), 4) if outcomes else None,
        "scripted_share_of_buyers_who_stayed": round(share_stayed, 4),
        "scripted_share_of_units": round(sum(o.units for o in scripted) / units, 4) if units else None,
        "scripted_fair_share_bound": round(fair_share_bound(share_stayed, units, len(stayed)), 4),
    }


def last_unit_at(run: CrowdRun) -> float | None:
    """When the last unit was sold (the ``202`` that sold the stock out arrived;
    epoch seconds), or None when the crowd did not buy the whole stock."""
    answers = sorted(p.answer.finished for t in run.trails for p in t.purchases if p.answer.code == ACCEPTED)
    return answers[run.stock - 1] if 0 < run.stock <= len(answers) else None


def longest_poll_interval(run: CrowdRun) -> float:
    """The longest ``poll_after_ms`` the server gave a buyer, in seconds (0 without the room)."""
    return max((t.poll_after_ms or 0 for trail in run.trails for t in trail.told()), default=0) / 1000


def told_figures(outcomes: list[BuyerOutcome], run: CrowdRun) -> dict[str, Any]:
    """How long after the last unit the buyers still waiting then were told ``sold_out``; the
    bound they are held to with the room (:func:`longest_poll_interval` + :data:`TOLD_SLACK`)."""
    last = last_unit_at(run)
    bound = round(longest_poll_interval(run) + TOLD_SLACK, 3) if run.room else None
    if last is None:
        return {"sold_out": False, "bound_seconds": bound}
    waiting = [o for o in outcomes if o.arrived <= last and (o.done is None or o.done > last)]
    delays = sorted(max(0.0, o.told_sold_out - last) for o in waiting if o.told_sold_out is not None)
    return {
        "sold_out": True,
        "waiting_at_last_unit": len(waiting),
        "told_sold_out": len(delays),
        "left_untold": sum(1 for o in waiting if o.told_sold_out is None and o.left),
        "never_told": sum(1 for o in waiting if o.told_sold_out is None and not o.left),
        "last_told_after_seconds": round(delays[-1], 3) if delays else 0.0,
        "median_told_after_seconds": round(statistics.median(delays), 3) if delays else 0.0,
        "bound_seconds": bound,
    }


def _fate(answered: set[str]) -> str:
    """What became of an admission whose purchases were answered with the codes ``answered``."""
    for code, fate in ((ACCEPTED, "bought"), ("sold_out", "sold_out"), ("admission_required", "expired")):
        if code in answered:
            return fate
    return "unused"


def admissions_by_behaviour(run: CrowdRun) -> dict[str, dict[str, int]] | None:
    """With the room, per behaviour: admissions the buyers were told of (distinct tokens) and what became of
    each: ``bought`` (a ``202``), ``sold_out`` (the purchase came after the last unit),
    ``expired`` (the purchase was refused ``admission_required``: the turn had lapsed before the
    buyer heard of it or bought), ``unused`` (no purchase: the buyer had left). None without it."""
    if not run.room:
        return None
    counts = {b.value: dict.fromkeys(("admissions", "bought", "sold_out", "expired", "unused"), 0) for b in Behaviour}
    for trail in run.trails:
        tokens = {t.admission_token for t in trail.told() if t.state == "admitted" and t.admission_token}
        codes: dict[str | None, set[str]] = {}
        for purchase in trail.purchases:
            codes.setdefault(purchase.admission, set()).add(purchase.answer.code)
        row = counts[trail.buyer.behaviour.value]
        row["admissions"] += len(tokens)
        for token in tokens:
            row[_fate(codes.get(token, set()))] += 1
    return counts


def join_answered_ms(run: CrowdRun) -> dict[str, dict[str, float]] | None:
    """With the room, per behaviour, how long after arriving a buyer's first join was answered
    (ms, p50 and max): the part of "came in" the sale's own client and the server's load decide
    (a script's first of several joins is answered sooner than one join under load)."""
    if not run.room:
        return None
    waits: dict[str, list[float]] = {}
    for trail in run.trails:
        if trail.joins:
            waits.setdefault(trail.buyer.behaviour.value, []).append((trail.joins[0].at - trail.arrived) * 1000)
    return {
        behaviour: {"p50": round(statistics.median(ms), 1), "max": round(max(ms), 1)}
        for behaviour, ms in sorted(waits.items())
    }


def fairness(run: CrowdRun) -> dict[str, Any]:
    """The report's ``fairness`` section (the same figures with the room and without it)."""
    outcomes = [outcome_of(run, trail) for trail in run.trails]
    return {
        "waiting_room": run.room,
        **_share_figures(outcomes),
        "admissions_by_behaviour": admissions_by_behaviour(run),
        "turn_order": {**_order_figures(outcomes), "first_join_answered_ms": join_answered_ms(run)},
        "sold_out_told": told_figures(outcomes, run),
        "buyers_timed_out": run.timed_out,
        "crowd_seconds": round(run.seconds, 2),
    }
