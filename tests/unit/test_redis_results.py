"""The stock store's pure parts: Redis replies and stored values to typed results (no server)."""

from __future__ import annotations

import pytest

from service.adapters.redis.keys import ProductKeys
from service.adapters.redis.replies import (
    format_queued_order,
    parse_journal_entry,
    parse_queued_order,
    parse_realign_reply,
    parse_reservation,
)
from service.domain.stock.snapshot import sale_terms
from service.model.stock import JournalEntry, QueuedOrder, RealignResult, Reservation, ReserveOutcome, SaleTerms


def test_a_reserved_reply_carries_time_and_integer_price():
    reply = ["reserved", "FS2026113000000098000001xx", 1764460800123, "1500"]
    assert parse_reservation(reply) == Reservation(ReserveOutcome.RESERVED, reply[1], 1764460800123, 1500)


def test_a_price_beyond_double_precision_stays_exact():
    # reserve.lua returns the price as the string Redis holds: Lua numbers are doubles.
    assert parse_reservation(["reserved", "x", 1, str(2**62 + 1)]).unit_price == 2**62 + 1


@pytest.mark.parametrize("outcome", [o for o in ReserveOutcome if o is not ReserveOutcome.RESERVED])
def test_two_element_replies_have_no_time_or_price(outcome):
    reservation = parse_reservation([outcome.value, ""])
    assert (reservation.outcome, reservation.order_no, reservation.reserved_at_ms, reservation.unit_price) == (
        outcome,
        "",
        0,
        0,
    )
    assert reservation.outcome == outcome.value  # a StrEnum compares equal to the script's word


def test_a_sold_out_reply_carries_stock_limit_and_time_left():
    assert parse_reservation(["sold_out", "", 0, 2, 1500]) == Reservation(
        ReserveOutcome.SOLD_OUT, "", stock=0, per_user_limit=2, sale_left_ms=1500
    )
    assert parse_reservation(["sold_out", "", 1, 5, -1]).sale_left_ms is None  # no end
    with pytest.raises(ValueError):
        parse_reservation(["replay", "x", 0, 2, 1500])


def test_an_unknown_outcome_is_refused():
    with pytest.raises(ValueError):
        parse_reservation(["maybe", ""])


def test_journal_entries_parse_with_the_claimed_flag():
    assert parse_journal_entry("r1", "alice|2|FS123|1764460800123|0") == JournalEntry(
        "r1", "alice", 2, "FS123", 1764460800123
    )
    assert parse_journal_entry("r2", "bob|1|FS124|5|1").claimed


def test_a_user_id_containing_the_separator_keeps_it():
    assert parse_journal_entry("r", "a|b|3|FS1|7|0").user_id == "a|b"
    assert parse_journal_entry("r", "a|b|3|FS1|7|1500|0") == JournalEntry("r", "a|b", 3, "FS1", 7, False, 1500)


def test_journal_entries_carry_the_unit_price_fixed_at_reservation():
    assert parse_journal_entry("r1", "alice|2|FS123|1764460800123|1500|0") == JournalEntry(
        "r1", "alice", 2, "FS123", 1764460800123, False, 1500
    )
    claimed = parse_journal_entry("r2", "bob|1|FS124|5|99999999999999999|1")
    assert (claimed.claimed, claimed.unit_price) == (True, 99999999999999999)  # exact, not a double
    assert parse_journal_entry("r3", "carol|1|FS125|5|0|0").unit_price == 0


def test_journal_entries_written_before_the_unit_price_was_recorded_have_none():
    # The previous shape, left in a live journal during an upgrade: realignment prices such an
    # entry at the product's price now (nothing better is known).
    entry = parse_journal_entry("r1", "alice|2|FS123|1764460800123|1")
    assert entry == JournalEntry("r1", "alice", 2, "FS123", 1764460800123, True, None)


def test_the_two_journal_shapes_are_told_apart_by_the_order_number():
    # Old shape whose user id holds separators: the third field from the right is the order
    # number (letters), never all digits, so it is not read as the new shape.
    assert parse_journal_entry("r", "x|9|8|2|FS1|7|0") == JournalEntry("r", "x|9|8", 2, "FS1", 7)


@pytest.mark.parametrize(
    "value",
    ["alice|2|FS123|1764460800123|1500", "alice|2|FS123|1|15x0|0", "alice|2|FS123|1|1500|2", "alice|2|FS123|1|1500|"],
)
def test_malformed_new_journal_entries_are_refused(value):
    with pytest.raises(ValueError):
        parse_journal_entry("r", value)


def test_an_abandoned_attempt_reply_parses():
    assert parse_reservation(["abandoned", ""]) == Reservation(ReserveOutcome.ABANDONED, "")


@pytest.mark.parametrize("value", ["alice|2|FS123|1764460800123", "alice|two|FS123|1|0", "alice|2|FS123|1|x"])
def test_malformed_journal_entries_are_refused(value):
    with pytest.raises(ValueError):
        parse_journal_entry("r", value)


def test_realign_replies_parse_not_loaded_and_stale():
    assert parse_realign_reply(["", 7, 1, 2, 3, 0, 0]) == RealignResult(None, 7, 1, 2, 3, False)
    assert parse_realign_reply(["5", 4, 0, 0, 0, 1, 2]) == RealignResult(5, 4, 0, 0, 0, True, held=2)


def test_queued_order_view_round_trips():
    value = format_queued_order("alice", 42, "req-1", 3)
    assert value == "alice|42|req-1|3"
    assert parse_queued_order("FS1", value) == QueuedOrder("FS1", "alice", 42, "req-1", 3)


def test_every_key_of_a_product_shares_its_hash_tag():
    keys = ProductKeys("fs", 42)
    names = [keys.stock, keys.sale, keys.journal, keys.quota, keys.versions, keys.replay("r"), keys.returned("o")]
    assert all(name.startswith("fs:{p:42}:") for name in names)
    assert len(set(names)) == len(names)


def test_sale_terms_are_unix_milliseconds_with_0_for_no_end():
    from datetime import datetime

    assert sale_terms(2, 1500, datetime(2026, 1, 1), None) == SaleTerms(1767225600000, 0, 2, 1500)
