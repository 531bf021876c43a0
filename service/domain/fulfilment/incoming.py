"""An order message as the consumer takes it in: decoded (either body format,
:mod:`service.domain.model.order_message`) and checked field by field, so that no single order
can fail a batch's statements (docs/ARCHITECTURE.md, "Consumer")."""

from __future__ import annotations

import re
from dataclasses import dataclass

import msgspec

from db.models import MAX_AMOUNT
from service.domain.model.order_message import OrderGroup, OrderMessage, decode_body
from service.domain.order_numbers.format import is_valid_order_no
from service.domain.purchase.request_id import USER_ID

_REQUEST_ID = re.compile(r"[0-9a-f]{32}")
_ATTEMPT = re.compile(r"[0-9a-f]{0,32}")  # service.adapters.redis.reservations.new_attempt, or none
_MAX_QUANTITY = 2**31 - 1  # orders.quantity is INT
_MAX_PRODUCT_ID = 2**63 - 1  # products.id is BIGINT
_MAX_RESERVED_AT_MS = 2**53  # Unix ms from Redis TIME; no column, but a sane clock and exact as a float


class InvalidOrder(ValueError):
    """A message that is not a well-formed order; it is dead-lettered at once."""


@dataclass(frozen=True, slots=True)
class Incoming:
    """What one message body carries: ``group`` the group envelope (None for a body in the
    single-order format), its ``orders``, and by position why an order is out of its domain
    (``invalid``; None for a good one): an order of a group out of its domain is dead-lettered
    alone, the others are written."""

    group: OrderGroup | None
    orders: list[OrderMessage]
    invalid: list[InvalidOrder | None]


def parse_body(body: bytes) -> Incoming:
    """Decode a message body of either format and check its orders (:func:`check_order`).

    Raises:
        InvalidOrder: neither format, an empty group, or a single-order body out of its domain
            (nothing of it can be written).
    """
    try:
        decoded = decode_body(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InvalidOrder(str(exc)) from exc
    if isinstance(decoded, OrderMessage):
        return Incoming(None, [check_order(decoded)], [None])
    if not decoded.orders:
        raise InvalidOrder("a group without orders")
    return Incoming(decoded, decoded.orders, [_why_invalid(order) for order in decoded.orders])


def _why_invalid(order: OrderMessage) -> InvalidOrder | None:
    try:
        check_order(order)
    except InvalidOrder as exc:
        return exc
    return None


def check_order(order: OrderMessage) -> OrderMessage:
    """``order`` when every field is within its column's domain, so no single order can fail a
    batch's statements.

    Raises:
        InvalidOrder: a field out of its domain.
    """
    if not (
        _REQUEST_ID.fullmatch(order.request_id)
        and _ATTEMPT.fullmatch(order.attempt)
        and is_valid_order_no(order.order_no)
        and USER_ID.fullmatch(order.user_id)
        and 0 < order.product_id <= _MAX_PRODUCT_ID
        and 0 < order.quantity <= _MAX_QUANTITY
        and 0 <= order.amount <= MAX_AMOUNT
        and 0 <= order.reserved_at_ms <= _MAX_RESERVED_AT_MS
    ):
        raise InvalidOrder("field out of domain")
    return order
