"""An order message as the consumer takes it in: decoded (either body format,
:mod:`service.model.order_message`) and checked field by field, so that no single order
can fail a batch's statements (docs/ARCHITECTURE.md, "Consumer")."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import msgspec

from db.models import MAX_AMOUNT
from service.domain.order_numbers.format import is_valid_order_no
from service.domain.purchase.request_id import USER_ID
from service.model.order_message import OrderGroup, OrderMessage, decode_order

_REQUEST_ID = re.compile(r"[0-9a-f]{32}")
_ATTEMPT = re.compile(r"[0-9a-f]{0,32}")  # service.adapters.redis.reservations.new_attempt, or none
_MAX_QUANTITY = 2**31 - 1  # orders.quantity is INT
_MAX_PRODUCT_ID = 2**63 - 1  # products.id is BIGINT
_MAX_RESERVED_AT_MS = 2**53  # Unix ms from Redis TIME; no column, but a sane clock and exact as a float


class InvalidOrder(ValueError):
    """A message that is not a well-formed order; it is dead-lettered at once."""


@dataclass(frozen=True, slots=True)
class Malformed:
    """An order of a group that does not decode as an order (a field of the wrong type, one
    missing): its own JSON, dead-lettered alone under ``request_id`` (its own when it names one,
    else ``<group id>.<position>``), so that its neighbours are written."""

    request_id: str
    body: bytes


class _Envelope(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A group body with its orders left undecoded (:class:`OrderGroup` but for ``orders``)."""

    v: Literal[1]
    id: str
    orders: list[msgspec.Raw]
    http_request_ids: list[str | None] | None = None


class _Named(msgspec.Struct, frozen=True):
    request_id: str | None = None


_envelope = msgspec.json.Decoder(_Envelope)
_named = msgspec.json.Decoder(_Named)


@dataclass(frozen=True, slots=True)
class Incoming:
    """What one message body carries: ``group`` the group envelope (None for a body in the
    single-order format; its ``orders`` are those that decoded), its ``orders`` in body order
    (a :class:`Malformed` for one that does not decode), and by position why an order cannot be
    written (``invalid``; None for a good one): such an order of a group is dead-lettered alone,
    the others are written."""

    group: OrderGroup | None
    orders: list[OrderMessage | Malformed]
    invalid: list[InvalidOrder | None]

    def decoded(self) -> list[OrderMessage]:
        """The orders that decoded (well-formed, in their domain or not)."""
        return [order for order in self.orders if isinstance(order, OrderMessage)]


def parse_body(body: bytes) -> Incoming:
    """Decode a message body of either format and check its orders (:func:`check_order`); a
    group order by order (:class:`Malformed`).

    Raises:
        InvalidOrder: neither format, an empty group, or a single-order body that is no order or
            is out of its domain (nothing of it can be written).
    """
    try:
        envelope = _envelope.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as group_error:
        try:
            single = decode_order(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise InvalidOrder(str(group_error if b'"orders"' in body else exc)) from exc
        return Incoming(None, [check_order(single)], [None])
    if not envelope.orders:
        raise InvalidOrder("a group without orders")
    orders: list[OrderMessage | Malformed] = []
    invalid: list[InvalidOrder | None] = []
    for position, raw in enumerate(envelope.orders):
        try:
            order = decode_order(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            orders.append(Malformed(_name_of(raw, f"{envelope.id}.{position}"), bytes(raw)))
            invalid.append(InvalidOrder(str(exc)))
            continue
        orders.append(order)
        invalid.append(_why_invalid(order))
    group = OrderGroup(
        envelope.v, envelope.id, [o for o in orders if isinstance(o, OrderMessage)], envelope.http_request_ids
    )
    return Incoming(group, orders, invalid)


def _name_of(raw: msgspec.Raw, otherwise: str) -> str:
    """The request id a malformed order names (a string in the request id's format), else ``otherwise``."""
    try:
        named = _named.decode(raw).request_id
    except (msgspec.DecodeError, msgspec.ValidationError):
        return otherwise
    return named if named is not None and _REQUEST_ID.fullmatch(named) else otherwise


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
