"""The order number's format: 26 characters = prefix (2 letters) + UTC ``yyyyMMddHHmmss`` (14)
+ shard (2 digits) + sequence (6 digits) + check (2 digits).

The check digits are ISO 7064 MOD 97-10 over the first 24 characters with letters counted
A=10 ... Z=35 as in IBAN (ISO 13616), so an order number is valid when
``int(digits(all 26)) % 97 == 1``. Order numbers handed to clients are validated here wherever
they come back in (docs/ARCHITECTURE.md, "Order numbers").
"""

from __future__ import annotations

import re

from service.domain.errors import InvalidInput

ORDER_NO_LENGTH = 26
SEQUENCE_MAX = 999_999
COUNTER_MAX = 99_999
"""Order numbers one shard mints in one second (the sequence's last five digits)."""
SHARDS = 100
REDIS_SHARDS = 90
"""Shards 00-89 are leased in Redis; 90-99 belong to :mod:`service.domain.order_numbers.mysql_minter`."""
_ORDER_NO = re.compile(r"[A-Z]{2}[0-9]{24}")


_IBAN_LETTERS = str.maketrans({chr(ord("A") + i): str(10 + i) for i in range(26)})


def _digits(text: str) -> str:
    """Letters to numbers as in IBAN (A=10 ... Z=35); digits stay (``text`` is ``[A-Z0-9]*``)."""
    return text.translate(_IBAN_LETTERS)


def check_digits(body: str) -> str:
    """ISO 7064 MOD 97-10 check digits (2 characters) for ``body`` (the first 24 characters)."""
    return f"{98 - int(_digits(body + '00')) % 97:02d}"


def is_valid_order_no(value: str) -> bool:
    """True when ``value`` has the length, charset and check digits of an order number."""
    return bool(_ORDER_NO.fullmatch(value)) and int(_digits(value)) % 97 == 1


def compose_order_no(prefix: str, second: str, shard: int, sequence: int) -> str:
    """Build an order number from its parts (``second`` is UTC ``yyyyMMddHHmmss``).

    Raises:
        ValueError: a part is out of range.
    """
    if not re.fullmatch(r"[A-Z]{2}", prefix) or not re.fullmatch(r"[0-9]{14}", second):
        raise ValueError("prefix must be 2 capital letters and second 14 digits")
    if not 0 <= shard < SHARDS or not 0 <= sequence <= SEQUENCE_MAX:
        raise ValueError("shard or sequence out of range")
    return compose_in_range(prefix, second, shard, sequence)


def compose_in_range(prefix: str, second: str, shard: int, sequence: int) -> str:
    """:func:`compose_order_no` for parts already known to be in range (the minter's block)."""
    body = f"{prefix}{second}{shard:02d}{sequence:06d}"
    return body + check_digits(body)


def require_valid_order_no(order_no: str) -> None:
    """Order numbers coming back in are validated before any look-up (length, charset, ISO 7064
    MOD 97-10 check digits).

    Raises:
        InvalidInput: ``invalid_order_no`` naming the field ``order_no``.
    """
    if not is_valid_order_no(order_no):
        raise InvalidInput("order_no", "not a valid order number (length, charset or check digits)", "invalid_order_no")
