"""The invariants of a sale through the waiting room (``flashsale sale --waiting-room``), checked
on what every buyer saw, beside the eight of :mod:`toolkit.sale.invariants`: no purchase without
an admission, no buyer admitted twice at once, every waiting buyer told ``sold_out`` within a
stated bound of the last unit, scripted buyers no larger a share of units than of buyers, and
the room's promises to each buyer (:mod:`toolkit.sale.room_promises`: a held turn is a unit, a
place never moves back, a departed buyer is never admitted) (docs/ARCHITECTURE.md, "Waiting room")."""

from __future__ import annotations

from collections import Counter
from typing import Any

from toolkit.sale.crowd import CrowdRun, Trail
from toolkit.sale.fairness import fairness
from toolkit.sale.invariants import Check
from toolkit.sale.plan import ACCEPTED
from toolkit.sale.room_promises import check_departures, check_places, check_turns

OVERLAP_SLACK = 0.1
"""Seconds two admissions of one buyer may seem to overlap by: the server's expiry (epoch ms)
set against the clock of the host that heard it."""


def _check_admissions(run: CrowdRun) -> Check:
    """Every 202 carried an admission token this buyer was told in an ``admitted`` answer, and
    no admission bought twice."""
    accepted = without = unknown = 0
    orders_per_admission: Counter[str] = Counter()
    sent_without = Counter[str]()
    for trail in run.trails:
        told_tokens = {t.admission_token for t in trail.told() if t.state == "admitted"}
        for purchase in trail.purchases:
            if purchase.admission is None:
                sent_without[purchase.answer.code] += 1
            if purchase.answer.code != ACCEPTED:
                continue
            accepted += 1
            if purchase.admission is None:
                without += 1
            elif purchase.admission not in told_tokens:
                unknown += 1
            else:
                orders_per_admission[purchase.admission] += 1
    twice = sum(1 for n in orders_per_admission.values() if n > 1)
    numbers: dict[str, Any] = {
        "accepted_purchases": accepted,
        "accepted_without_admission": without,
        "accepted_with_an_admission_not_theirs": unknown,
        "admissions_that_bought_twice": twice,
        "purchases_sent_without_admission": dict(sent_without.most_common()),
    }
    return Check(without == unknown == twice == 0, numbers)


def _overlaps(run: CrowdRun, trail: Trail) -> int:
    """Admissions of ``trail``'s buyer told while its previous admission was still good (neither
    expired nor used by a purchase that was answered)."""
    admissions: list[tuple[float, str, int]] = []
    for told in trail.told():
        if told.state == "admitted" and told.admission_token and told.admission_expires_at is not None:
            if not admissions or admissions[-1][1] != told.admission_token:
                admissions.append((told.at, told.admission_token, told.admission_expires_at))
    overlaps = 0
    for (_, token, expires_at), (seen, _, _) in zip(admissions, admissions[1:], strict=False):
        used = [p.answer.finished for p in trail.purchases if p.admission == token and p.answer.status]
        ended = min([expires_at / 1000, *used])
        overlaps += seen < ended - OVERLAP_SLACK
    return overlaps


def _check_admitted_once(run: CrowdRun) -> Check:
    tickets = [len({t.ticket for t in trail.told() if t.ticket is not None}) for trail in run.trails]
    overlaps = sum(_overlaps(run, trail) for trail in run.trails)
    joins = sum(len(trail.joins) for trail in run.trails)
    numbers = {
        "buyers": len(run.trails),
        "joins": joins,
        "buyers_with_two_tickets": sum(1 for n in tickets if n > 1),
        "admissions_overlapping_another": overlaps,
    }
    return Check(numbers["buyers_with_two_tickets"] == overlaps == 0, numbers)


def _check_told(figures: dict[str, Any]) -> Check:
    told = figures["sold_out_told"]
    ok = not told["sold_out"] or (told["never_told"] == 0 and told["last_told_after_seconds"] <= told["bound_seconds"])
    return Check(ok and figures["buyers_timed_out"] == 0, {**told, "buyers_timed_out": figures["buyers_timed_out"]})


def _check_share(figures: dict[str, Any]) -> Check:
    share = figures["scripted_share_of_units"]
    bound = figures["scripted_fair_share_bound"]
    numbers = {
        "scripted_share_of_units": share,
        "scripted_share_of_buyers_who_stayed": figures["scripted_share_of_buyers_who_stayed"],
        "scripted_share_of_buyers": figures["scripted_share_of_buyers"],
        "allowed_up_to": bound,
        "units": figures["units"],
    }
    return Check(share is None or share <= bound, numbers)


def check_room(run: CrowdRun, figures: dict[str, Any] | None = None) -> dict[str, Check]:
    """The seven waiting-room invariants (the last keys of
    :data:`~toolkit.sale.invariants.INVARIANT_TITLES`); ``figures`` the run's
    :func:`~toolkit.sale.fairness.fairness` when already computed."""
    figures = figures if figures is not None else fairness(run)
    return {
        "no_purchase_without_admission": _check_admissions(run),
        "admitted_once_at_a_time": _check_admitted_once(run),
        "sold_out_told_in_time": _check_told(figures),
        "scripted_no_larger_share": _check_share(figures),
        "turn_is_a_unit": check_turns(run),
        "place_never_moved_back": check_places(run),
        "departed_never_admitted": check_departures(run),
    }
