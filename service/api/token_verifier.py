"""Verifying the API's bearer tokens (HS256 JWTs): PyJWT's verdict, at a fraction of its cost per token.

A stampede brings thousands of buyers, each token new to the process (docs/BENCHMARKS.md, many
buyers). ``jwt.decode`` spends most of its time per call on work this service does not need
again and again: it prepares the key (the secret is checked for PEM, SSH, DER and JWK shapes on
every call), checks each base64url character of every segment in a Python generator, parses the
header, merges the options and validates claims in their general form.

What a token costs before it is known to be signed by this secret is bounded, since anyone can
send one:

- a token longer than ``max_length`` characters is refused before anything reads it;
- then its signature segment must be the base64url of HMAC-SHA256 over everything before its last
  dot (stdlib :mod:`hmac`, keyed once with the key PyJWT prepares, a copy per token; compared by
  :func:`hmac.compare_digest`), padding aside: PyJWT accepts no other token, so any other is
  refused without its header or payload being decoded or parsed.

:class:`TokenVerifier` then accepts a token on a fast path only when every check PyJWT would make
is certain to pass:

- its header segment is byte for byte one that PyJWT already accepted in this process (so its
  ``alg`` is the pinned HS256, ``none`` and every other algorithm never get here) and carries
  nothing but ``alg``, ``typ`` and ``kid``;
- its signature segment is unpadded;
- its payload segment is canonical base64url of a JSON object whose ``exp`` (and ``iat``,
  ``nbf`` when present) are integers inside the leeway, whose required claims are present, whose
  ``sub`` and ``jti`` (when present) are strings, and whose ``aud`` / ``iss`` match when an
  audience / issuer is configured.

Everything else (a first header, padding, times that are not integers, a payload nested deeper
than msgspec goes, any refusal) goes to ``jwt.decode`` with the same parameters, which gives the
verdict and words the 401's detail.

Two refusals are this module's own, where PyJWT would accept: the length cap, and a time claim
(``exp``, ``nbf``, ``iat``) outside 64-bit seconds (``MAX_TIME``): ``exp: 10**400`` names no
date, and its expiry could not be held as a float (:mod:`service.api.auth` caches until it).
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
MAX_TIME = 2**63
"""A time claim must lie strictly between ``-MAX_TIME`` and ``MAX_TIME`` seconds (64-bit)."""
_TIME_CLAIMS = ("exp", "nbf", "iat")
_PLAIN_HEADER_KEYS = frozenset({"alg", "typ", "kid"})
_decode_json = msgspec.json.Decoder(dict[str, Any]).decode


class TokenVerifier:
    """Verifies HS256 tokens of ``secret`` under ``leeway`` seconds of clock skew, requiring
    ``required`` claims, an ``aud`` matching ``audience`` and an ``iss`` matching ``issuer`` when
    those are given (as ``jwt.decode`` with ``algorithms=["HS256"]`` does), refusing tokens longer
    than ``max_length`` characters."""

    def __init__(
        self,
        secret: str,
        *,
        leeway: float,
        required: Sequence[str],
        max_length: int,
        audience: str | Sequence[str] | None = None,
        issuer: str | Sequence[str] | None = None,
    ) -> None:
        self._secret = secret
        self.max_length = max_length
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
                algorithm, a claim missing or not matching), or it is longer than ``max_length``,
                or a time claim is outside 64-bit seconds.
        """
        self.refuse_oversized(len(token))
        signing_input, signature = self._signed_part(token)
        claims = self._fast(signing_input, signature)
        if claims is None:
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
        for name in _TIME_CLAIMS:
            value = claims.get(name)
            if value is not None and not -MAX_TIME < int(value) < MAX_TIME:  # int(): PyJWT's reading
                raise jwt.DecodeError(f"The {name} claim is out of range")
        return claims

    def refuse_oversized(self, length: int) -> None:
        """Refuse a token of ``length`` characters, before anything reads it.

        Raises:
            jwt.DecodeError: it is longer than ``max_length``.
        """
        if length > self.max_length:
            raise jwt.DecodeError(f"Token is longer than {self.max_length} characters")

    def _signed_part(self, token: str) -> tuple[str, str]:
        """``token``'s signing input and signature segment, once the signature is this secret's.

        Raises:
            jwt.DecodeError: no dot, or not text PyJWT could encode.
            jwt.InvalidSignatureError: the signature segment, its padding aside, is not the
                base64url of the HMAC over the signing input (PyJWT refuses such a token too).
        """
        signing_input, dot, signature = token.rpartition(".")
        if not dot:
            raise jwt.DecodeError("Not enough segments")
        keyed = self._mac.copy()
        try:
            keyed.update(signing_input.encode())  # UTF-8, as PyJWT signs it
        except UnicodeEncodeError as exc:
            raise jwt.DecodeError("Invalid token type") from exc
        mac = base64.urlsafe_b64encode(keyed.digest()).rstrip(b"=")
        if not hmac.compare_digest(mac, signature.rstrip("=").encode("ascii", "replace")):
            raise jwt.InvalidSignatureError("Signature verification failed")
        return signing_input, signature

    def _remember_header(self, token: str) -> None:
        """Admit the header segment of ``token``, which PyJWT just accepted, to the fast path."""
        segment = token.partition(".")[0]
        if segment in self._headers or len(self._headers) >= MAX_HEADERS:
            return
        if jwt.get_unverified_header(token).keys() <= _PLAIN_HEADER_KEYS:
            self._headers.add(segment)

    def _fast(self, signing_input: str, signature: str) -> dict[str, Any] | None:
        """The claims of a token whose signature matched, when every other check passes on the
        fast path; None when PyJWT must decide."""
        header, _, payload = signing_input.partition(".")
        if header not in self._headers or "." in payload or signature.endswith("="):
            return None
        try:
            padded = payload.encode("ascii") + b"=" * (-len(payload) % 4)
            raw = base64.urlsafe_b64decode(padded)
        except (UnicodeEncodeError, ValueError):
            return None
        if base64.urlsafe_b64encode(raw) != padded:  # not canonical base64url: PyJWT refuses it
            return None
        try:
            claims = _decode_json(raw)
        except (msgspec.DecodeError, RecursionError):  # PyJWT words the refusal
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
