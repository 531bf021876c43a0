"""The token verifier gives PyJWT's verdict on every token, and its fast path is the one taken for
the usual token (service/api/token_verifier.py; docs/BENCHMARKS.md, many buyers)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from typing import Any

import jwt
import pytest

from service.api import token_verifier
from service.api.token_verifier import TokenVerifier

SECRET = "a-test-secret-of-at-least-32-characters"
LEEWAY = 5.0
REQUIRED = ["exp", "sub"]
MAX_LENGTH = 4096
TIME_CLAIMS = ("exp", "nbf", "iat")
HEADER = {"alg": "HS256", "typ": "JWT"}


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
    return _sign(_b64(json.dumps(header, separators=(",", ":")).encode()), payload.decode(), secret)


def _sign(header: str, payload: str, secret: str = SECRET) -> str:
    """``header.payload`` (segments as given) signed with HS256."""
    signing_input = header + "." + payload
    key = jwt.algorithms.HMACAlgorithm(jwt.algorithms.HMACAlgorithm.SHA256)
    return signing_input + "." + _b64(key.sign(signing_input.encode(), secret.encode()))


def _pyjwt(token: str, audience: str | None = None, issuer: str | None = None) -> dict[str, Any] | None:
    options = {"require": REQUIRED, "verify_aud": bool(audience), "verify_iss": bool(issuer)}
    try:
        return jwt.decode(  # type: ignore[no-any-return]
            token, SECRET, algorithms=["HS256"], audience=audience, issuer=issuer, leeway=LEEWAY, options=options
        )
    except (jwt.InvalidTokenError, UnicodeEncodeError):  # PyJWT encodes the token first: a lone surrogate fails
        return None


def _expected(token: str, audience: str | None = None, issuer: str | None = None) -> dict[str, Any] | None:
    """PyJWT's verdict, but for what the verifier refuses on purpose: a token longer than its cap,
    a time claim outside 64-bit seconds (service/api/token_verifier.py)."""
    if len(token) > MAX_LENGTH:
        return None
    claims = _pyjwt(token, audience, issuer)
    if claims is not None and any(abs(int(claims[name])) >= 2**63 for name in TIME_CLAIMS if name in claims):
        return None
    return claims


def _ours(verifier: TokenVerifier, token: str) -> dict[str, Any] | None:
    try:
        return verifier.verify(token)
    except jwt.InvalidTokenError:
        return None


def _warm(audience: str | None = None, issuer: str | None = None) -> TokenVerifier:
    """A verifier whose fast path knows the usual header (one token of this issuer verified)."""
    verifier = TokenVerifier(
        SECRET, leeway=LEEWAY, required=REQUIRED, max_length=MAX_LENGTH, audience=audience, issuer=issuer
    )
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


def _signed(payload: bytes, header: dict[str, Any] | None = None) -> str:
    """A token of this secret over the raw JSON ``payload`` (what PyJWT's encoder would not write)."""
    return _raw_token(header or HEADER, _b64(payload).encode())


def _signed_claims(**raw: str) -> bytes:
    """A payload whose claims are given as raw JSON text (``exp="1e400"``), the usual ones otherwise."""
    now = _now()
    claims = {"sub": '"buyer-1"', "iat": str(now), "exp": str(now + 60), **raw}
    return ("{" + ",".join(f'"{name}":{value}' for name, value in claims.items()) + "}").encode()


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _of_length(length: int) -> str:
    """A valid token exactly ``length`` characters long (a filler claim)."""
    bare = len(_token({"pad": ""}))
    token = _token({"pad": "x" * ((length - bare) * 3 // 4)})
    while len(token) < length:
        token = _token({"pad": jwt.decode(token, options={"verify_signature": False})["pad"] + "x"})
    assert len(token) == length, len(token)
    return token


def _swap_segment(token: str, index: int, segment: str) -> str:
    parts = token.split(".")
    parts[index] = segment
    return ".".join(parts)


def _fill_to_the_cap(index: int, segment: Callable[[int], str]) -> str:
    """A usual token whose segment ``index`` is ``segment(room)``, room what fills the length cap."""
    token = _token()
    room = MAX_LENGTH - len(token) + len(token.split(".")[index])
    filled = _swap_segment(token, index, segment(room))
    assert MAX_LENGTH - 4 <= len(filled) <= MAX_LENGTH
    return filled


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
    "empty": lambda: "",
    "only dots": lambda: "..",
    "payload nested 1,000 deep": lambda: _signed(_signed_claims(x=_nested(1000))),
    "payload nested 100,000 deep": lambda: _signed(_signed_claims(x=_nested(100_000))),
    "header nested 1,000 deep": lambda: _swap_segment(_token(), 0, _b64(_nested(1000).encode())),
    "header nested 1,000 deep, signed": lambda: _sign(_b64(f'{{"alg":"HS256","x":{_nested(1000)}}}'.encode()), "e30"),
    "exp 10**400": lambda: _signed(_signed_claims(exp="1" + "0" * 400)),
    "exp 10**400 as a string": lambda: _signed(_signed_claims(exp='"1' + "0" * 400 + '"')),
    "exp 2**63": lambda: _signed(_signed_claims(exp=str(2**63))),
    "exp 2**63 - 1": lambda: _signed(_signed_claims(exp=str(2**63 - 1))),
    "exp 2**64": lambda: _signed(_signed_claims(exp=str(2**64))),
    "exp 1e400": lambda: _signed(_signed_claims(exp="1e400")),
    "exp Infinity": lambda: _signed(_signed_claims(exp="Infinity")),
    "exp NaN": lambda: _signed(_signed_claims(exp="NaN")),
    "exp 1e300": lambda: _signed(_signed_claims(exp="1e300")),
    "exp a fraction below the leeway": lambda: _token({"exp": _now() - LEEWAY - 0.5}),
    "iat Infinity": lambda: _signed(_signed_claims(iat="Infinity")),
    "iat -10**400": lambda: _signed(_signed_claims(iat="-1" + "0" * 400)),
    "nbf 10**400": lambda: _signed(_signed_claims(nbf="1" + "0" * 400)),
    "nbf -10**400": lambda: _signed(_signed_claims(nbf="-1" + "0" * 400)),
    "nbf -Infinity": lambda: _signed(_signed_claims(nbf="-Infinity")),
    "exp twice, the last expired": lambda: _signed(_signed_claims(exp=f'{_now() + 60},"exp":{_now() - 60}')),
    "sub twice": lambda: _signed(_signed_claims(sub='"buyer-1","sub":"admin"')),
    "payload with a BOM": lambda: _raw_token(HEADER, _b64(b"\xef\xbb\xbf" + _signed_claims()).encode()),
    "payload in UTF-16": lambda: _raw_token(HEADER, _b64(_signed_claims().decode().encode("utf-16")).encode()),
    "a signed JSON string": lambda: _signed(b'"buyer-1"'),
    "a signed null": lambda: _signed(b"null"),
    "b64 false": lambda: _raw_token({"alg": "HS256", "b64": False, "crit": ["b64"]}, b""),
    "alg none, signed with HS256": lambda: _raw_token({"alg": "none"}, _b64(_signed_claims()).encode()),
    "alg HS512, signed with HS256": lambda: _raw_token({"alg": "HS512"}, _b64(_signed_claims()).encode()),
    "header padded": lambda: _sign(_b64(b'{"alg":"HS256","kid":"k"}') + "==", _b64(_signed_claims())),
    "payload padded": lambda: _raw_token(HEADER, base64.urlsafe_b64encode(_signed_claims() + b" ")),
    "non-ASCII payload segment": lambda: _raw_token(HEADER, "é".encode()),
    "non-ASCII signature": lambda: _token()[:-1] + "é",
    "a lone surrogate": lambda: "\ud800" + _token()[1:],
    "signature of two extra characters": lambda: _token() + "AA",
    "a token at the length cap": lambda: _of_length(MAX_LENGTH),
    "a token one over the length cap": lambda: _of_length(MAX_LENGTH + 1),
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
    "empty",
    "only dots",
    "payload nested 1,000 deep",
    "payload nested 100,000 deep",
    "header nested 1,000 deep",
    "header nested 1,000 deep, signed",
    "exp 10**400",
    "exp 10**400 as a string",
    "exp 2**63",
    "exp 2**64",
    "exp 1e300",
    "exp 1e400",
    "exp Infinity",
    "exp NaN",
    "exp a fraction below the leeway",
    "iat Infinity",
    "iat -10**400",
    "nbf 10**400",
    "nbf -10**400",
    "nbf -Infinity",
    "exp twice, the last expired",
    "a signed JSON string",
    "a signed null",
    "b64 false",
    "alg none, signed with HS256",
    "alg HS512, signed with HS256",
    "non-ASCII payload segment",
    "non-ASCII signature",
    "a lone surrogate",
    "signature of two extra characters",
    "a token one over the length cap",
}
DIVERGENT = {
    "exp 10**400",
    "exp 10**400 as a string",
    "exp 2**63",
    "exp 2**64",
    "exp 1e300",
    "iat -10**400",
    "nbf -10**400",
}
"""Tokens PyJWT accepts that the verifier refuses on purpose: a time claim beyond 64-bit seconds."""


@pytest.mark.parametrize("case", CASES)
def test_every_verdict_is_pyjwts(case):
    token = CASES[case]()
    verifier = _warm()
    expected = _expected(token)
    assert (expected is None) == (case in REFUSED), expected  # the case is what its name says
    assert (_pyjwt(token) is None) == (case in REFUSED - DIVERGENT - {"a token one over the length cap"})
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
    verifier = TokenVerifier(SECRET, leeway=LEEWAY, required=REQUIRED, max_length=MAX_LENGTH)
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
    assert calls == []  # refused on its signature alone
    assert _ours(verifier, other) == other_verdict
    assert _ours(verifier, other) == other_verdict
    assert len(calls) == 2  # nothing admitted: every call went to PyJWT
    verifier.verify(_token())
    verifier.verify(_token({"sub": "buyer-2"}))
    assert len(calls) == 3  # the first usual token admitted its header


def _count_pyjwt_calls(monkeypatch) -> list[int]:
    calls: list[int] = []
    decode = jwt.decode
    monkeypatch.setattr(token_verifier.jwt, "decode", lambda *a, **k: calls.append(1) or decode(*a, **k))
    return calls


@pytest.mark.parametrize(
    "forge",
    [
        lambda: _token(secret="another-secret-that-is-32-chars-long!"),
        _tampered_signature,
        _tampered_payload,
        _unsigned,
        lambda: _token(alg="HS512"),
        lambda: _swap_segment(_token(), 0, _b64(_nested(1000).encode())),
        lambda: _fill_to_the_cap(0, lambda room: "!" * room),
        lambda: _fill_to_the_cap(1, lambda room: _b64(b"[" + b"0," * ((room * 3 // 4 - 3) // 2) + b"0]")),
    ],
    ids=["another secret", "tampered signature", "tampered payload", "alg none", "HS512", "deep header", "junk", "4KB"],
)
def test_a_forged_token_is_refused_before_any_json_is_read(monkeypatch, forge):
    """The signature is checked first, so a forger's header and payload cost nothing to parse:
    every forged token costs one HMAC over at most the length cap."""
    verifier = _warm()
    calls = _count_pyjwt_calls(monkeypatch)
    with pytest.raises(jwt.InvalidSignatureError):
        verifier.verify(forge())
    assert calls == []


def test_an_oversized_token_is_refused_before_anything_else(monkeypatch):
    verifier = _warm()
    monkeypatch.setattr(token_verifier.hmac, "compare_digest", None)  # any use of the signature raises TypeError
    calls = _count_pyjwt_calls(monkeypatch)
    with pytest.raises(jwt.DecodeError, match="longer than 4096"):
        verifier.verify(_of_length(MAX_LENGTH + 1))
    assert calls == []


PATHS = {
    "fast path": (_warm, lambda claims: _token(claims)),
    "PyJWT, first header": (
        lambda aud, iss: TokenVerifier(
            SECRET, leeway=LEEWAY, required=REQUIRED, max_length=MAX_LENGTH, audience=aud, issuer=iss
        ),
        lambda claims: _token(claims),
    ),
    "PyJWT, padded signature": (_warm, lambda claims: _token(claims) + "="),
    "PyJWT, header with more than alg, typ, kid": (_warm, lambda claims: _token(claims, cty="buyers")),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("claims", "accepted"),
    [
        ({"aud": "shop", "iss": "https://idp.example"}, True),
        ({"iss": "https://idp.example"}, False),
        ({"aud": "other", "iss": "https://idp.example"}, False),
        ({"aud": "shop"}, False),
        ({"aud": "shop", "iss": "https://evil.example"}, False),
    ],
    ids=["both", "no aud", "wrong aud", "no iss", "wrong iss"],
)
def test_every_decode_path_enforces_audience_and_issuer(monkeypatch, path, claims, accepted):
    make_verifier, make_token = PATHS[path]
    verifier = make_verifier("shop", "https://idp.example")
    calls = _count_pyjwt_calls(monkeypatch)
    token = make_token({**claims, "exp": _now() + 60})
    for _ in range(2):
        if accepted:
            assert verifier.verify(token)["aud"] == "shop"
        else:
            with pytest.raises(jwt.InvalidTokenError):
                verifier.verify(token)
    assert (calls == []) == (path == "fast path" and accepted)  # the path is the one named
