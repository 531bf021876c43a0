"""The token verifier gives PyJWT's verdict on every token, and its fast path is the one taken for
the usual token (service/api/token_verifier.py; docs/BENCHMARKS.md, many buyers)."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import jwt
import pytest

from service.api import token_verifier
from service.api.token_verifier import TokenVerifier

SECRET = "a-test-secret-of-at-least-32-characters"
LEEWAY = 5.0
REQUIRED = ["exp", "sub"]


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _token(claims: dict[str, Any] | None = None, *, secret: str = SECRET, alg: str = "HS256", **header: Any) -> str:
    now = int(time.time())
    payload = {"sub": "buyer-1", "iat": now, "exp": now + 60}
    payload.update(claims or {})
    payload = {k: v for k, v in payload.items() if v is not None}
    if not isinstance(payload.get("iss", ""), str):  # PyJWT would not sign it
        return _raw_token({"alg": "HS256", "typ": "JWT"}, _b64(json.dumps(payload).encode()).encode())
    return jwt.encode(payload, secret, algorithm=alg, headers=header or None)


def _raw_token(header: dict[str, Any], payload: bytes, secret: str = SECRET) -> str:
    """A token signed over whatever ``payload`` bytes are given (already base64url or not)."""
    signing_input = _b64(json.dumps(header, separators=(",", ":")).encode()) + "." + payload.decode()
    key = jwt.algorithms.HMACAlgorithm(jwt.algorithms.HMACAlgorithm.SHA256)
    return signing_input + "." + _b64(key.sign(signing_input.encode(), secret.encode()))


def _pyjwt(token: str, audience: str | None = None, issuer: str | None = None) -> dict[str, Any] | None:
    options = {"require": REQUIRED, "verify_aud": bool(audience), "verify_iss": bool(issuer)}
    try:
        return jwt.decode(  # type: ignore[no-any-return]
            token, SECRET, algorithms=["HS256"], audience=audience, issuer=issuer, leeway=LEEWAY, options=options
        )
    except jwt.InvalidTokenError:
        return None


def _ours(verifier: TokenVerifier, token: str) -> dict[str, Any] | None:
    try:
        return verifier.verify(token)
    except jwt.InvalidTokenError:
        return None


def _warm(audience: str | None = None, issuer: str | None = None) -> TokenVerifier:
    """A verifier whose fast path knows the usual header (one token of this issuer verified)."""
    verifier = TokenVerifier(SECRET, leeway=LEEWAY, required=REQUIRED, audience=audience, issuer=issuer)
    verifier.verify(_token({"aud": audience, "iss": issuer}))
    return verifier


def _now() -> int:
    """Now, when the case's token is made (a module-level time would drift out of the leeway)."""
    return int(time.time())


def _tampered_signature() -> str:
    token = _token()
    return token[:-2] + ("AA" if not token.endswith("AA") else "BB")


def _tampered_payload() -> str:
    header, _, signature = _token().split(".")
    forged = _b64(json.dumps({"sub": "admin", "role": "admin", "exp": int(time.time()) + 60}).encode())
    return f"{header}.{forged}.{signature}"


def _unsigned() -> str:
    claims = {"sub": "buyer-1", "exp": int(time.time()) + 60}
    header = _b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    return f"{header}.{_b64(json.dumps(claims).encode())}."


def _non_canonical_payload() -> str:
    payload = _b64(json.dumps({"sub": "buyer-1", "exp": int(time.time()) + 60}).encode())
    return _raw_token({"alg": "HS256", "typ": "JWT"}, (payload[:4] + "\n" + payload[4:]).encode())


def _padded_signature() -> str:
    token = _token()
    return token + "=" * (-len(token.rsplit(".", 1)[1]) % 4)


CASES: dict[str, Any] = {
    "valid": _token,
    "tampered signature": _tampered_signature,
    "tampered payload": _tampered_payload,
    "another secret": lambda: _token(secret="another-secret-that-is-32-chars-long!"),
    "alg none": _unsigned,
    "alg HS512": lambda: _token(alg="HS512"),
    "alg HS384": lambda: _token(alg="HS384"),
    "expired beyond the leeway": lambda: _token({"exp": _now() - 60}),
    "expired inside the leeway": lambda: _token({"exp": _now() - 2}),
    "nbf beyond the leeway": lambda: _token({"nbf": _now() + 60}),
    "nbf inside the leeway": lambda: _token({"nbf": _now() + 2}),
    "iat beyond the leeway": lambda: _token({"iat": _now() + 60}),
    "no exp": lambda: _token({"exp": None}),
    "no sub": lambda: _token({"sub": None}),
    "sub not a string": lambda: _token({"sub": 7}),
    "jti not a string": lambda: _token({"jti": 7}),
    "exp a float": lambda: _token({"exp": _now() + 60.5}),
    "exp a numeric string": lambda: _token({"exp": str(_now() + 60)}),
    "exp a word": lambda: _token({"exp": "soon"}),
    "exp true": lambda: _token({"exp": True}),
    "crit": lambda: _token(crit=["exp"]),
    "an aud nobody asked for": lambda: _token({"aud": "shop"}),
    "a kid": lambda: _token(kid="k1"),
    "a content type": lambda: _token(cty="buyers"),
    "padded signature": _padded_signature,
    "non-canonical payload": _non_canonical_payload,
    "not JSON": lambda: _raw_token({"alg": "HS256", "typ": "JWT"}, _b64(b"not json").encode()),
    "a JSON list": lambda: _raw_token({"alg": "HS256", "typ": "JWT"}, _b64(b"[1, 2]").encode()),
    "two segments": lambda: _token().rsplit(".", 1)[0],
    "four segments": lambda: _token() + ".AAAA",
    "garbage": lambda: "not-a-token",
}
REFUSED = {
    "tampered signature",
    "tampered payload",
    "another secret",
    "alg none",
    "alg HS512",
    "alg HS384",
    "expired beyond the leeway",
    "nbf beyond the leeway",
    "iat beyond the leeway",
    "no exp",
    "no sub",
    "sub not a string",
    "jti not a string",
    "exp a word",
    "exp true",
    "crit",
    "non-canonical payload",
    "not JSON",
    "a JSON list",
    "two segments",
    "four segments",
    "garbage",
}


@pytest.mark.parametrize("case", CASES)
def test_every_verdict_is_pyjwts(case):
    token = CASES[case]()
    verifier = _warm()
    expected = _pyjwt(token)
    assert (expected is None) == (case in REFUSED), expected  # the case is what its name says
    assert _ours(verifier, token) == expected
    assert _ours(verifier, token) == expected  # again, with whatever the first call remembered


@pytest.mark.parametrize(
    ("claims", "accepted"),
    [
        ({"aud": "shop", "iss": "https://idp.example"}, True),
        ({"aud": ["other", "shop"], "iss": "https://idp.example"}, True),
        ({"iss": "https://idp.example"}, False),
        ({"aud": "other", "iss": "https://idp.example"}, False),
        ({"aud": [], "iss": "https://idp.example"}, False),
        ({"aud": ["shop", 7], "iss": "https://idp.example"}, False),
        ({"aud": "shop"}, False),
        ({"aud": "shop", "iss": "https://evil.example"}, False),
        ({"aud": "shop", "iss": 7}, False),
    ],
    ids=["both", "aud list", "no aud", "wrong aud", "empty aud", "aud not strings", "no iss", "wrong iss", "iss int"],
)
def test_audience_and_issuer_verdicts_are_pyjwts(claims, accepted):
    verifier = _warm("shop", "https://idp.example")
    token = _token(claims)
    expected = _pyjwt(token, "shop", "https://idp.example")
    assert (expected is not None) == accepted
    assert _ours(verifier, token) == expected
    assert _ours(verifier, token) == expected


def test_a_usual_token_takes_the_fast_path(monkeypatch):
    verifier = _warm()

    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("jwt.decode called for a token of a known header")

    monkeypatch.setattr(token_verifier.jwt, "decode", refuse)
    for n in range(3):
        assert verifier.verify(_token({"sub": f"buyer-{n}"}))["sub"] == f"buyer-{n}"


def test_only_headers_pyjwt_accepted_reach_the_fast_path(monkeypatch):
    verifier = TokenVerifier(SECRET, leeway=LEEWAY, required=REQUIRED)
    other = _token(kid="k1", cty="buyers")  # a header with more than alg, typ and kid: PyJWT decides each time
    other_verdict = _pyjwt(other)
    assert other_verdict is not None
    calls = []
    decode = jwt.decode
    monkeypatch.setattr(token_verifier.jwt, "decode", lambda *a, **k: calls.append(1) or decode(*a, **k))
    forged = _token(secret="another-secret-that-is-32-chars-long!")
    for _ in range(2):
        with pytest.raises(jwt.InvalidSignatureError):
            verifier.verify(forged)
    assert _ours(verifier, other) == other_verdict
    assert _ours(verifier, other) == other_verdict
    assert len(calls) == 4  # nothing admitted: every call went to PyJWT
    verifier.verify(_token())
    verifier.verify(_token({"sub": "buyer-2"}))
    assert len(calls) == 5  # the first usual token admitted its header
