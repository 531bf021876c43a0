"""A payment channel's notification: its fields, and the HMAC-SHA256 signature over the raw body
(docs/ARCHITECTURE.md, "Payments")."""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from service.domain.errors import DomainError

Event = Literal["paid", "refunded", "refund_failed", "refund_rejected"]
"""What a notification tells: a payment, a refund done, a refund the channel failed or rejected."""

TxnId = Annotated[str, Meta(pattern=r"^[\x21-\x7e]{1,64}$")]


class Notification(msgspec.Struct, omit_defaults=True):
    """A channel's notification. ``amount`` in minor currency units; ``currency`` ISO 4217.

    Unknown fields are ignored (channels add fields such as ``paid_at`` or ``fee``; the signature
    covers the raw body, so nothing unread can be forged). On refund events ``payment_txn_id``
    names the channel's transaction of the payment being refunded and ``refund_no`` our refund
    request; both optional (a refund the channel started on its own carries neither).
    """

    channel: Annotated[str, Meta(pattern=r"^[a-z0-9_-]{1,32}$")]
    channel_txn_id: TxnId
    order_no: Annotated[str, Meta(min_length=26, max_length=26)]
    amount: Annotated[int, Meta(ge=0, le=2**62)]
    currency: Annotated[str, Meta(pattern=r"^[A-Z]{3}$")]
    event: Event
    payment_txn_id: TxnId | None = None
    refund_no: Annotated[str, Meta(pattern=r"^[\x21-\x7e]{1,32}$")] | None = None


class SignatureInvalid(DomainError):
    """Missing or wrong ``X-Signature``, or a channel without a configured secret (``invalid_signature``)."""

    code = "invalid_signature"

    def __init__(self, channel: str) -> None:
        super().__init__("Missing or wrong X-Signature for this channel.")
        self.channel = channel


def sign(secret: str, body: bytes) -> str:
    """``hex(HMAC-SHA256(secret, body))``, as a channel signs a notification."""
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def signed(secret: str, note: Notification) -> tuple[bytes, dict[str, str]]:
    """The raw JSON body of ``note`` and its headers (``X-Signature`` = :func:`sign` of that body),
    as a channel sends them."""
    body = msgspec.json.encode(note)
    return body, {"Content-Type": "application/json", "X-Signature": sign(secret, body)}


def verify(secrets: dict[str, str], channel: str, body: bytes, signature: str | None) -> None:
    """Constant-time check of ``signature`` over the raw ``body`` with ``channel``'s secret.

    Raises:
        SignatureInvalid: unknown channel, missing or wrong signature.
    """
    secret = secrets.get(channel)
    if secret is None or not signature or not signature.isascii():
        raise SignatureInvalid(channel)
    if not hmac.compare_digest(sign(secret, body).encode(), signature.lower().encode()):
        raise SignatureInvalid(channel)
