"""The consumer's ``parse_body`` bounds every field to its column or format, so a poison value is
dead-lettered at once (``InvalidOrder``) instead of failing a batch and going through the
redelivery backoff."""

from __future__ import annotations

import msgspec
import pytest

from service.domain.fulfilment.incoming import InvalidOrder, parse_body
from service.domain.order_numbers.format import compose_order_no

GOOD = {
    "request_id": "0" * 31 + "1",
    "order_no": compose_order_no("FS", "20261130000000", 7, 1),
    "user_id": "u1",
    "product_id": 1000,
    "quantity": 2,
    "reserved_at_ms": 1_764_460_800_000,
    "amount": 3000,
}


def _parse_one(body: bytes):
    [order] = parse_body(body).orders
    return order


def body(**changes: object) -> bytes:
    return msgspec.json.encode({**GOOD, **changes})


def test_a_good_order_parses() -> None:
    order = _parse_one(body())
    assert (order.product_id, order.quantity, order.amount, order.reserved_at_ms) == (1000, 2, 3000, 1_764_460_800_000)


@pytest.mark.parametrize(
    "changes",
    [
        {"quantity": 0},
        {"quantity": -1},
        {"quantity": 2**31},  # orders.quantity is INT
        {"product_id": 0},
        {"product_id": 2**63},  # BIGINT
        {"amount": -1},
        {"amount": 2**63},  # BIGINT
        {"reserved_at_ms": -1},
        {"reserved_at_ms": 2**53 + 1},
        {"reserved_at_ms": 2**64},  # past int64: msgspec itself refuses it
        {"request_id": "X" * 32},
        {"order_no": "FS" + "0" * 24},  # check digits wrong
        {"user_id": ""},
        {"quantity": "1"},
        {"quantity": 1.5},
    ],
    ids=repr,
)
def test_a_poison_field_is_invalid(changes: dict[str, object]) -> None:
    with pytest.raises(InvalidOrder):
        _parse_one(body(**changes))


def test_the_bounds_themselves_are_accepted() -> None:
    order = _parse_one(body(quantity=2**31 - 1, product_id=2**63 - 1, amount=2**63 - 1, reserved_at_ms=2**53))
    assert order.quantity == 2**31 - 1 and order.reserved_at_ms == 2**53
    assert _parse_one(body(reserved_at_ms=0, amount=0)).reserved_at_ms == 0
