"""Property test: on random headers, claims, encodings and signatures the token verifier gives
PyJWT's verdict and PyJWT's claims (service/api/token_verifier.py), but for its two refusals of
its own (a token over the length cap, a time claim outside 64-bit seconds).

``FLASHSALE_FUZZ_EXAMPLES`` sets the examples per test (default 1,000; a long run: 30000, with
``--timeout=0``: docs/TESTING.md).
"""

from __future__ import annotations

import base64
import json
import math
import os
import time
from dataclasses import dataclass
from typing import Any

import jwt
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.api.token_verifier import TokenVerifier
from tests.unit.test_token_verifier import LEEWAY, MAX_LENGTH, REQUIRED, SECRET, _b64, _expected, _sign, _token

AUDIENCE, ISSUER = "shop", "https://idp.example"
FUZZ = settings(
    max_examples=int(os.environ.get("FLASHSALE_FUZZ_EXAMPLES", "1000")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclass(frozen=True)
class FromNow:
    """A time claim ``offset`` seconds from the second the token is made in (a numeric string
    when ``as_text``)."""

    offset: float
    as_text: bool = False

    def at(self, now: float) -> int | float | str:
        value = int(now) + self.offset
        return str(value) if self.as_text else value


def _away_from(edge: float) -> Any:
    """Offsets from now at least 2 s from ``edge``, where the verdict flips (PyJWT reads the clock a
    moment after the token is made; a second may tick in between)."""
    near = st.sampled_from([-86_400, -3600, -60, 0, 60, 3600, 86_400])
    wide = st.integers(-(10**9), 10**9) | st.floats(-(10**9), 10**9, allow_nan=False)
    return (near | wide).filter(lambda offset: abs(offset - edge) > 2)


NESTED = "\x00nested\x00"
"""A string claim ``NESTED * depth`` stands for lists nested ``depth`` deep (json.dumps would recurse)."""


def _payload_json(payload: dict[str, Any]) -> bytes:
    text = json.dumps(payload, separators=(",", ":"))
    for value in payload.values():
        if isinstance(value, str) and value.startswith(NESTED):
            depth = len(value) // len(NESTED)
            text = text.replace(json.dumps(value), "[" * depth + "]" * depth)
    return text.encode()


def _times(edge: float) -> Any:
    """What a time claim may hold: a time near now as an integer, a fraction or a numeric string;
    values beyond any date; and what is no time at all."""
    odd = st.sampled_from(
        [2**63 - 1, 2**63, -(2**63), 2**64, 10**400, -(10**400), 1e300, math.inf, -math.inf, math.nan, True, None]
    )
    return st.one_of(
        _away_from(edge).map(lambda offset: FromNow(int(offset))),
        _away_from(edge).map(lambda offset: FromNow(int(offset) + 0.5)),
        _away_from(edge).map(lambda offset: FromNow(int(offset), as_text=True)),
        odd,
        st.text(max_size=5),
    )


_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
_names = st.sampled_from([AUDIENCE, ISSUER, "other", "https://evil.example"]) | st.text(max_size=6)

USUAL_HEADER = {"alg": "HS256", "typ": "JWT"}
"""The header the warm verifier knows: its fast path."""
HEADERS = st.one_of(
    st.just(USUAL_HEADER),
    st.fixed_dictionaries({"alg": st.just("HS256")}, optional={"typ": st.just("JWT"), "kid": st.text(max_size=4)}),
    st.fixed_dictionaries(
        {"alg": st.sampled_from(["HS256", "HS384", "HS512", "none", "RS256", "hs256", ""]) | st.text(max_size=6)},
        optional={"typ": _json, "kid": _json, "cty": _json, "crit": _json, "b64": st.booleans(), "x5u": _json},
    ),
    _json,  # not an object at all
)
PLAUSIBLE_CLAIMS = st.fixed_dictionaries(
    {
        "sub": st.sampled_from(["buyer-1", "ops"]) | st.text(max_size=8),
        "exp": st.integers(-int(LEEWAY) + 2, 10**6).map(FromNow),
    },
    optional={
        "nbf": st.integers(-(10**6), int(LEEWAY) - 2).map(FromNow),
        "iat": st.integers(-(10**6), int(LEEWAY) - 2).map(FromNow),
        "aud": _names | st.lists(_names, max_size=3),
        "iss": _names,
        "jti": st.text(max_size=6),
        "role": st.sampled_from(["admin", "buyer"]),
    },
)
ODD_CLAIMS = st.fixed_dictionaries(
    {},
    optional={
        "sub": st.just("buyer-1") | _json,
        "exp": _times(edge=-LEEWAY),
        "nbf": _times(edge=LEEWAY),
        "iat": _times(edge=LEEWAY),
        "aud": _names | st.lists(_names, max_size=3) | _json,
        "iss": _names | _json,
        "jti": st.text(max_size=6) | _json,
        "role": st.just("admin") | _json,
        "x": _json | st.integers(500, 3000).map(lambda depth: NESTED * depth),
    },
).map(lambda claims: {"sub": "buyer-1", "exp": FromNow(60), **claims})
SEGMENTS = st.sampled_from(["canonical"] * 5 + ["padded", "non-canonical", "junk"])
SIGNATURES = st.sampled_from(["right", "another secret", "flipped", "padded", "empty", "junk", "truncated"])
PLAUSIBLE = st.tuples(st.sampled_from([USUAL_HEADER, {"alg": "HS256"}]), PLAUSIBLE_CLAIMS, *[st.just("canonical")] * 2)
"""(header, claims, how the header and the payload are encoded) of a token most likely accepted."""
ANY = st.tuples(HEADERS, PLAUSIBLE_CLAIMS | ODD_CLAIMS, SEGMENTS, SEGMENTS)


def _segment(raw: bytes, how: str) -> str:
    encoded = _b64(raw)
    if how == "padded":
        return base64.urlsafe_b64encode(raw).decode()
    if how == "non-canonical" and encoded and len(encoded) % 4 in (2, 3):
        return encoded[:-1] + chr(ord(encoded[-1]) ^ 1)  # same bytes to a lenient decoder, other bits
    if how == "junk":
        return encoded + "!"
    return encoded


def _with_signature(header: str, payload: str, how: str) -> str:
    signature = _sign(header, payload).rpartition(".")[2]
    forged = {
        "right": signature,
        "another secret": _sign(header, payload, "another-secret-that-is-32-chars-long!").rpartition(".")[2],
        "flipped": signature[:-1] + ("A" if signature[-1:] != "A" else "B"),
        "padded": signature + "=",
        "empty": "",
        "junk": "!" + signature[1:],
        "truncated": signature[:-4],
    }[how]
    return f"{header}.{payload}.{forged}"


def _same(ours: dict[str, Any] | None, theirs: dict[str, Any] | None) -> bool:
    """Equal verdicts and claims (NaN equal to NaN, an int never equal to a float)."""
    return json.dumps(ours, sort_keys=True, default=repr) == json.dumps(theirs, sort_keys=True, default=repr)


def _verdicts(token: str, verifier: TokenVerifier, audience: str | None, issuer: str | None) -> None:
    expected = _expected(token, audience, issuer)
    for _ in range(2):  # again, with whatever the first call remembered
        try:
            ours: dict[str, Any] | None = verifier.verify(token)
        except jwt.InvalidTokenError:
            ours = None
        assert _same(ours, expected), (token, ours, expected)


def _warm(configured: bool) -> tuple[TokenVerifier, str | None, str | None]:
    audience, issuer = (AUDIENCE, ISSUER) if configured else (None, None)
    verifier = TokenVerifier(
        SECRET, leeway=LEEWAY, required=REQUIRED, max_length=MAX_LENGTH, audience=audience, issuer=issuer
    )
    verifier.verify(_token({"aud": audience, "iss": issuer}))  # the usual header takes the fast path
    return verifier, audience, issuer


@FUZZ
@given(token=PLAUSIBLE | ANY, signature=st.just("right") | SIGNATURES, configured=st.booleans())
def test_the_verdict_on_a_random_token_is_pyjwts(token, signature, configured):
    header, claims, header_as, payload_as = token
    now = time.time()
    payload = {name: value.at(now) if isinstance(value, FromNow) else value for name, value in claims.items()}
    header_segment = _segment(json.dumps(header, separators=(",", ":")).encode(), header_as)
    payload_segment = _segment(_payload_json(payload), payload_as)
    token = _with_signature(header_segment, payload_segment, signature)
    _verdicts(token, *_warm(configured))


@FUZZ
@given(
    position=st.integers(min_value=0),
    character=st.sampled_from("AZaz09-_.=+/! é\x00") | st.characters(),
    configured=st.booleans(),
)
def test_a_usual_token_with_one_character_changed_gets_pyjwts_verdict(position, character, configured):
    verifier, audience, issuer = _warm(configured)
    token = _token({"aud": audience, "iss": issuer, "role": "admin"})
    position %= len(token) + 1
    _verdicts(token[:position] + character + token[position + 1 :], verifier, audience, issuer)


@FUZZ
@given(text=st.text(max_size=300) | st.from_regex(r"[\w=-]{0,60}(\.[\w=-]{0,60}){0,4}", fullmatch=True))
def test_any_text_gets_pyjwts_verdict(text):
    _verdicts(text, *_warm(False))
