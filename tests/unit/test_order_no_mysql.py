"""The MySQL order-number minter's arithmetic: the (second, sequence) pair only moves forward."""

from __future__ import annotations

from service.domain.order_numbers.format import REDIS_SHARDS, SEQUENCE_MAX, SHARDS
from service.domain.order_numbers.mysql_minter import MYSQL_SHARDS, advance


def test_the_mysql_shards_are_the_ones_the_redis_minter_never_leases() -> None:
    assert list(MYSQL_SHARDS) == list(range(REDIS_SHARDS, SHARDS)) == list(range(90, 100))


def test_a_new_second_starts_at_one() -> None:
    assert advance("20261130120000", 500, "20261130120001", 100) == ("20261130120001", 1, 100)


def test_the_same_second_continues_after_the_stored_sequence() -> None:
    assert advance("20261130120001", 100, "20261130120001", 100) == ("20261130120001", 101, 200)


def test_a_clock_behind_the_row_continues_in_the_row_s_second() -> None:
    # Another process's clock ran ahead (or this one stepped back): never a pair again.
    assert advance("20261130120005", 7, "20261130120001", 10) == ("20261130120005", 8, 17)


def test_a_used_up_second_moves_on_to_the_next_without_wrapping() -> None:
    assert advance("20261130235959", SEQUENCE_MAX, "20261130235959", 100) == ("20261201000000", 1, 100)
    assert advance("20261130120000", SEQUENCE_MAX - 3, "20261130120000", 100) == (
        "20261130120000",
        SEQUENCE_MAX - 2,
        SEQUENCE_MAX,
    )
