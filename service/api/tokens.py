"""Issuing the API's JWTs (HS256, ``sub`` the user id, ``role: admin`` for admins), as
``flashsale token`` and the tests sign them; :mod:`service.api.auth` verifies them with
Litestar's JWT auth. PyJWT alone: a short command does not load the web framework."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import jwt

from service.domain.purchase.request_id import USER_ID


def issue_token(
    secret: str,
    user_id: str,
    admin: bool = False,
    ttl_seconds: int = 3600,
    *,
    audience: str | None = None,
    issuer: str | None = None,
) -> str:
    """A signed JWT for ``user_id`` valid ``ttl_seconds`` seconds (``role: admin`` when ``admin``;
    ``aud`` / ``iss`` when given): the claims Litestar's ``Token`` encodes.

    Raises:
        ValueError: ``user_id`` is not a valid user id.
    """
    if not USER_ID.fullmatch(user_id):
        raise ValueError("user id must be 1-64 of A-Za-z0-9_.:@-")
    now = datetime.now(UTC)
    claims: dict[str, Any] = {"exp": now + timedelta(seconds=ttl_seconds), "sub": user_id, "iat": now}
    optional = {"iss": issuer, "aud": audience, "role": "admin" if admin else None}
    claims.update({name: value for name, value in optional.items() if value is not None})
    return jwt.encode(claims, secret, algorithm="HS256")
