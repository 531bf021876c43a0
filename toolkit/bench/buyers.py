"""The stampede's buyers: many distinct tokens, each sent a few times (docs/BENCHMARKS.md, many buyers).

Every HTTP row and round of ``flashsale bench`` gets buyers of its own (:data:`BUYERS` tokens,
minted here, in process, with the run's secret), so no token reaches a server's verified-token
cache before its row; wrk's script sends each buyer's token :data:`REQUESTS_PER_BUYER` times in a
row (a buyer retrying), then moves to the next buyer. A 20,000-token pool is minted in well under
a second: the header segment is encoded once, each token is one JSON payload and one HMAC.
"""

from __future__ import annotations

import base64
import hmac
import time

import msgspec

BUYERS = 20_000
"""Distinct buyers (tokens) per row and round."""
REQUESTS_PER_BUYER = 3
"""Requests each buyer sends, one after another: the first meets a token new to the server."""
TOKEN_TTL_SECONDS = 3600
_HEADER = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').rstrip(b"=")


def _b64(raw: bytes) -> bytes:
    return base64.urlsafe_b64encode(raw).rstrip(b"=")


def mint_tokens(secret: str, prefix: str, count: int) -> list[str]:
    """``count`` HS256 JWTs of the buyers ``<prefix>-0`` ... ``<prefix>-<count-1>``, signed with
    ``secret`` and carrying the claims :func:`service.api.tokens.issue_token` gives a buyer
    (``sub``, ``iat``, ``exp`` an hour on)."""
    key = secret.encode()
    now = int(time.time())
    encode = msgspec.json.encode
    tokens = []
    exp = now + TOKEN_TTL_SECONDS
    for i in range(count):
        signing_input = _HEADER + b"." + _b64(encode({"sub": f"{prefix}-{i}", "exp": exp, "iat": now}))
        tokens.append((signing_input + b"." + _b64(hmac.digest(key, signing_input, "sha256"))).decode())
    return tokens


def buyers_reached(requests: int, pool: int) -> int:
    """Distinct buyers a load of ``requests`` requests reached in a pool of ``pool`` (each buyer
    sending :data:`REQUESTS_PER_BUYER`; the pool starts over when exhausted)."""
    return min(pool, -(-requests // REQUESTS_PER_BUYER))
