"""Payment notification signatures: HMAC-SHA256 over the raw body (pure functions, no server)."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from service.domain.payments.notification import SignatureInvalid, sign, verify

SECRETS = {"mockpay": "s" * 32}
BODY = b'{"order_no": "X", "amount": 1500}'


def test_sign_is_hex_hmac_sha256_of_the_body():
    assert sign("k", BODY) == hmac.new(b"k", BODY, hashlib.sha256).hexdigest()


def test_a_good_signature_verifies_in_either_case():
    verify(SECRETS, "mockpay", BODY, sign(SECRETS["mockpay"], BODY))
    verify(SECRETS, "mockpay", BODY, sign(SECRETS["mockpay"], BODY).upper())


@pytest.mark.parametrize(
    ("channel", "body", "signature"),
    [
        ("otherpay", BODY, sign("s" * 32, BODY)),  # no secret for that channel
        ("mockpay", BODY + b" ", sign("s" * 32, BODY)),  # body changed after signing
        ("mockpay", BODY, None),
        ("mockpay", BODY, ""),
        ("mockpay", BODY, "é" * 64),
    ],
    ids=["unknown-channel", "tampered-body", "missing", "empty", "non-ascii"],
)
def test_anything_else_is_refused(channel, body, signature):
    with pytest.raises(SignatureInvalid):
        verify(SECRETS, channel, body, signature)
