"""Request ids: the idempotency key of an order (``orders.request_id``, the AMQP ``message_id``),
and which one a purchase request carries (:func:`identify`).

Always 32 lowercase hex characters:
- minted by the server when no ``Idempotency-Key`` is sent: 48-bit Unix milliseconds followed
  by 80 random bits, so ids sort by creation time;
- derived from an ``Idempotency-Key`` (IETF "The Idempotency-Key HTTP Header Field" draft):
  the first 128 bits of SHA-256 over user, product and key, so the key is scoped to the user
  (and the product whose Redis slot keeps the replay record).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time

from service.domain.errors import Conflict, InvalidInput
from service.domain.purchase.answers import rejected
from service.model.stock import ReserveOutcome

_IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,64}")
USER_ID = re.compile(r"[A-Za-z0-9_.:@-]{1,64}")
"""User ids (JWT ``sub``): 1-64 of ``A-Za-z0-9_.:@-``; never ``|``, the journal's field separator."""


def is_valid_idempotency_key(value: str) -> bool:
    """1-64 visible ASCII characters (0x21-0x7E)."""
    return bool(_IDEMPOTENCY_KEY.fullmatch(value))


def mint_request_id() -> str:
    """A new time-ordered request id (32 lowercase hex)."""
    return f"{time.time_ns() // 1_000_000:012x}{secrets.token_hex(10)}"


def reissued_request_id(request_id: str, order_no: str) -> str:
    """The request id under which the consumer writes an order whose request id is already taken
    by an earlier order: the client reused its Idempotency-Key after the replay record expired
    (24 h by default), so the API took it as a new purchase with a new order number. 32 hex."""
    return hashlib.sha256(f"{request_id}\n{order_no}".encode()).hexdigest()[:32]


def request_id_from_key(user_id: str, product_id: int, idempotency_key: str) -> str:
    """The request id of ``idempotency_key`` sent by ``user_id`` for ``product_id`` (32 lowercase hex)."""
    digest = hashlib.sha256(f"{user_id}\n{product_id}\n{idempotency_key}".encode())
    return digest.hexdigest()[:32]


def request_id_for(user_id: str, product_id: int, idempotency_key: str | None) -> str:
    """The purchase's request id: derived from ``idempotency_key`` when the client sent one
    (IETF Idempotency-Key draft, scoped to user and product), else a new minted one.

    Raises:
        InvalidInput: ``invalid_idempotency_key`` (not 1-64 visible ASCII characters).
    """
    if idempotency_key is None:
        return mint_request_id()
    if not is_valid_idempotency_key(idempotency_key):
        raise InvalidInput("Idempotency-Key", "must be 1-64 visible ASCII characters", "invalid_idempotency_key")
    return request_id_from_key(user_id, product_id, idempotency_key)


def identify(
    user_id: str,
    product_id: int,
    idempotency_key: str | None,
    order_token: str | None,
    admission_token: str | None,
) -> str | None:
    """The request id a purchase's headers name, or None when they name none (no
    ``Idempotency-Key``, ``Order-Token`` or ``Admission-Token``: the server mints one,
    :func:`mint_request_id`, and a standing sold-out flag may answer first). An ``Order-Token``
    is the purchase's key (it wins over ``Idempotency-Key``); without an ``Idempotency-Key`` an
    ``Admission-Token`` is (a retry after a 503 with the same admission is the same purchase:
    its record holds the admission it consumed).

    Raises:
        PurchaseRejected: ``admission_required`` (an ``Admission-Token`` that cannot be one).
        Conflict: ``token_invalid`` (an ``Order-Token`` that cannot be one).
        InvalidInput: ``invalid_idempotency_key``.
    """
    if admission_token is not None and not is_valid_idempotency_key(admission_token):
        raise rejected(ReserveOutcome.ADMISSION_REQUIRED)
    if order_token is not None:
        if not is_valid_idempotency_key(order_token):
            raise Conflict("The Order-Token is unknown, expired or not yours.", code="token_invalid")
        return request_id_from_key(user_id, product_id, f"order-token:{order_token}")
    if idempotency_key is None and admission_token is not None:
        return request_id_from_key(user_id, product_id, f"admission:{admission_token}")
    if idempotency_key is None:
        return None
    return request_id_for(user_id, product_id, idempotency_key)
