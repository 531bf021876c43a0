"""The group body format beside the single-order one (docs/ARCHITECTURE.md, "Order messages and
groups"), and how the settlements of a group's orders become copies (consumers/settlements.py)."""

from __future__ import annotations

import msgspec
import pytest

from consumers.settlements import ACK, Action, Carried, Settlement, copies_of, fallback
from service.domain.fulfilment.incoming import InvalidOrder, parse_body
from service.domain.order_numbers.format import compose_order_no
from service.model.order_message import (
    GROUP_FORMAT,
    OrderGroup,
    OrderMessage,
    decode_body,
    decode_order,
    encode_group,
    encode_order,
    orders_of,
)

DEAD = Settlement(Action.DEAD, "unknown_product", "nothing written")
RETRY = Settlement(Action.RETRY, "transient", "down")


def _order(sequence: int, user: str = "u1") -> OrderMessage:
    return OrderMessage(f"{sequence:032x}", compose_order_no("FS", "20261203000000", 7, sequence), user, 5, 1, 0, 1500)


def _group(*orders: OrderMessage, http: list[str | None] | None = None) -> OrderGroup:
    return OrderGroup(GROUP_FORMAT, "a" * 32, list(orders), http)


def test_both_formats_decode_to_their_orders() -> None:
    one, two = _order(1), _order(2)
    assert decode_body(encode_order(one)) == one
    assert orders_of(encode_order(one)) == [one]
    group = _group(one, two, http=["h1", None])
    assert decode_body(encode_group(group)) == group
    assert orders_of(encode_group(group)) == [one, two]
    assert group.http_request_id(0) == "h1" and group.http_request_id(1) is None
    assert b"http_request_ids" not in encode_group(_group(one, two))  # left out when none is known


@pytest.mark.parametrize(
    "body",
    [b"\x00garbage", b'{"v": 2, "id": "x", "orders": []}', b'{"v": 1, "id": "x"}', b'{"request_id": "x"}'],
)
def test_a_body_of_neither_format_is_refused(body: bytes) -> None:
    with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
        decode_body(body)
    with pytest.raises(InvalidOrder):
        parse_body(body)


def test_an_order_out_of_domain_in_a_group_is_marked_alone() -> None:
    bad = OrderMessage("f" * 32, _order(3).order_no, "not a user!", 5, 1, 0, 1500)
    incoming = parse_body(encode_group(_group(_order(1), bad, _order(2))))
    assert [why is None for why in incoming.invalid] == [True, False, True]
    with pytest.raises(InvalidOrder):
        parse_body(encode_order(bad))  # alone, the whole message is invalid, as before groups
    with pytest.raises(InvalidOrder, match="without orders"):
        parse_body(encode_group(_group()))


def test_a_single_order_message_is_copied_whole() -> None:
    [copy] = copies_of(None, [Carried(_order(1), "h", DEAD)])
    assert (copy.settlement, copy.body, copy.message_id) == (DEAD, None, None)
    assert copies_of(None, [Carried(_order(1), "h", ACK)]) == []


def test_a_dead_order_of_a_group_is_copied_alone_and_the_retried_ones_together() -> None:
    one, two, three, four = (_order(n) for n in range(1, 5))
    group = _group(one, two, three, four, http=["h1", "h2", "h3", "h4"])
    carried = [
        Carried(one, "h1", ACK),
        Carried(two, "h2", DEAD),
        Carried(three, "h3", RETRY),
        Carried(four, "h4", RETRY),
    ]
    dead, retried = copies_of(group, carried)
    assert (dead.settlement, dead.message_id, dead.correlation_id) == (DEAD, two.request_id, "h2")
    assert dead.body is not None and decode_order(dead.body) == two
    assert retried.settlement == RETRY and retried.message_id == group.id
    assert retried.body is not None and decode_body(retried.body) == _group(three, four, http=["h3", "h4"])
    assert fallback(carried) == RETRY


def test_a_group_retried_whole_keeps_its_own_body() -> None:
    group = _group(_order(1), _order(2))
    [copy] = copies_of(group, [Carried(order, None, RETRY) for order in group.orders])
    assert (copy.body, copy.message_id) == (None, None)
    one_left = copies_of(group, [Carried(group.orders[0], None, ACK), Carried(group.orders[1], None, RETRY)])
    assert [(c.message_id, c.body) for c in one_left] == [(group.orders[1].request_id, encode_order(group.orders[1]))]
    assert fallback([Carried(group.orders[0], None, ACK), Carried(group.orders[1], None, DEAD)]) == DEAD
