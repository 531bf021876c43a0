"""The order message: accepted reservations on their way from the API to the consumer, as the
JSON body of one AMQP message (docs/ARCHITECTURE.md, "Order messages and groups").

Two body formats, both read by :func:`decode_body`:

- one order (:class:`OrderMessage`), the format of every message before groups and still the
  one of a message carrying a single order (``FLASHSALE_AMQP__GROUP_MAX=1``, a group that met
  no other order within its linger, a dead-lettered order);
- a group (:class:`OrderGroup`, ``"v": 1``): an envelope with the group's id and its orders,
  each with its own request id, order number and price.
"""

from __future__ import annotations

from typing import Literal

import msgspec


class OrderMessage(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """An accepted reservation, to be written to MySQL by the consumer (JSON body).

    ``quantity`` in units; ``reserved_at_ms`` in Unix milliseconds (Redis server time);
    ``amount`` in minor currency units, priced when the stock was reserved; ``bucket`` the stock
    bucket it was reserved in (:mod:`service.domain.stock.buckets`; left out of the body when 0);
    ``attempt`` the token of the HTTP attempt whose reservation it carries (left out when unknown:
    a re-publish by realignment). A ``released`` tombstone drops a message only when it names that
    very attempt (``lua/claim.lua``): a Redis rolled back to before a retry cannot drop the retry.
    """

    request_id: str
    order_no: str
    user_id: str
    product_id: int
    quantity: int
    reserved_at_ms: int
    amount: int
    bucket: int = 0
    attempt: str = ""


GROUP_FORMAT: Literal[1] = 1
"""The version of the group body :class:`OrderGroup` writes (``"v"``); a body of another
version is no order to this code (dead-lettered ``invalid_order``, redriven after an upgrade)."""


class OrderGroup(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """Orders published in one AMQP message (JSON body): ``id`` the group's id (also the AMQP
    ``message_id``), ``orders`` in the order they were reserved, and ``http_request_ids`` the
    HTTP request each came with, by position (left out when none is known)."""

    v: Literal[1]
    id: str
    orders: list[OrderMessage]
    http_request_ids: list[str | None] | None = None

    def http_request_id(self, index: int) -> str | None:
        """The HTTP request the ``index``-th order came with, if known."""
        ids = self.http_request_ids
        return ids[index] if ids is not None and index < len(ids) else None


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(OrderMessage)
_group_decoder = msgspec.json.Decoder(OrderGroup)


def encode_order(message: OrderMessage) -> bytes:
    """JSON body of an order message."""
    return _encoder.encode(message)


def decode_order(body: bytes) -> OrderMessage:
    """Raises ``msgspec.DecodeError``/``msgspec.ValidationError`` for a body that is not an order."""
    return _decoder.decode(body)


def encode_group(group: OrderGroup) -> bytes:
    """JSON body of a group of orders."""
    return _encoder.encode(group)


def decode_body(body: bytes) -> OrderGroup | OrderMessage:
    """The group or the single order ``body`` carries (either format: a rolling upgrade leaves
    single-order messages in the queues).

    Raises:
        msgspec.DecodeError, msgspec.ValidationError: neither format (the error of the format
            the body looks like: a group when it names ``"orders"``).
    """
    try:
        return _group_decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as group_error:
        try:
            return _decoder.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            if b'"orders"' in body:
                raise group_error from None
            raise


def orders_of(body: bytes) -> list[OrderMessage]:
    """The orders ``body`` carries, in either format (see :func:`decode_body`, which raises)."""
    decoded = decode_body(body)
    return decoded.orders if isinstance(decoded, OrderGroup) else [decoded]
