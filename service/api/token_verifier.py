"""Verifying the API's bearer tokens (HS256 JWTs): PyJWT's verdict, at a fraction of its cost per token.

A stampede brings thousands of buyers, each token new to the process (docs/BENCHMARKS.md, many
buyers). ``jwt.decode`` spends most of its time per call on work this service does not need
again and again: it prepares the key (the secret is checked for PEM, SSH, DER and JWK shapes on
every call), checks each base64url character of every segment in a Python generator, parses the
header, merges the options and validates claims in their general form.

:class:`TokenVerifier` accepts a token on a fast path only when every check PyJWT would make is
certain to pass:

- its header segment is byte for byte one that PyJWT already accepted in this process (so its
  ``alg`` is the pinned HS256, ``none`` and every other algorithm never get here) and carries
  nothing but ``alg``, ``typ`` and ``kid``;
- its signature segment is exactly the base64url (unpadded) of HMAC-SHA256 over the signing
  input (stdlib :mod:`hmac`, keyed once with the key PyJWT prepares, a copy per token; compared
  by :func:`hmac.compare_digest`);
- its payload segment is canonical base64url of a JSON object whose ``exp`` (and ``iat``,
  ``nbf`` when present) are integers inside the leeway, whose required claims are present, whose
  ``sub`` and ``jti`` (when present) are strings, and whose ``aud`` / ``iss`` match when an
  audience / issuer is configured.

Everything else (a first header, padding, times that are not integers, any refusal) goes to
``jwt.decode`` with the same parameters, which gives the verdict and words the 401's detail.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Sequence
from typing import Any

import jwt
import msgspec

ALGORITHM = "HS256"
MAX_HEADERS = 8
"""Distinct header segments remembered as accepted (one per issuer shape; further ones take the slow path)."""
_PLAIN_HEADER_KEYS = frozenset({"alg", "typ", "kid"})
_decode_json = msgspec.json.Decoder(dict[str, Any]).decode


class TokenVerifier:
    """Verifies HS256 tokens of ``secret`` under ``leeway`` seconds of clock skew, requiring
    ``required`` claims, an ``aud`` matching ``audience`` and an ``iss`` matching ``issuer`` when
    those are given (as ``jwt.decode`` with ``algorithms=["HS256"]`` does)."""

    def __init__(
        self,
        secret: str,
        *,
        leeway: float,
        required: Sequence[str],
        audience: str | Sequence[str] | None = None,
        issuer: str | Sequence[str] | None = None,
    ) -> None:
        self._secret = secret
        key = jwt.algorithms.HMACAlgorithm(jwt.algorithms.HMACAlgorithm.SHA256).prepare_key(secret)
        self._mac = hmac.new(key, digestmod=hashlib.sha256)  # keyed once; each token hashes a copy
        self._leeway = leeway
        self._required = tuple(required)
        self._audience = [audience] if isinstance(audience, str) else (list(audience) if audience else None)
        self._issuer = [issuer] if isinstance(issuer, str) else (list(issuer) if issuer else None)
        self._options = {"require": list(required), "verify_aud": bool(audience), "verify_iss": bool(issuer)}
        self._headers: set[str] = set()

    def verify(self, token: str) -> dict[str, Any]:
        """The token's claims.

        Raises:
            jwt.InvalidTokenError: PyJWT refused it (forged, tampered, expired, malformed, wrong
                algorithm, a claim missing or not matching).
        """
        claims = self._fast(token)
        if claims is not None:
            return claims
        claims = jwt.decode(
            token,
            self._secret,
            algorithms=[ALGORITHM],
            audience=self._audience,
            issuer=self._issuer,
            leeway=self._leeway,
            options=self._options,  # type: ignore[arg-type]  # PyJWT's Options TypedDict, partially given
        )
        self._remember_header(token)
        return claims

    def _remember_header(self, token: str) -> None:
        """Admit the header segment of ``token``, which PyJWT just accepted, to the fast path."""
        segment = token.partition(".")[0]
        if segment in self._headers or len(self._headers) >= MAX_HEADERS:
            return
        if jwt.get_unverified_header(token).keys() <= _PLAIN_HEADER_KEYS:
            self._headers.add(segment)

    def _fast(self, token: str) -> dict[str, Any] | None:
        """The claims when every check passes on the fast path; None when PyJWT must decide."""
        header, dot, rest = token.partition(".")
        if header not in self._headers:
            return None
        payload, dot, signature = rest.partition(".")
        if not dot or "." in signature:
            return None
        try:
            signing_input = token[: len(header) + 1 + len(payload)].encode("ascii")
            padded = payload.encode("ascii") + b"=" * (-len(payload) % 4)
            raw = base64.urlsafe_b64decode(padded)
        except (UnicodeEncodeError, ValueError):
            return None
        keyed = self._mac.copy()
        keyed.update(signing_input)
        mac = base64.urlsafe_b64encode(keyed.digest()).rstrip(b"=")
        if not hmac.compare_digest(mac, signature.encode("ascii", "replace")):
            return None
        if base64.urlsafe_b64encode(raw) != padded:  # not canonical base64url: PyJWT refuses it
            return None
        try:
            claims = _decode_json(raw)
        except msgspec.DecodeError:
            return None
        return claims if self._claims_pass(claims) else None

    def _claims_pass(self, claims: dict[str, Any]) -> bool:
        now = time.time()
        for name in self._required:
            if claims.get(name) is None:
                return False
        exp, iat, nbf = claims.get("exp"), claims.get("iat", 0), claims.get("nbf", 0)
        if type(exp) is not int or type(iat) is not int or type(nbf) is not int:
            return False  # absent, or a float or string PyJWT coerces: its call
        if exp <= now - self._leeway or iat > now + self._leeway or nbf > now + self._leeway:
            return False
        if not isinstance(claims.get("sub", ""), str) or not isinstance(claims.get("jti", ""), str):
            return False
        if self._audience is not None:
            aud = claims.get("aud")
            auds = [aud] if isinstance(aud, str) else aud
            if not isinstance(auds, list) or not all(isinstance(a, str) for a in auds):
                return False
            if not any(a in auds for a in self._audience):
                return False
        if self._issuer is not None:
            iss = claims.get("iss")
            if not isinstance(iss, str) or iss not in self._issuer:
                return False
        return True
