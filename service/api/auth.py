"""Authentication: Litestar's JWT auth (HS256). ``sub`` is the user id; ``role: admin`` marks admins."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException, PermissionDeniedException
from litestar.handlers.base import BaseRouteHandler
from litestar.security.jwt import JWTAuth, Token

from service.domain.request_id import USER_ID


@dataclass
class FlashsaleToken(Token):
    """The JWT claims: registered ones plus ``role`` (``"admin"`` for admin routes)."""

    role: str | None = None


@dataclass(frozen=True, slots=True)
class User:
    """The caller. ``id`` is the JWT ``sub`` (1-64 of ``A-Za-z0-9_.:@-``)."""

    id: str
    is_admin: bool


async def _retrieve_user(token: FlashsaleToken, _: ASGIConnection[Any, Any, Any, Any]) -> User:
    if not USER_ID.fullmatch(token.sub):
        raise NotAuthorizedException("Token subject is not a valid user id")
    return User(id=token.sub, is_admin=token.role == "admin")


def admin_only(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Guard: only callers whose token has ``role: admin``.

    Raises:
        PermissionDeniedException: 403 for any other caller.
    """
    if not connection.user.is_admin:
        raise PermissionDeniedException("Admin role required")


def make_jwt_auth(secret: str) -> JWTAuth[User, FlashsaleToken]:
    """Litestar JWT auth; everything but health, product info, the schema and payment
    notifications (signed by the channel instead) needs a token."""
    return JWTAuth[User, FlashsaleToken](
        token_secret=secret,
        token_cls=FlashsaleToken,
        retrieve_user_handler=_retrieve_user,
        require_claims=["exp", "sub"],
        exclude=["/schema", "/api/v1/health", "^/api/v1/products/", "^/api/v1/payments/notify$"],
    )


def issue_token(secret: str, user_id: str, admin: bool = False, ttl_seconds: int = 3600) -> str:
    """A signed JWT for ``user_id`` valid ``ttl_seconds`` seconds (``role: admin`` when ``admin``).

    Raises:
        ValueError: ``user_id`` is not a valid user id.
    """
    if not USER_ID.fullmatch(user_id):
        raise ValueError("user id must be 1-64 of A-Za-z0-9_.:@-")
    auth = make_jwt_auth(secret)
    return auth.create_token(
        identifier=user_id, token_expiration=timedelta(seconds=ttl_seconds), role="admin" if admin else None
    )
