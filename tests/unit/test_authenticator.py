"""The API's authenticator (service/api/auth.py): its verified-token cache holds a token no longer
than PyJWT accepts it, and what PyJWT would take without a date is a 401, never a 500."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import time
from typing import Any

import jwt
import pytest
from litestar.exceptions import NotAuthorizedException

from service.api.auth import Authenticator

SECRET = "a-test-secret-of-at-least-32-characters"


def _middleware(leeway: float) -> Authenticator:
    return Authenticator(SECRET, leeway_seconds=leeway, max_token_length=4096)


def _signed(payload: bytes) -> str:
    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    signing_input = b64(b'{"alg":"HS256","typ":"JWT"}') + "." + b64(payload)
    return signing_input + "." + b64(hmac.new(SECRET.encode(), signing_input.encode(), hashlib.sha256).digest())


async def _authenticate(middleware: Authenticator, token: str) -> Any:
    return middleware.authenticate_token(token)[0]


async def test_a_fractional_exp_leaves_the_cache_when_pyjwt_stops_accepting_it():
    middleware = _middleware(leeway=0)
    whole = int(time.time()) + 2
    token = jwt.encode({"sub": "buyer-1", "exp": whole + 0.9}, SECRET, algorithm="HS256")
    assert (await _authenticate(middleware, token)).id == "buyer-1"  # verified, now cached
    while time.time() < whole + 0.1:
        await asyncio.sleep(0.02)
    with pytest.raises(jwt.ExpiredSignatureError):  # PyJWT reads exp as int(exp): expired at `whole`
        jwt.decode(token, SECRET, algorithms=["HS256"])
    with pytest.raises(NotAuthorizedException):
        await _authenticate(middleware, token)


@pytest.mark.parametrize(
    "exp", ["1" + "0" * 400, '"1' + "0" * 400 + '"', str(2**64)], ids=["10**400", "10**400 as a string", "2**64"]
)
async def test_an_exp_beyond_any_date_is_refused(exp):
    token = _signed(b'{"sub":"buyer-1","exp":' + exp.encode() + b"}")
    assert jwt.decode(token, SECRET, algorithms=["HS256"])  # PyJWT alone takes it
    for _ in range(2):
        with pytest.raises(NotAuthorizedException, match="exp claim is out of range"):
            await _authenticate(_middleware(leeway=5), token)


async def test_a_token_over_the_length_cap_is_refused_and_never_cached():
    middleware = _middleware(leeway=5)
    token = jwt.encode({"sub": "buyer-1", "exp": int(time.time()) + 60, "pad": "x" * 4000}, SECRET, algorithm="HS256")
    for _ in range(2):
        with pytest.raises(NotAuthorizedException, match="longer than 4096"):
            await _authenticate(middleware, token)
    assert middleware._verified == {}


def _scope(authorization: bytes | None) -> dict[str, Any]:
    headers = [(b"host", b"api")] + ([(b"authorization", authorization)] if authorization is not None else [])
    return {"type": "http", "headers": headers}


@pytest.mark.parametrize("header", [None, b"Bearer", b"Bearer "], ids=["none", "scheme only", "scheme and space"])
def test_a_request_without_a_token_is_asked_for_one(header):
    scope = _scope(header)
    with pytest.raises(NotAuthorizedException) as refused:
        _middleware(leeway=5).authenticate(scope)  # type: ignore[arg-type]
    assert refused.value.headers == {"WWW-Authenticate": 'Bearer realm="flashsale"'}
    assert "user" not in scope


def test_a_header_over_the_cap_is_refused_before_it_is_decoded():
    authenticator = _middleware(leeway=5)
    calls: list[str] = []
    authenticator.authenticate_token = calls.append  # type: ignore[method-assign,assignment]
    scope = _scope(b"Bearer " + b"\xff" * 4097)  # not even latin-1 text a token could be
    with pytest.raises(NotAuthorizedException, match="longer than 4096") as refused:
        authenticator.authenticate(scope)  # type: ignore[arg-type]
    assert refused.value.headers == {"WWW-Authenticate": 'Bearer realm="flashsale", error="invalid_token"'}
    assert calls == [] and "user" not in scope


def test_a_valid_token_sets_the_user_and_the_claims_in_the_scope():
    token = jwt.encode({"sub": "buyer-1", "exp": int(time.time()) + 60, "role": "admin"}, SECRET, algorithm="HS256")
    scope = _scope(b"Bearer " + token.encode())
    user = _middleware(leeway=5).authenticate(scope)  # type: ignore[arg-type]
    assert (user.id, user.is_admin) == ("buyer-1", True)
    assert scope["user"] is user and scope["auth"]["sub"] == "buyer-1"
    header_at_the_cap = b"Bearer " + b"x" * 4096  # at the cap: decoded and verified (and refused)
    with pytest.raises(NotAuthorizedException, match="Invalid token: (?!Token is longer)"):
        _middleware(leeway=5).authenticate(_scope(header_at_the_cap))  # type: ignore[arg-type]
