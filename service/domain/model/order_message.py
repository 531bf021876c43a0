"""The order message: an accepted reservation on its way from the API to the consumer, as the
JSON body of one AMQP message (docs/ARCHITECTURE.md, "Consumer")."""

from __future__ import annotations

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


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(OrderMessage)


def encode_order(message: OrderMessage) -> bytes:
    """JSON body of an order message."""
    return _encoder.encode(message)


def decode_order(body: bytes) -> OrderMessage:
    """Raises ``msgspec.DecodeError``/``msgspec.ValidationError`` for a body that is not an order."""
    return _decoder.decode(body)
