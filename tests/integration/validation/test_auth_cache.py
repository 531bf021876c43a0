"""The verified-token cache never accepts what Litestar's JWT check would refuse."""

from __future__ import annotations

import asyncio
import time

import jwt

from service.api.tokens import issue_token


async def test_a_cached_token_is_refused_once_it_expires(client, settings):
    token = issue_token(settings.auth.jwt_secret, "short-lived", ttl_seconds=1)
    headers = {"Authorization": f"Bearer {token}"}
    first = await client.get("/api/v1/orders", headers=headers)
    assert first.status_code == 200
    exp = jwt.decode(token, options={"verify_signature": False})["exp"]
    leeway = settings.auth.leeway_seconds
    while time.time() < exp + 0.5:
        await asyncio.sleep(0.1)
    if time.time() < exp + leeway - 0.5:  # past exp, inside the clock-skew allowance: still served
        assert (await client.get("/api/v1/orders", headers=headers)).status_code == 200
    while time.time() < exp + leeway + 0.5:
        await asyncio.sleep(0.1)
    refused = await client.get("/api/v1/orders", headers=headers)
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"] == 'Bearer realm="flashsale", error="invalid_token"'


async def test_a_token_differing_only_in_its_signature_is_not_served_from_the_cache(client, settings):
    token = issue_token(settings.auth.jwt_secret, "cached-user")
    assert (await client.get("/api/v1/orders", headers={"Authorization": f"Bearer {token}"})).status_code == 200
    claims = jwt.decode(token, options={"verify_signature": False})
    forged = jwt.encode(claims, "another-secret-that-is-32-chars-long!", algorithm="HS256")
    tampered = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    for bad in (forged, tampered):
        assert (await client.get("/api/v1/orders", headers={"Authorization": f"Bearer {bad}"})).status_code == 401
