"""Request ids and idempotency keys (pure functions, no server)."""

from __future__ import annotations

import re

import pytest

from service.domain.errors import DomainError
from service.domain.purchase.request_id import (
    identify,
    is_valid_idempotency_key,
    mint_request_id,
    reissued_request_id,
    request_id_for,
    request_id_from_key,
)

HEX32 = re.compile(r"[0-9a-f]{32}")


def test_minted_ids_are_32_hex_unique_and_time_ordered():
    ids = [mint_request_id() for _ in range(1000)]
    assert all(HEX32.fullmatch(i) for i in ids)
    assert len(set(ids)) == 1000
    prefixes = [i[:12] for i in ids]  # 48-bit milliseconds first
    assert prefixes == sorted(prefixes)


def test_a_key_is_scoped_to_its_user_and_product():
    same = request_id_from_key("ann", 42, "k-1")
    assert HEX32.fullmatch(same) and same == request_id_from_key("ann", 42, "k-1")
    assert (
        len(
            {
                same,
                request_id_from_key("bob", 42, "k-1"),
                request_id_from_key("ann", 43, "k-1"),
                request_id_from_key("ann", 42, "k-2"),
            }
        )
        == 4
    )


def test_a_reissued_id_is_32_hex_and_differs_per_order_number():
    original = mint_request_id()
    first, second = reissued_request_id(original, "A"), reissued_request_id(original, "B")
    assert HEX32.fullmatch(first) and first != second != original


@pytest.mark.parametrize(
    ("key", "valid"),
    [
        ("k", True),
        ("k" * 64, True),
        ("!~", True),
        ("", False),
        ("k" * 65, False),
        ("a b", False),
        ("é", False),
        ("k\n", False),
    ],
)
def test_idempotency_keys_are_1_to_64_visible_ascii(key, valid):
    assert is_valid_idempotency_key(key) is valid


def test_identify_names_the_request_id_its_headers_carry() -> None:
    """An Order-Token wins over an Idempotency-Key; without an Idempotency-Key an
    Admission-Token is the key; with no key at all the server mints one (None here)."""
    keyed = identify("u", 7, "K-1", None, None)
    assert keyed == request_id_for("u", 7, "K-1")
    assert identify("u", 7, "K-1", "tok", "adm") == request_id_from_key("u", 7, "order-token:tok")
    assert identify("u", 7, None, None, "adm") == request_id_from_key("u", 7, "admission:adm")
    assert identify("u", 7, "K-1", None, "adm") == keyed
    assert identify("u", 7, None, None, None) is None


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ((None, None, "bad admission"), "admission_required"),
        ((None, "bad token", None), "token_invalid"),
        (("bad key", None, None), "invalid_idempotency_key"),
    ],
)
def test_identify_refuses_headers_that_cannot_be_keys(headers: tuple[str | None, ...], code: str) -> None:
    with pytest.raises(DomainError) as refused:
        identify("u", 7, *headers)
    assert refused.value.code == code
