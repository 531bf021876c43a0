"""Authentication: Litestar's JWT auth (HS256). ``sub`` is the user id; ``role: admin`` marks admins."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException, PermissionDeniedException
from litestar.handlers.base import BaseRouteHandler
from litestar.middleware.authentication import AuthenticationResult
from litestar.security.jwt import JWTAuth, JWTAuthenticationMiddleware, Token

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


class CachingJWTMiddleware(JWTAuthenticationMiddleware):
    """Litestar's JWT middleware with a per-process cache of verified tokens.

    A buyer in a stampede sends the same token many times; verifying its HS256 signature and
    decoding its claims every time was the largest cost on the reject path. The cache maps the
    exact encoded token (signature included, so a forged token never matches) to the user it
    proved, until the token's ``exp``: an expired token is verified again (and so refused).
    Only tokens that verified are cached; at most ``MAX_ENTRIES`` (cleared whole when full, so
    memory stays bounded under a flood of distinct tokens).
    """

    MAX_ENTRIES = 100_000

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._verified: dict[str, tuple[float, AuthenticationResult]] = {}

    async def authenticate_token(
        self, encoded_token: str, connection: ASGIConnection[Any, Any, Any, Any]
    ) -> AuthenticationResult:
        cached = self._verified.get(encoded_token)
        if cached is not None:
            if time.time() < cached[0]:
                return cached[1]
            del self._verified[encoded_token]
        result = await super().authenticate_token(encoded_token, connection)
        if len(self._verified) >= self.MAX_ENTRIES:
            self._verified.clear()
        self._verified[encoded_token] = (result.auth.exp.timestamp(), result)
        return result


async def _retrieve_user(token: FlashsaleToken, _: ASGIConnection[Any, Any, Any, Any]) -> User:
    if not USER_ID.fullmatch(token.sub):
        raise NotAuthorizedException("Token subject is not a valid user id")
    return User(id=token.sub, is_admin=token.role == "admin")


async def admin_only(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
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
        authentication_middleware_class=CachingJWTMiddleware,
        exclude=["/schema", "/api/v1/health", "^/api/v1/products/", "^/api/v1/payments/notify$"],
    )


def decode_admin(secret: str, encoded: str) -> bool:
    """True when ``encoded`` is a valid, unexpired token of this secret with ``role: admin``
    (for the one route that takes its token outside the header: ``GET /ops?token=``)."""
    try:
        token = FlashsaleToken.decode(encoded, secret, "HS256")
    except NotAuthorizedException:
        return False
    return token.role == "admin" and bool(USER_ID.fullmatch(token.sub))


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
