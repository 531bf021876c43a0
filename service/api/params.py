"""Path, query and header parameter types shared by the controllers."""

from __future__ import annotations

from typing import Annotated

from litestar.params import HeaderParameter, PathParameter, QueryParameter

ProductIdPath = Annotated[int, PathParameter(ge=1, le=2**63 - 1)]
"""A product id in a path: 1 to 2**63 - 1 (BIGINT)."""

ORDER_NO_PATTERN = "^[A-Z]{2}[0-9]{24}$"
"""An order number's shape (docs/ARCHITECTURE.md, "Order numbers"): prefix, 14-digit UTC time, shard, sequence,
check digits. Documented only: the server checks it with the check digits itself and answers
``400 invalid_order_no``."""

OrderNoPath = Annotated[
    str,
    PathParameter(
        description="26 characters: prefix, UTC yyyyMMddHHmmss, shard, sequence, ISO 7064 MOD 97-10 check digits",
        schema_extra={"pattern": ORDER_NO_PATTERN, "minLength": 26, "maxLength": 26},
    ),
]

IdempotencyKeyHeader = Annotated[
    str | None,
    HeaderParameter(
        name="Idempotency-Key",
        required=False,
        description="1-64 visible ASCII characters (IETF Idempotency-Key draft); 400 invalid_idempotency_key otherwise",
        schema_extra={"pattern": "^[!-~]{1,64}$"},
    ),
]

OrderTokenHeader = Annotated[
    str | None,
    HeaderParameter(
        name="Order-Token",
        required=False,
        description="A token from POST /orders/tokens (required when the product has require_token); "
        "409 token_invalid when unknown, expired, another user's or malformed",
        schema_extra={"pattern": "^[!-~]{1,64}$"},
    ),
]

AdmissionTokenHeader = Annotated[
    str | None,
    HeaderParameter(
        name="Admission-Token",
        required=False,
        description="The admission_token the product's waiting room gave you (required when the product has "
        "waiting_room); 428 admission_required when missing, expired, used, another buyer's or malformed",
        schema_extra={"pattern": "^[!-~]{1,64}$"},
    ),
]

CursorQuery = Annotated[
    str | None,
    QueryParameter(
        description="next_cursor of the previous page", schema_extra={"pattern": "^[A-Za-z0-9_-]+$", "minLength": 1}
    ),
]

SignatureHeader = Annotated[
    str | None,
    HeaderParameter(
        name="X-Signature",
        required=False,
        description="hex(HMAC-SHA256(channel secret, raw body)); 401 invalid_signature when missing or wrong",
        schema_extra={"pattern": "^[0-9a-fA-F]{64}$"},
    ),
]
