"""An order message as the consumer takes it in: decoded and checked field by field, so that no
single message can fail a batch's statements (docs/ARCHITECTURE.md, "Consumer")."""

from __future__ import annotations

import re

import msgspec

from db.models import MAX_AMOUNT
from service.domain.model.order_message import OrderMessage, decode_order
from service.domain.order_numbers.format import is_valid_order_no
from service.domain.purchase.request_id import USER_ID

_REQUEST_ID = re.compile(r"[0-9a-f]{32}")
_ATTEMPT = re.compile(r"[0-9a-f]{0,32}")  # service.adapters.redis.reservations.new_attempt, or none
_MAX_QUANTITY = 2**31 - 1  # orders.quantity is INT
_MAX_PRODUCT_ID = 2**63 - 1  # products.id is BIGINT
_MAX_RESERVED_AT_MS = 2**53  # Unix ms from Redis TIME; no column, but a sane clock and exact as a float


class InvalidOrder(ValueError):
    """A message that is not a well-formed order; it is dead-lettered at once."""


def parse_order(body: bytes) -> OrderMessage:
    """Decode and check a message body: every field within its column's domain, so no single
    message can fail a batch's statements.

    Raises:
        InvalidOrder: not JSON of the order shape, or a field out of its domain.
    """
    try:
        order = decode_order(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InvalidOrder(str(exc)) from exc
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
