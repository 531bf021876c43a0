"""The fairness figures and the waiting-room invariants of a crowd sale (toolkit/sale/fairness.py,
toolkit/sale/room_checks.py) on crowds written out by hand: each figure against a count done
by eye, each invariant failing on the trail that breaks it."""

from __future__ import annotations

from collections import Counter

import pytest

from toolkit.sale.crowd import (
    ARRIVAL_SPREAD,
    PRE_OPEN,
    Behaviour,
    Buyer,
    CrowdRun,
    Purchase,
    Told,
    Trail,
    build_crowd,
)
from toolkit.sale.crowd_wave import as_wave
from toolkit.sale.fairness import (
    discordant_pairs,
    displacements,
    fair_share_bound,
    fairness,
    outcome_of,
)
from toolkit.sale.invariants import INVARIANT_TITLES
from toolkit.sale.plan import ACCEPTED, Answer
from toolkit.sale.room_checks import check_room

TTL = 5.0
OPENED = 100.0  # the opening, in seconds on the trails' clock (epoch seconds in a sale)


def test_the_same_order_has_no_discordant_pair_and_the_reverse_has_every_one():
    same = [(float(i), float(i)) for i in range(5)]
    assert discordant_pairs(same) == (0, 10)
    reversed_ = [(float(i), float(-i)) for i in range(5)]
    assert discordant_pairs(reversed_) == (10, 10)


def test_one_swap_is_one_discordant_pair_and_moves_two_buyers_one_place():
    pairs = [(0.0, 0.0), (1.0, 2.0), (2.0, 1.0), (3.0, 3.0)]
    assert discordant_pairs(pairs) == (1, 6)
    assert displacements(pairs) == [0, 1, 1, 0]


def test_ties_are_neither_ordered_nor_reversed():
    # three came in together (the pre-queue): any turn order among them is no discordance
    pairs = [(0.0, 3.0), (0.0, 1.0), (0.0, 2.0), (1.0, 4.0)]
    assert discordant_pairs(pairs) == (0, 3)
    assert max(displacements(pairs)) == 0
    # two got their turn in the same millisecond: not reversed
    assert discordant_pairs([(0.0, 5.0), (1.0, 5.0)]) == (0, 1)


def test_a_buyer_jumping_the_whole_line_is_displaced_by_its_length():
    pairs = [(float(i), float(i)) for i in range(1, 6)] + [(6.0, 0.0)]
    assert discordant_pairs(pairs) == (5, 15)
    assert max(displacements(pairs)) == 5


def test_the_fair_share_bound_grows_with_fewer_draws_and_vanishes_when_everyone_gets_one():
    assert fair_share_bound(0.2, 100, 100) == 0.2
    assert fair_share_bound(0.2, 0, 50) == 0.2
    # 10 units among 100 buyers, a fifth of them scripted: sd = sqrt(.2*.8/10 * 90/99) = 0.1206
    assert fair_share_bound(0.2, 10, 100) == pytest.approx(0.2 + 3 * 0.12060, abs=1e-4)
    assert fair_share_bound(0.2, 50, 100) < fair_share_bound(0.2, 10, 100)


def test_a_crowd_is_the_same_for_the_same_seed_with_the_shares_asked_for():
    crowd = build_crowd(200, "seed-1")
    assert crowd == build_crowd(200, "seed-1")
    assert crowd != build_crowd(200, "seed-2")
    kinds = Counter(buyer.behaviour for buyer in crowd)
    assert kinds == {Behaviour.SCRIPTED: 40, Behaviour.IMPATIENT: 40, Behaviour.HONEST: 120}
    assert all(-PRE_OPEN <= b.arrival <= ARRIVAL_SPREAD for b in crowd)
    assert all((b.patience is None) == (b.behaviour is not Behaviour.IMPATIENT) for b in crowd)
    assert len({b.user for b in crowd}) == 200


def _buyer(number: int, behaviour: Behaviour = Behaviour.HONEST, arrival: float = 1.0) -> Buyer:
    patience = 2.0 if behaviour is Behaviour.IMPATIENT else None
    return Buyer(f"crowd-{number}", behaviour, arrival, patience, 0.5)


def _told(at: float, state: str, ticket: str = "t", token: str | None = None, admitted: float | None = None) -> Told:
    """A ticket answer at ``at``; an admission made at ``admitted`` expires TTL later."""
    expires = None if admitted is None else round((admitted + TTL) * 1000)
    return Told(at, state, ticket, None, None, None, token, expires, 1000)


def _bought(at: float, token: str | None, order_no: str, key: str = "k") -> Purchase:
    return Purchase(at - 0.01, token, key, 1, Answer(202, ACCEPTED, order_no, f"r-{order_no}", 0.01, at))


def _refused(at: float, token: str | None, code: str, status: int = 409) -> Purchase:
    return Purchase(at - 0.01, token, "k", 1, Answer(status, code, None, None, 0.01, at))


def _trail(buyer: Buyer, told: list[Told], purchases: list[Purchase] = (), left: float | None = None) -> Trail:  # type: ignore[assignment]
    trail = Trail(buyer, arrived=OPENED + buyer.arrival, left=left)
    trail.joins, trail.polls = told[:1], told[1:]
    trail.purchases = list(purchases)
    return trail


def _run(trails: list[Trail], room: bool = True, stock: int = 2) -> CrowdRun:
    return CrowdRun(room, OPENED, TTL, stock, trails, 30.0, 0)


def _fair_room() -> list[Trail]:
    """Two units: an early honest buyer and a later scripted one get them; an honest buyer who came
    before the scripted one but was not admitted yet is told sold out 0.5 s after the last unit;
    an impatient one left untold."""
    early = _buyer(0, arrival=-2.0)
    scripted = _buyer(1, Behaviour.SCRIPTED, arrival=1.0)
    late = _buyer(2, arrival=0.5)
    gone = _buyer(3, Behaviour.IMPATIENT, arrival=0.8)
    return [
        _trail(
            early,
            [_told(98.1, "waiting", "t0"), _told(100.2, "admitted", "t0", "a0", 100.1)],
            [_bought(100.3, "a0", "O1")],
        ),
        _trail(
            scripted,
            [_told(101.1, "waiting", "t1"), _told(101.2, "admitted", "t1", "a1", 101.15)],
            [_refused(101.12, None, "admission_required", 428), _bought(101.3, "a1", "O2")],
        ),
        _trail(late, [_told(100.55, "waiting", "t2"), _told(101.8, "sold_out", "t2")]),
        _trail(gone, [_told(100.85, "waiting", "t3")], left=102.8),
    ]


def test_fairness_counts_units_shares_order_and_the_time_to_tell_sold_out():
    run = _run(_fair_room())
    figures = fairness(run)
    assert (figures["units"], figures["buyers_with_units"], figures["max_units_one_buyer"]) == (2, 2, 1)
    assert figures["units_by_behaviour"] == {"honest": 1, "impatient": 0, "scripted": 1}
    assert figures["scripted_share_of_buyers"] == 0.25
    assert figures["scripted_share_of_buyers_who_stayed"] == pytest.approx(1 / 3, abs=1e-4)
    assert figures["scripted_share_of_units"] == 0.5
    order = figures["turn_order"]
    assert order["buyers_with_a_turn"] == 2 and order["after_opening"]["buyers"] == 1
    assert order["late_turn_before_an_early_buyer"] == 0
    told = figures["sold_out_told"]
    # the last unit at 101.3; the late honest buyer (waiting then) told at 101.8; the impatient one
    # was waiting too and left untold
    assert told["sold_out"] and told["waiting_at_last_unit"] == 2
    assert (told["told_sold_out"], told["left_untold"], told["never_told"]) == (1, 1, 0)
    assert told["last_told_after_seconds"] == pytest.approx(0.5)
    assert told["bound_seconds"] == 2.0  # the longest poll interval (1 s) + 1 s


def test_a_fair_room_passes_all_four_checks():
    checks = check_room(_run(_fair_room()))
    assert {name: check.ok for name, check in checks.items()} == dict.fromkeys(checks, True)
    assert checks["no_purchase_without_admission"].numbers["purchases_sent_without_admission"] == {
        "admission_required": 1
    }


def test_a_purchase_without_an_admission_or_on_a_spent_one_fails_the_admission_check():
    trails = _fair_room()
    trails[1].purchases.append(_bought(101.5, None, "O3"))  # a snipe that got through
    trails[0].purchases.append(_bought(100.6, "a0", "O4"))  # the spent admission again
    trails[2].purchases.append(_bought(101.9, "a9", "O5"))  # a token never handed to this buyer
    numbers = check_room(_run(trails))["no_purchase_without_admission"].numbers
    assert numbers["accepted_without_admission"] == 1
    assert numbers["admissions_that_bought_twice"] == 1
    assert numbers["accepted_with_an_admission_not_theirs"] == 1
    assert not check_room(_run(trails))["no_purchase_without_admission"].ok


def test_two_tickets_or_two_live_admissions_fail_the_once_at_a_time_check():
    trails = _fair_room()
    trails[2].polls.append(_told(101.0, "waiting", "t2-second"))
    assert check_room(_run(trails))["admitted_once_at_a_time"].numbers["buyers_with_two_tickets"] == 1
    trails = _fair_room()
    # a second admission told 1 s into the first one's 5 s, the first one never used
    trails[2].polls += [_told(102.2, "admitted", "t2", "b1", 102.15), _told(103.2, "admitted", "t2", "b2", 103.15)]
    check = check_room(_run(trails))["admitted_once_at_a_time"]
    assert check.numbers["admissions_overlapping_another"] == 1 and not check.ok
    # after the first one was used (answered), a new admission is no overlap
    trails = _fair_room()
    trails[2].polls += [_told(102.2, "admitted", "t2", "b1", 102.15), _told(103.2, "admitted", "t2", "b2", 103.15)]
    trails[2].purchases.append(_refused(102.5, "b1", "sold_out"))
    assert check_room(_run(trails))["admitted_once_at_a_time"].ok


def test_a_waiting_buyer_told_late_or_never_fails_the_told_check():
    trails = _fair_room()
    trails[2].polls[-1] = _told(104.0, "sold_out", "t2")  # 2.7 s after the last unit, bound 2 s
    check = check_room(_run(trails))["sold_out_told_in_time"]
    assert check.numbers["last_told_after_seconds"] == pytest.approx(2.7) and not check.ok
    trails = _fair_room()
    trails[2].polls.pop()  # never told, never left
    check = check_room(_run(trails))["sold_out_told_in_time"]
    assert check.numbers["never_told"] == 1 and not check.ok


def test_scripted_buyers_taking_every_unit_fail_the_share_check():
    scripted = [_buyer(n, Behaviour.SCRIPTED) for n in range(3)]
    honest = [_buyer(n) for n in range(3, 30)]
    trails = [
        _trail(b, [_told(101.0, "admitted", b.user, f"a{i}", 101.0)], [_bought(101.1 + i / 10, f"a{i}", f"O{i}")])
        for i, b in enumerate(scripted)
    ]
    trails += [_trail(b, [_told(101.0, "waiting", b.user), _told(102.0, "sold_out", b.user)]) for b in honest]
    check = check_room(_run(trails, stock=3))["scripted_no_larger_share"]
    assert check.numbers["scripted_share_of_units"] == 1.0
    assert check.numbers["scripted_share_of_buyers_who_stayed"] == 0.1
    assert not check.ok


def test_without_the_room_the_turn_is_the_first_202_and_the_figures_are_the_same_shape():
    early, late = _buyer(0, arrival=-1.0), _buyer(1, arrival=1.0)
    trails = [
        _trail(early, [], [_bought(100.9, None, "O1")]),
        _trail(late, [], [_bought(100.5, None, "O2")]),  # came later, bought first
    ]
    trails[0].joins = trails[1].joins = []
    figures = fairness(_run(trails, room=False, stock=5))
    assert figures["turn_order"]["late_turn_before_an_early_buyer"] == 1
    assert figures["sold_out_told"] == {"sold_out": False, "bound_seconds": None}
    assert set(figures) == set(fairness(_run(_fair_room())))


def test_admissions_are_counted_per_behaviour_with_those_that_went_unused():
    trails = _fair_room()
    trails[2].polls.insert(0, _told(100.9, "admitted", "t2", "b0", 100.85))  # lapsed before the purchase
    trails[2].purchases.append(_refused(101.0, "b0", "admission_required", 428))
    trails[3].polls.append(_told(101.0, "admitted", "t3", "c0", 100.95))  # the impatient one: never used
    counts = fairness(_run(trails))["admissions_by_behaviour"]
    assert counts == {
        "honest": {"admissions": 2, "bought": 1, "sold_out": 0, "expired": 1, "unused": 0},
        "impatient": {"admissions": 1, "bought": 0, "sold_out": 0, "expired": 0, "unused": 1},
        "scripted": {"admissions": 1, "bought": 1, "sold_out": 0, "expired": 0, "unused": 0},
    }
    assert fairness(_run(trails, room=False))["admissions_by_behaviour"] is None


def test_the_crowd_purchases_become_one_wave_in_the_order_sent():
    run = _run(_fair_room())
    wave = as_wave(run)
    sent = sorted(p.sent for t in run.trails for p in t.purchases)
    assert len(wave.jobs) == len(wave.outcomes) == 3
    assert [job.shots[0].index for job in wave.jobs] == [0, 1, 2]
    assert [job.shots[0].user for job in wave.jobs] == ["crowd-0", "crowd-1", "crowd-1"]
    assert [o.finished - 0.01 for o in wave.outcomes] == pytest.approx(sent)
    assert [o.code for o in wave.outcomes] == [ACCEPTED, "admission_required", ACCEPTED]


def test_how_long_first_joins_took_is_given_per_behaviour_with_the_room_only():
    answered = fairness(_run(_fair_room()))["turn_order"]["first_join_answered_ms"]
    # honest: 98.0 -> 98.1 and 100.5 -> 100.55; impatient 100.8 -> 100.85; scripted 101.0 -> 101.1
    assert answered == {
        "honest": {"p50": 75.0, "max": 100.0},
        "impatient": {"p50": 50.0, "max": 50.0},
        "scripted": {"p50": 100.0, "max": 100.0},
    }
    assert fairness(_run(_fair_room(), room=False))["turn_order"]["first_join_answered_ms"] is None


def test_every_room_invariant_has_a_title_for_the_tables_and_the_html_report():
    assert set(check_room(_run(_fair_room()))) <= set(INVARIANT_TITLES)


def test_with_an_opening_draw_a_buyer_who_came_in_before_the_room_opened_is_in_the_drawn_tie():
    trail = _trail(_buyer(0, arrival=0.5), [_told(OPENED + 1.0, "waiting")])
    drawn = CrowdRun(True, OPENED, TTL, 2, [trail], 30.0, 0, opening_draw_ms=2000)
    assert outcome_of(drawn, trail).early
    assert not outcome_of(_run([trail]), trail).early  # no draw window: came in after the opening
    without_room = CrowdRun(False, OPENED, TTL, 2, [trail], 30.0, 0, opening_draw_ms=2000)
    assert not outcome_of(without_room, trail).early  # no room, nothing drawn
