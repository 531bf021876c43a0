"""Authentication: Litestar's JWT auth (HS256). ``sub`` is the user id; ``role: admin`` marks admins.

Tokens are verified with PyJWT's checks (:mod:`service.api.token_verifier`) under a clock-skew
allowance (``FLASHSALE_AUTH__LEEWAY_SECONDS``) for ``exp``, ``nbf`` and ``iat`` (RFC 7519 section
4.1.4 allows "some small leeway"), and, when configured, an audience and an issuer
(``FLASHSALE_AUTH__AUDIENCE`` / ``__ISSUER``); a token longer than ``FLASHSALE_AUTH__MAX_TOKEN_BYTES``
is refused before anything reads it, the cache included. Every 401 carries ``WWW-Authenticate: Bearer``
(RFC 6750 section 3): ``error="invalid_token"`` when a token was sent but refused, no error code
when none was sent.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jwt
from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException, PermissionDeniedException
from litestar.handlers.base import BaseRouteHandler
from litestar.middleware import DefineMiddleware
from litestar.middleware.authentication import AuthenticationResult
from litestar.security.jwt import JWTAuth, JWTAuthenticationMiddleware, Token

from service.api.token_verifier import ALGORITHM, TokenVerifier
from service.domain.purchase.request_id import USER_ID

REALM = "flashsale"
BEARER_PREFIX = "Bearer "
BEARER_CHALLENGE = f'Bearer realm="{REALM}"'
"""``WWW-Authenticate`` of a 401 to a request that sent no token (RFC 6750 section 3.1)."""
INVALID_TOKEN_CHALLENGE = f'Bearer realm="{REALM}", error="invalid_token"'
"""``WWW-Authenticate`` of a 401 to a request whose token was refused (RFC 6750 section 3.1)."""
PUBLIC_PATHS = ["/schema", "/api/v1/health", "^/api/v1/products/[^/]+$", "^/api/v1/payments/notify$"]
"""Paths that need no token (regular expressions, as Litestar's ``exclude``): the schema, health,
product info (not what lies below it: the waiting room's routes are a buyer's) and payment
notifications (signed by the channel instead). Matched against request paths and route templates."""
EXCLUDE_OPT = "exclude_from_auth"
"""``opt`` key of a handler that needs no token (Litestar's ``exclude_opt_key``)."""
_PUBLIC = re.compile("|".join(PUBLIC_PATHS))


@dataclass
class FlashsaleToken(Token):
    """The JWT claims: registered ones plus ``role`` (``"admin"`` for admin routes)."""

    role: str | None = None


@dataclass(frozen=True, slots=True)
class User:
    """The caller. ``id`` is the JWT ``sub`` (1-64 of ``A-Za-z0-9_.:@-``)."""

    id: str
    is_admin: bool


def _refused(detail: str) -> NotAuthorizedException:
    return NotAuthorizedException(detail, headers={"WWW-Authenticate": INVALID_TOKEN_CHALLENGE})


def _user_from_claims(claims: dict[str, Any]) -> User:
    sub, role = claims.get("sub"), claims.get("role")
    if not isinstance(sub, str) or not USER_ID.fullmatch(sub):
        raise _refused("Token subject is not a valid user id")
    if role is not None and not isinstance(role, str):
        raise _refused("Token role is not a string")
    return User(id=sub, is_admin=role == "admin")


class CachingJWTMiddleware(JWTAuthenticationMiddleware):
    """Litestar's JWT middleware, verifying with :class:`service.api.token_verifier.TokenVerifier`
    (PyJWT's checks, a first-seen token cheap) under a clock-skew leeway, with a per-process
    cache of verified tokens.

    A buyer in a stampede sends the same token many times; verifying its HS256 signature and
    decoding its claims every time was the largest cost on the reject path. The cache maps the
    exact encoded token (signature included, so a forged token never matches) to the user it
    proved, until the token's ``exp`` (read as PyJWT reads it: ``int(exp)``, a fraction dropped)
    plus the leeway: then it is verified again (and so refused).
    Only tokens that verified (signature, ``exp``/``nbf``/``iat`` within the leeway, audience and
    issuer when configured) are cached; at most ``MAX_ENTRIES`` (cleared whole when full, so
    memory stays bounded under a flood of distinct tokens).
    """

    MAX_ENTRIES = 100_000

    def __init__(self, *args: Any, leeway_seconds: float = 0.0, max_token_length: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.leeway_seconds = leeway_seconds
        self._verified: dict[str, tuple[float, AuthenticationResult]] = {}
        self._raw_header = self.auth_header.lower().encode("latin-1")
        if self.algorithm != ALGORITHM:
            raise ValueError(f"tokens are {ALGORITHM}, not {self.algorithm}")
        self._verifier = TokenVerifier(
            self.token_secret,
            leeway=leeway_seconds,
            required=list(self.require_claims or ()),
            max_length=max_token_length,
            audience=self.token_audience,
            issuer=self.token_issuer,
        )

    async def authenticate_request(self, connection: ASGIConnection[Any, Any, Any, Any]) -> AuthenticationResult:
        self._refuse_oversized(connection)
        scheme, _, encoded_token = connection.headers.get(self.auth_header, "").partition(" ")
        if not encoded_token:
            raise NotAuthorizedException(
                "A bearer token is required (Authorization: Bearer <JWT>)",
                headers={"WWW-Authenticate": BEARER_CHALLENGE},
            )
        return await self.authenticate_token(encoded_token, connection)

    async def authenticate_token(
        self, encoded_token: str, connection: ASGIConnection[Any, Any, Any, Any]
    ) -> AuthenticationResult:
        cached = self._verified.get(encoded_token)
        if cached is not None:
            if time.time() < cached[0]:
                return cached[1]
            del self._verified[encoded_token]
        claims = self._verify(encoded_token)
        result = AuthenticationResult(user=_user_from_claims(claims), auth=claims)
        if len(self._verified) >= self.MAX_ENTRIES:
            self._verified.clear()
        self._verified[encoded_token] = (int(claims["exp"]) + self.leeway_seconds, result)
        return result

    def _refuse_oversized(self, connection: ASGIConnection[Any, Any, Any, Any]) -> None:
        """Refuse a request whose token header is longer than ``Bearer `` and the longest token,
        read from the raw headers: ``connection.headers`` decodes every header value first."""
        for name, value in connection.scope["headers"]:
            if name == self._raw_header:
                try:
                    self._verifier.refuse_oversized(len(value) - len(BEARER_PREFIX))
                except jwt.InvalidTokenError as exc:
                    raise _refused(f"Invalid token: {exc}") from exc

    def _verify(self, encoded_token: str) -> dict[str, Any]:
        try:
            return self._verifier.verify(encoded_token)
        except jwt.InvalidTokenError as exc:
            raise _refused(f"Invalid token: {exc}") from exc


@dataclass
class FlashsaleJWTAuth(JWTAuth[User, FlashsaleToken]):
    """Litestar's ``JWTAuth`` whose middleware allows ``leeway_seconds`` of clock skew and refuses
    tokens longer than ``max_token_length`` characters."""

    leeway_seconds: float = field(default=5.0)
    max_token_length: int = field(kw_only=True)

    @property
    def middleware(self) -> DefineMiddleware:
        define = super().middleware
        define.kwargs["leeway_seconds"] = self.leeway_seconds
        define.kwargs["max_token_length"] = self.max_token_length
        return define


async def _retrieve_user(token: FlashsaleToken, _: ASGIConnection[Any, Any, Any, Any]) -> User:
    # Litestar's interface wants it; CachingJWTMiddleware builds the user from the verified claims.
    return User(id=token.sub, is_admin=token.role == "admin")


async def admin_only(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Guard: only callers whose token has ``role: admin``. Safe on every method: an ``OPTIONS``
    request (which the JWT middleware lets through without a token) passes to the app's OPTIONS
    answer; a request that reached the guard without a user is refused, never a 500.

    Raises:
        NotAuthorizedException: 401 when no token authenticated the request.
        PermissionDeniedException: 403 for any other caller.
    """
    if connection.scope.get("method") == "OPTIONS":
        return
    user = connection.scope.get("user")
    if not isinstance(user, User):
        raise NotAuthorizedException("A bearer token is required", headers={"WWW-Authenticate": BEARER_CHALLENGE})
    if not user.is_admin:
        raise PermissionDeniedException("Admin role required")


def requires_token(route_handler: BaseRouteHandler, path: str) -> bool:
    """Whether the JWT middleware asks a request to ``path`` handled by ``route_handler`` for a token."""
    return not route_handler.opt.get(EXCLUDE_OPT) and _PUBLIC.search(path) is None


def make_jwt_auth(
    secret: str,
    *,
    max_token_length: int,
    leeway_seconds: float = 5.0,
    audience: str | Sequence[str] | None = None,
    issuer: str | Sequence[str] | None = None,
) -> FlashsaleJWTAuth:
    """Litestar JWT auth; everything but health, product info, the schema and payment
    notifications (signed by the channel instead) needs a token. ``max_token_length``: a longer
    token is refused unread; ``leeway_seconds``: clock skew allowed on ``exp``/``nbf``/``iat``;
    ``audience`` / ``issuer``: when given, a token must carry a matching ``aud`` / ``iss``."""
    return FlashsaleJWTAuth(
        token_secret=secret,
        token_cls=FlashsaleToken,
        retrieve_user_handler=_retrieve_user,
        require_claims=["exp", "sub"],
        authentication_middleware_class=CachingJWTMiddleware,
        exclude=PUBLIC_PATHS,
        exclude_opt_key=EXCLUDE_OPT,
        accepted_audiences=audience,
        accepted_issuers=issuer,
        leeway_seconds=leeway_seconds,
        max_token_length=max_token_length,
    )
