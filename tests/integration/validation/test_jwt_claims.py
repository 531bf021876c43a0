"""JWT verification: a small clock skew is allowed on ``iat``/``nbf``/``exp`` (RFC 7519 section
4.1.4), every 401 carries ``WWW-Authenticate: Bearer`` (RFC 6750 section 3), and an optional
audience and issuer are enforced, by the verified-token cache too."""

from __future__ import annotations

import time

import jwt
import pytest

from service.api.app import create_app
from service.api.tokens import issue_token
from tests.support import serving

ORDERS = "/api/v1/orders"


def _bearer(settings, **claims) -> dict[str, str]:
    now = int(time.time())
    payload = {"sub": "skewed", "iat": now, "exp": now + 60, **claims}
    payload = {k: v for k, v in payload.items() if v is not None}
    return {"Authorization": f"Bearer {jwt.encode(payload, settings.auth.jwt_secret, algorithm='HS256')}"}


def test_the_default_leeway_is_a_few_seconds(settings):
    assert 1 <= settings.auth.leeway_seconds <= 10


@pytest.mark.parametrize(
    "offsets",
    [{"iat": 1}, {"iat": 3}, {"nbf": 2}, {"exp": -2}],
    ids=["iat 1 s ahead", "iat 3 s ahead", "nbf 2 s ahead", "expired 2 s ago"],
)
async def test_a_small_clock_skew_is_accepted(client, settings, offsets):
    now = int(time.time())
    claims = {name: now + offset for name, offset in offsets.items()}
    response = await client.get(ORDERS, headers=_bearer(settings, **claims))
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    "offsets",
    [{"iat": 60}, {"nbf": 60}, {"exp": -60}],
    ids=["iat a minute ahead", "nbf a minute ahead", "expired a minute ago"],
)
async def test_skew_beyond_the_leeway_is_refused_with_a_bearer_challenge(client, settings, offsets):
    now = int(time.time())
    claims = {name: now + offset for name, offset in offsets.items()}
    response = await client.get(ORDERS, headers=_bearer(settings, **claims))
    assert response.status_code == 401
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["code"] == "unauthorized"
    assert response.headers["www-authenticate"] == 'Bearer realm="flashsale", error="invalid_token"'


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer"}, {"Authorization": "Basic dXNlcjpwYXNz"}],
    ids=["none", "empty bearer", "basic"],
)
async def test_a_request_without_a_token_gets_a_bare_bearer_challenge(client, headers):
    for path in (ORDERS, "/api/v1/admin/products/1/stock"):
        response = await client.get(path, headers=headers)
        assert response.status_code == 401, (path, response.text)
        assert response.headers["www-authenticate"].startswith('Bearer realm="flashsale"'), path


async def test_a_forged_token_gets_an_invalid_token_challenge(client, settings):
    forged = jwt.encode({"sub": "x", "exp": int(time.time()) + 60}, "not-the-secret-but-32-characters!!", "HS256")
    response = await client.get(ORDERS, headers={"Authorization": f"Bearer {forged}"})
    assert response.status_code == 401
    assert 'error="invalid_token"' in response.headers["www-authenticate"]


@pytest.fixture(scope="module")
async def idp_client(settings):
    """An API that wants ``aud: shop`` and ``iss: https://idp.example``."""
    auth = settings.auth.model_copy(update={"audience": "shop", "issuer": "https://idp.example"})
    idp_settings = settings.model_copy(update={"auth": auth, "db": settings.db.model_copy(update={"pool_size": 2})})
    async with serving(create_app(idp_settings), timeout=30) as client:
        yield client


@pytest.mark.parametrize(
    ("claims", "status"),
    [
        ({"aud": "shop", "iss": "https://idp.example"}, 200),
        ({"aud": ["other", "shop"], "iss": "https://idp.example"}, 200),
        ({"iss": "https://idp.example"}, 401),
        ({"aud": "other", "iss": "https://idp.example"}, 401),
        ({"aud": "shop"}, 401),
        ({"aud": "shop", "iss": "https://evil.example"}, 401),
    ],
    ids=["both", "aud list", "no aud", "wrong aud", "no iss", "wrong iss"],
)
async def test_audience_and_issuer_when_configured(idp_client, settings, claims, status):
    headers = _bearer(settings, **claims)
    for _ in range(2):  # the second answer comes from the verified-token cache when the first passed
        response = await idp_client.get(ORDERS, headers=headers)
        assert response.status_code == status, response.text


async def test_issued_tokens_carry_the_configured_audience_and_issuer(idp_client, settings):
    token = issue_token(settings.auth.jwt_secret, "idp-user", audience="shop", issuer="https://idp.example")
    assert (await idp_client.get(ORDERS, headers={"Authorization": f"Bearer {token}"})).status_code == 200
    plain = issue_token(settings.auth.jwt_secret, "idp-user")
    assert (await idp_client.get(ORDERS, headers={"Authorization": f"Bearer {plain}"})).status_code == 401
