"""Authentication: HS256 bearer JWTs. ``sub`` is the user id; ``role: admin`` marks admins.

:class:`Authenticator` runs in the app's ``before_request`` hook (:mod:`service.api.hooks`), not as
a middleware: any route middleware makes Litestar wrap every route in a second exception-handling
layer, and Litestar's JWT middleware wrapped every request (docs/BENCHMARKS.md, "What the profile
showed"). Guards are not used for it either: Litestar hands each guard call a copy of the route
handler (``BaseRouteHandler.authorize_connection``, about 19 µs a call here). The one guard,
:func:`admin_only`, runs before the hook and authenticates the request itself.

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
from dataclasses import dataclass
from typing import Any

import jwt
from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException, PermissionDeniedException
from litestar.handlers.base import BaseRouteHandler
from litestar.types import Scope

from service.api.token_verifier import TokenVerifier
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
"""``opt`` key of a handler that needs no token (``@get(..., exclude_from_auth=True)``)."""
REQUIRED_CLAIMS = ("exp", "sub")
_PUBLIC = re.compile("|".join(PUBLIC_PATHS))


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


class Authenticator:
    """Authenticates a request from its ``Authorization: Bearer <JWT>`` header: sets the caller
    (:class:`User`) as ``scope["user"]`` (Litestar's ``request.user``) and the claims as
    ``scope["auth"]``, or raises a 401.

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

    def __init__(
        self,
        secret: str,
        *,
        max_token_length: int,
        leeway_seconds: float = 5.0,
        audience: str | Sequence[str] | None = None,
        issuer: str | Sequence[str] | None = None,
    ) -> None:
        self.leeway_seconds = leeway_seconds
        self._verified: dict[str, tuple[float, User, dict[str, Any]]] = {}
        # the header's longest value: the scheme, its space and the longest token
        self._max_header = max_token_length + len(BEARER_PREFIX)
        self._verifier = TokenVerifier(
            secret,
            leeway=leeway_seconds,
            required=REQUIRED_CLAIMS,
            max_length=max_token_length,
            audience=audience or None,
            issuer=issuer or None,
        )

    def authenticate(self, scope: Scope) -> User:
        """The caller of the request ``scope``, also set as ``scope["user"]``.

        Raises:
            NotAuthorizedException: no token (401, ``WWW-Authenticate: Bearer``), or a token that
                is refused (401, ``error="invalid_token"``).
        """
        for name, value in scope["headers"]:
            if name == b"authorization":
                # the length first, on the raw bytes: nothing longer is decoded, let alone verified
                if len(value) > self._max_header:
                    self._refuse_oversized(len(value) - len(BEARER_PREFIX))
                encoded_token = value.decode("latin-1").partition(" ")[2]
                if encoded_token:
                    user, claims = self.authenticate_token(encoded_token)
                    scope["user"], scope["auth"] = user, claims
                    return user
                break
        raise NotAuthorizedException(
            "A bearer token is required (Authorization: Bearer <JWT>)",
            headers={"WWW-Authenticate": BEARER_CHALLENGE},
        )

    def authenticate_token(self, encoded_token: str) -> tuple[User, dict[str, Any]]:
        """The user an encoded token proves, and its claims (from the cache while it holds).

        Raises:
            NotAuthorizedException: the token is refused (401, ``error="invalid_token"``).
        """
        cached = self._verified.get(encoded_token)
        if cached is not None:
            if time.time() < cached[0]:
                return cached[1], cached[2]
            del self._verified[encoded_token]
        try:
            claims = self._verifier.verify(encoded_token)
        except jwt.InvalidTokenError as exc:
            raise _refused(f"Invalid token: {exc}") from exc
        user = _user_from_claims(claims)
        if len(self._verified) >= self.MAX_ENTRIES:
            self._verified.clear()
        self._verified[encoded_token] = (int(claims["exp"]) + self.leeway_seconds, user, claims)
        return user, claims

    def _refuse_oversized(self, length: int) -> None:
        try:
            self._verifier.refuse_oversized(length)
        except jwt.InvalidTokenError as exc:
            raise _refused(f"Invalid token: {exc}") from exc


AUTHENTICATOR = "flashsale.authenticator"
"""Key of the app's :class:`Authenticator` in ``app.state`` (for :func:`admin_only`)."""


async def admin_only(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Guard: only callers whose token has ``role: admin``. Guards run before the app's
    ``before_request`` hook, so this one authenticates the request itself (the hook then finds
    the user set). An ``OPTIONS`` request passes to the app's OPTIONS answer.

    Raises:
        NotAuthorizedException: 401 when no token authenticated the request.
        PermissionDeniedException: 403 for any other caller.
    """
    scope = connection.scope
    if scope.get("method") == "OPTIONS":
        return
    user = scope.get("user")
    if not isinstance(user, User):
        user = connection.app.state[AUTHENTICATOR].authenticate(scope)
    if not user.is_admin:
        raise PermissionDeniedException("Admin role required")


def requires_token(route_handler: BaseRouteHandler, path: str) -> bool:
    """Whether a request to ``path`` handled by ``route_handler`` must bring a token: everything
    but the routes marked ``exclude_from_auth`` and the :data:`PUBLIC_PATHS`."""
    return not route_handler.opt.get(EXCLUDE_OPT) and _PUBLIC.search(path) is None
