"""What the waiting room promises each buyer, checked on what every buyer saw in a sale through
the room (``flashsale sale --waiting-room``; docs/ARCHITECTURE.md, "Waiting room"): a turn with
a unit held is a unit the buyer gets within its time; a place shown is final (it never moves
back, and no two buyers are shown the same); a buyer silent past its departure bound is never
admitted when it comes back."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterator

from toolkit.sale.crowd import NOT_IN_QUEUE, CrowdRun, Told, Trail
from toolkit.sale.invariants import Check
from toolkit.sale.plan import ACCEPTED


def check_turns(run: CrowdRun) -> Check:
    """No purchase with an admission that holds a unit, answered before that admission expired
    and before a purchase with it was accepted (a second unit on a spent admission is no turn),
    was answered ``sold_out``."""
    held = checked = sold_out = refused = 0
    for trail in run.trails:
        expiry = {
            t.admission_token: t.admission_expires_at / 1000
            for t in trail.told()
            if t.state == "admitted" and t.holds_unit and t.admission_token and t.admission_expires_at
        }
        held += len(expiry)
        bought: set[str] = set()
        for purchase in sorted(trail.purchases, key=lambda p: p.sent):
            token = purchase.admission or ""
            until = expiry.get(token)
            if until is None or purchase.answer.finished >= until or token in bought:
                continue
            if purchase.answer.code == ACCEPTED:
                bought.add(token)
            checked += 1
            sold_out += purchase.answer.code == "sold_out"
            refused += purchase.answer.code == "admission_required"
    numbers = {
        "admissions_with_a_unit_held": held,
        "purchases_with_them_in_time": checked,
        "answered_sold_out": sold_out,
        "answered_admission_required": refused,
    }
    return Check(sold_out == 0, numbers)


def _stints(trail: Trail) -> Iterator[list[Told]]:
    """The buyer's answers per place held. A place ends when the room says so (``404``: departed,
    or no place) and when its admission ends (bought with, or expired); a call sent after its end,
    or a join sent after an answer arrived, is in a new place at the back. Parallel joins sent
    before any answer share one place; those the server reads after the place ended take a new
    one (a script's eight joins read over seconds of a loaded server's queue), and so does a
    re-join whose answer was lost (a ``503`` whose script ran)."""
    joins = {id(told) for told in trail.joins}
    bought: dict[str, float] = {}
    for purchase in trail.purchases:
        if purchase.admission and purchase.answer.code == ACCEPTED:
            bought[purchase.admission] = min(bought.get(purchase.admission, math.inf), purchase.answer.finished)
    stint: list[Told] = []
    ended = math.inf  # when this place ended, as far as the buyer knows
    for told in trail.told():
        returned = id(told) in joins and stint and told.sent > stint[0].at
        if returned or told.sent > ended:
            yield stint
            stint, ended = [], math.inf
        stint.append(told)
        if told.state == NOT_IN_QUEUE:
            ended = min(ended, told.at)
        elif told.state == "admitted" and told.admission_token and told.admission_expires_at:
            ended = min(ended, told.admission_expires_at / 1000, bought.get(told.admission_token, math.inf))
    if stint:
        yield stint


def check_places(run: CrowdRun) -> Check:
    """Within one place held, the position shown never changes for the worse and ``ahead`` never
    grows, against every answer that arrived before the call was sent (calls in flight together,
    a script's parallel joins, reach Redis in an order the client does not see); a position is
    shown to one buyer only."""
    moved_back = grew = 0
    holders: dict[int, set[str]] = defaultdict(set)
    shown = 0
    for trail in run.trails:
        for stint in _stints(trail):
            for told in stint:
                before = [earlier for earlier in stint if earlier.at < told.sent]
                if told.position is not None:
                    shown += 1
                    holders[told.position].add(trail.buyer.user)
                    best = min((e.position for e in before if e.position is not None), default=None)
                    moved_back += best is not None and told.position > best
                if told.ahead is not None:
                    fewest = min((e.ahead for e in before if e.ahead is not None), default=None)
                    grew += fewest is not None and told.ahead > fewest
    shared = sum(1 for users in holders.values() if len(users) > 1)
    numbers = {
        "places_shown": shown,
        "distinct_places": len(holders),
        "positions_moved_back": moved_back,
        "ahead_grew": grew,
        "places_shown_to_two_buyers": shared,
    }
    return Check(moved_back == grew == shared == 0, numbers)


def check_departures(run: CrowdRun) -> Check:
    """A poll sent longer after the buyer's last waiting answer than its departure bound (the
    room's multiple of the longest interval it was told in that place, at least of the longest
    any buyer is told, ``poll_max_ms``, plus the room's grace and the width of its departure
    buckets, a quarter of the shortest multiple) is never answered ``admitted`` by an admission
    made past that bound (the server saw at least that gap: it answered before the client heard,
    and the client sent before the server read). The silence ends at any call sent meanwhile,
    one answered with an error or a ``429`` too (the room saw it: a ``503`` after its script ran).
    An admission is dated from its expiry less the tokens' lifetime: one made while the buyer was
    still in time, at another buyer's call, is told at the late poll without breaking the promise
    (a crowd that queues its polls sends many late)."""
    silent = admitted = kept = 0
    bucket = math.ceil(run.depart_after_polls * run.poll_max_ms / 4)
    for trail in run.trails:
        joins = {id(told) for told in trail.joins}
        unticketed = sorted(trail.unticketed)
        for stint in _stints(trail):
            longest = run.poll_max_ms
            for previous, told in zip(stint, stint[1:], strict=False):
                longest = max(longest, previous.poll_after_ms or 0)
                if previous.state != "waiting" or id(told) in joins or not told.sent:
                    continue
                bound = (run.depart_after_polls * longest + run.depart_grace_ms + bucket) / 1000
                between = unticketed[bisect_left(unticketed, previous.at) : bisect_left(unticketed, told.sent)]
                last_call = max([previous.at, *between])
                if told.sent - last_call <= bound:
                    continue
                silent += 1
                kept += told.state == "waiting"
                if told.state == "admitted":
                    expires = told.admission_expires_at
                    admitted_at = expires / 1000 - run.token_seconds if expires else told.sent
                    admitted += admitted_at - last_call > bound
    numbers = {
        "polls_after_a_silence_past_the_bound": silent,
        "answered_admitted": admitted,
        "answered_waiting": kept,
        "departure_bound_polls": run.depart_after_polls,
        "departure_grace_ms": run.depart_grace_ms,
    }
    return Check(admitted == 0, numbers)
