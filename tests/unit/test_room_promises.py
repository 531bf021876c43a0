"""The waiting room's promises as the sale checks them (toolkit/sale/room_promises.py) on trails
written out by hand: each check holds on the trail that keeps the promise and fails, with the
count, on the one that breaks it."""

from __future__ import annotations

from toolkit.sale.crowd import NOT_IN_QUEUE, Behaviour, Buyer, CrowdRun, Purchase, Told, Trail
from toolkit.sale.plan import ACCEPTED, Answer
from toolkit.sale.room_promises import check_departures, check_places, check_turns


def _buyer(number: int) -> Buyer:
    return Buyer(f"crowd-{number}", Behaviour.HONEST, 1.0, None, 0.5)


def _told(at: float, state: str, position=None, ahead=None, token=None, expires=None, poll=1000, holds=False):
    return Told(at, state, "t", position, ahead, 5, token, expires, poll, holds, at - 0.01)


def _trail(number: int, joins: list[Told], polls: list[Told], purchases: list[Purchase] = ()) -> Trail:  # type: ignore[assignment]
    trail = Trail(_buyer(number), arrived=1.0)
    trail.joins, trail.polls, trail.purchases = joins, polls, list(purchases)
    return trail


def _run(*trails: Trail, grace_ms: int = 0) -> CrowdRun:
    return CrowdRun(True, 0.0, 15.0, 5, list(trails), 30.0, 0, 3.0, 1000, grace_ms)


def _purchase(sent: float, token: str, code: str) -> Purchase:
    status = 202 if code == ACCEPTED else 409
    return Purchase(sent, token, "k", 1, Answer(status, code, None, None, 0.01, sent + 0.01))


def test_a_held_turn_answered_sold_out_in_time_breaks_the_promise_and_one_after_expiry_does_not():
    admitted = _told(10.0, "admitted", 3, None, "tok", 20_000, holds=True)
    kept = _trail(1, [_told(1.0, "waiting")], [admitted], [_purchase(11.0, "tok", ACCEPTED)])
    late = _trail(2, [_told(1.0, "waiting")], [admitted], [_purchase(21.0, "tok", "sold_out")])
    # A second unit asked on the spent admission is no turn.
    again = _trail(
        5, [_told(1.0, "waiting")], [admitted], [_purchase(11.0, "tok", ACCEPTED), _purchase(11.005, "tok", "sold_out")]
    )
    assert check_turns(_run(kept, late, again)).ok
    broken = _trail(3, [_told(1.0, "waiting")], [admitted], [_purchase(12.0, "tok", "sold_out")])
    check = check_turns(_run(kept, broken))
    assert (check.ok, check.numbers["answered_sold_out"], check.numbers["purchases_with_them_in_time"]) == (
        False,
        1,
        2,
    )
    unheld = _told(10.0, "admitted", 3, None, "tok", 20_000, holds=False)  # factor > 1: no unit held
    assert check_turns(_run(_trail(4, [_told(1.0, "waiting")], [unheld], [_purchase(12.0, "tok", "sold_out")]))).ok


def test_a_place_that_moves_back_or_is_shown_to_two_buyers_breaks_the_promise():
    steady = _trail(1, [_told(1.0, "waiting")], [_told(2.0, "waiting", 4, 3), _told(3.0, "waiting", 4, 1)])
    other = _trail(2, [_told(1.0, "waiting")], [_told(2.0, "waiting", 5, 4)])
    assert check_places(_run(steady, other)).ok
    back = _trail(3, [_told(1.0, "waiting")], [_told(2.0, "waiting", 6, 2), _told(3.0, "waiting", 7, 3)])
    numbers = check_places(_run(steady, back)).numbers
    assert (numbers["positions_moved_back"], numbers["ahead_grew"]) == (1, 1)
    twin = _trail(4, [_told(1.0, "waiting")], [_told(2.0, "waiting", 4, 3)])
    check = check_places(_run(steady, twin))
    assert (check.ok, check.numbers["places_shown_to_two_buyers"]) == (False, 1)
    # Parallel joins reach Redis in an order the client does not see: no order among them.
    parallel = _trail(
        6,
        [
            Told(1.0, "waiting", "t", 9, 5, 5, None, None, 1000, False, 0.5),
            Told(1.01, "waiting", "t", 9, 7, 5, None, None, 1000, False, 0.5),
        ],
        [],
    )
    assert check_places(_run(parallel)).ok
    # A return after losing the place (a join after polls) is a new place, at the back.
    again = _trail(
        5,
        [_told(1.0, "waiting"), _told(9.0, "waiting", 9, 2)],
        [_told(2.0, "waiting", 8, 0), _told(3.0, "admitted", 8)],
    )
    assert check_places(_run(again)).ok
    # Told it holds no place (404), it joins again; that join's answer is lost (a 503 whose script
    # ran), and its next poll shows the new place: a new place, not one moved back.
    lost = _trail(
        7,
        [_told(1.0, "waiting")],
        [_told(2.0, "waiting", 8, 6), _told(30.0, NOT_IN_QUEUE, poll=None), _told(40.0, "waiting", 90, 80)],
    )
    assert check_places(_run(lost)).ok
    # A script's parallel joins: one read before its admission was used, three after (a new place).
    joins = [Told(2.0, "admitted", "t", 12, None, 5, "tok", 20_000, 1000, True, 1.0)]
    joins += [Told(9.0, "waiting", "t", None, None, 5, None, None, 600, False, 1.0)] * 3
    script = _trail(9, joins, [_told(12.0, "waiting", 130, 95)], [_purchase(2.5, "tok", ACCEPTED)])
    assert check_places(_run(script)).ok
    # Its admission unused and unexpired, the same answers are a place moved back.
    unused = _trail(10, joins, [_told(12.0, "waiting", 130, 95)])
    assert check_places(_run(unused)).numbers["positions_moved_back"] == 1
    # Without the 404 the same answers are a place moved back.
    kept = _trail(8, [_told(1.0, "waiting")], [_told(2.0, "waiting", 8, 6), _told(40.0, "waiting", 90, 80)])
    assert check_places(_run(kept)).numbers["positions_moved_back"] == 1


def test_a_buyer_admitted_after_a_silence_past_its_bound_breaks_the_promise():
    # Told 1 s: bound 3 s, found within 0.75 s more. A poll sent 2.5 s after the last answer keeps the place.
    on_time = _trail(1, [_told(1.0, "waiting", poll=1000)], [_told(3.51, "admitted", 2)])
    assert check_departures(_run(on_time)).ok
    gone = _trail(2, [_told(1.0, "waiting", poll=1000)], [_told(4.8, "admitted", 2, expires=19_790)])  # 3.79 s on
    # admitted at 2.5 s (its token expires 15 s later), in time; told at a poll sent late: kept
    late_news = _trail(4, [_told(1.0, "waiting", poll=1000)], [_told(4.8, "admitted", 2, expires=17_500)])
    check = check_departures(_run(on_time, gone, late_news))
    assert (check.ok, check.numbers["answered_admitted"], check.numbers["polls_after_a_silence_past_the_bound"]) == (
        False,
        1,
        2,
    )
    # Once told 5 s, the bound is 15 s, even after shorter intervals.
    patient = _trail(
        3, [_told(1.0, "waiting", poll=5000)], [_told(6.0, "waiting", 1, 0, poll=1000), _told(21.7, "admitted", 1)]
    )
    assert check_departures(_run(patient)).ok
    # The room's grace (a call's time in a loaded server's queue) lengthens the bound by as much.
    assert check_departures(_run(gone, grace_ms=1000)).ok
    assert not check_departures(_run(_trail(5, [_told(1.0, "waiting")], [_told(5.8, "admitted", 2)]), grace_ms=1000)).ok
    # A call answered with an error meanwhile (a 503 whose script ran) ends the silence.
    errored = _trail(6, [_told(1.0, "waiting", poll=1000)], [_told(4.8, "admitted", 2, expires=19_790)])
    errored.unticketed = [2.5]
    assert check_departures(_run(errored)).ok
