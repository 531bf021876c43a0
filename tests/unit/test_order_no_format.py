"""Order numbers: layout and ISO 7064 MOD 97-10 check digits (pure functions, no server)."""

from __future__ import annotations

import pytest

from service.domain.order_numbers.format import SEQUENCE_MAX, check_digits, compose_order_no, is_valid_order_no


def test_check_digits_match_the_iban_algorithm():
    # GB82 WEST 1234 5698 7654 32 (ISO 13616 example): rearranged body, check digits 82.
    assert check_digits("WEST12345698765432GB") == "82"


def test_layout_and_validation():
    order_no = compose_order_no("FS", "20261130235959", 7, 42)
    assert len(order_no) == 26
    assert order_no[:24] == "FS" + "20261130235959" + "07" + "000042"
    assert int("".join(str(int(c, 36)) for c in order_no)) % 97 == 1
    assert is_valid_order_no(order_no)


def test_every_single_character_change_is_caught():
    order_no = compose_order_no("FS", "20261130120000", 12, 345678)
    for position in range(2, 26):
        for digit in "0123456789":
            if digit != order_no[position]:
                changed = order_no[:position] + digit + order_no[position + 1 :]
                assert not is_valid_order_no(changed), changed


@pytest.mark.parametrize(
    "bad", ["", "FS", "fs202611301200001234567800", "FS2026113012000012345678000", "FS20261130120000123456780X"]
)
def test_malformed_values_are_invalid(bad):
    assert not is_valid_order_no(bad)


def test_parts_out_of_range_are_refused():
    with pytest.raises(ValueError):
        compose_order_no("FS", "20261130120000", 100, 1)
    with pytest.raises(ValueError):
        compose_order_no("FS", "20261130120000", 1, SEQUENCE_MAX + 1)
