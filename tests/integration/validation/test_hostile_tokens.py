"""A hostile bearer token costs little and answers a 401 problem+json (``code: unauthorized``),
never a 500: one longer than the cap is refused unread, a forged one on its signature alone, and a
signed one PyJWT would choke on or take without a date is refused (service/api/token_verifier.py)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import statistics
import time
from typing import Any

import pytest
from granian.http import HTTP1Settings
from litestar import Litestar

from service.api.app import create_app
from service.api.tokens import issue_token
from tests.support import serving

ORDERS = "/api/v1/orders"
LARGEST_TOKEN = HTTP1Settings.max_buffer_size - 200
"""The largest token granian takes: its HTTP/1 buffer holds the whole request head."""


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _signed(secret: str, payload: bytes) -> str:
    """A token of ``secret`` over the raw JSON ``payload``, with the header PyJWT writes."""
    signing_input = _b64(b'{"alg":"HS256","typ":"JWT"}') + "." + _b64(payload)
    return signing_input + "." + _b64(hmac.new(secret.encode(), signing_input.encode(), hashlib.sha256).digest())


def _claims(**raw: str) -> bytes:
    now = int(time.time())
    claims = {"sub": '"buyer-1"', "iat": str(now), "exp": str(now + 60), **raw}
    return ("{" + ",".join(f'"{name}":{value}' for name, value in claims.items()) + "}").encode()


def _forged(length: int) -> str:
    """A token of another secret, ``length`` characters long (a filler claim)."""
    token = issue_token("another-secret-that-is-32-chars-long!", "buyer-1")
    header, payload, signature = token.split(".")
    return f"{header}.{payload}{'A' * (length - len(token))}.{signature}"


HOSTILE: dict[str, Any] = {
    "the largest token granian takes": lambda secret: _forged(LARGEST_TOKEN),
    "over the cap, signed": lambda secret: _signed(secret, _claims(pad='"' + "x" * 3000 + '"')),
    "payload nested 1,000 deep": lambda secret: _signed(secret, _claims(x="[" * 1000 + "]" * 1000)),
    "exp 10**400": lambda secret: _signed(secret, _claims(exp="1" + "0" * 400)),
    "exp 10**400 as a string": lambda secret: _signed(secret, _claims(exp='"1' + "0" * 400 + '"')),
    "exp Infinity": lambda secret: _signed(secret, _claims(exp="Infinity")),
    "exp 1e400": lambda secret: _signed(secret, _claims(exp="1e400")),
    "iat Infinity": lambda secret: _signed(secret, _claims(iat="Infinity")),
    "iat -10**400": lambda secret: _signed(secret, _claims(iat="-1" + "0" * 400)),
    "nbf 10**400": lambda secret: _signed(secret, _claims(nbf="1" + "0" * 400)),
    "nbf -10**400": lambda secret: _signed(secret, _claims(nbf="-1" + "0" * 400)),
}


@pytest.mark.parametrize("case", HOSTILE)
async def test_a_hostile_token_gets_a_401_problem(client, settings, token, case):
    assert (await client.get(ORDERS, headers=token("warm-up"))).status_code == 200  # the fast path knows the header
    hostile = HOSTILE[case](settings.auth.jwt_secret)
    assert case != "over the cap, signed" or len(hostile) > settings.auth.max_token_bytes
    for _ in range(2):  # the second time, after whatever the first one left behind
        response = await client.get(ORDERS, headers={"Authorization": f"Bearer {hostile}"})
        assert response.status_code == 401, response.text
        assert response.headers["content-type"].startswith("application/problem+json")
        assert response.json()["code"] == "unauthorized"
        assert response.headers["www-authenticate"] == 'Bearer realm="flashsale", error="invalid_token"'
        assert len(response.content) < 1000  # the token is not echoed


async def _request(app: Litestar, authorization: bytes) -> int:
    """One ``GET /api/v1/orders`` straight into the ASGI app (no client's work measured); its status."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": ORDERS,
        "raw_path": ORDERS.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"api"), (b"authorization", authorization)],
        "client": ("127.0.0.1", 40000),
        "server": ("api", 80),
        "state": {},
    }
    status: list[int] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    await app(scope, receive, send)  # type: ignore[arg-type]
    return status[0]


async def test_the_largest_token_costs_at_most_twice_a_normal_request(settings):
    """CPU of this thread (the app's event loop) per request, rounds interleaved so that the box's
    noise falls on every kind alike; a ratio of medians, no absolute figure."""
    app = create_app(settings)
    normal = issue_token("another-secret-that-is-32-chars-long!", "buyer-1")  # refused as cheaply as can be
    kinds = {
        "normal": normal,
        "largest": _forged(LARGEST_TOKEN),
        "at the cap": _forged(settings.auth.max_token_bytes),
    }
    headers = {kind: b"Bearer " + token.encode() for kind, token in kinds.items()}
    requests, rounds = 200, 9
    costs: dict[str, list[float]] = {kind: [] for kind in kinds}
    async with serving(app):
        for header in headers.values():
            assert await _request(app, header) == 401
        for _ in range(rounds):
            for kind, header in headers.items():
                started = time.thread_time()
                for _ in range(requests):
                    await _request(app, header)
                costs[kind].append((time.thread_time() - started) / requests)
    base = statistics.median(costs["normal"])
    ratios = {kind: statistics.median(costs[kind]) / base for kind in ("largest", "at the cap")}
    assert all(ratio <= 2.0 for ratio in ratios.values()), (ratios, costs)
