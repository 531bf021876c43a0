"""The waiting room's pure parts: the lottery's reproduction, the script reply's parsing, the
wait quantiles the ops page reads."""

from __future__ import annotations

import hashlib

import pytest

from service.adapters.redis.waiting_room import parse_visit
from service.domain.waiting_room.lottery import drawn_order, lottery_score
from service.domain.waiting_room.service import ticket_of
from service.metrics_readings import _quantile
from service.model.waiting_room import RoomState


def test_the_lottery_orders_by_the_first_13_hex_digits_of_sha1_then_by_user_id():
    seed = "ab" * 16
    users = [f"user-{i}" for i in range(200)]
    order = drawn_order(seed, users)
    scores = [int(hashlib.sha1(f"{seed}:{user}".encode()).hexdigest()[:13], 16) for user in order]
    assert scores == sorted(scores) and sorted(order) == sorted(users)
    assert drawn_order(seed, reversed(users)) == order  # joining order plays no part
    assert drawn_order("cd" * 16, users) != order
    assert lottery_score(seed, "x") < 2**52


def test_a_reply_reads_minus_one_and_empty_as_unknown():
    waiting = parse_visit(["waiting", -1, -1, 5, "", 0, 10, 2, 0, 0, 0, 1, -1, 1000, 900, 1500, 0, 2])
    assert (waiting.state, waiting.position, waiting.ahead, waiting.token, waiting.sale_left_ms) == (
        RoomState.WAITING,
        None,
        None,
        None,
        None,
    )
    admitted = parse_visit(
        ["admitted", 3, -1, 5, "t" * 32, 5000, 10, 3, 1, 2, 1, 1, 60_000, 1000, 900, 5000, 1, 3, 40, 70]
    )
    assert (admitted.position, admitted.token, admitted.expires_ms, admitted.opened) == (3, "t" * 32, 5000, True)
    assert (admitted.admitted, admitted.expired, admitted.waits_ms, admitted.sale_left_ms) == (2, 1, (40, 70), 60_000)
    assert (waiting.poll_after_ms, admitted.poll_after_ms) == (1500, 5000)
    assert (waiting.holds_unit, waiting.held, admitted.holds_unit, admitted.held) == (False, 2, True, 3)
    assert parse_visit(["off"]).state is RoomState.OFF
    with pytest.raises(ValueError):
        parse_visit(["gone"])


def test_a_ticket_is_one_per_buyer_and_product():
    assert ticket_of(1, "a") == ticket_of(1, "a") != ticket_of(2, "a") != ticket_of(1, "b")
    assert len(ticket_of(1, "a")) == 20


def test_quantiles_interpolate_inside_the_bucket_as_histogram_quantile_does():
    cumulative = [(1.0, 0.0), (10.0, 100.0), (float("inf"), 100.0)]
    assert _quantile(0.5, cumulative) == pytest.approx(5.5)
    assert _quantile(0.99, cumulative) == pytest.approx(9.91)
    assert _quantile(0.5, [(1.0, 0.0), (float("inf"), 0.0)]) is None
    assert _quantile(0.99, [(1.0, 0.0), (float("inf"), 4.0)]) == 1.0
