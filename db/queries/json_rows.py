"""The ``:rows`` parameter of the multi-row statements (``JSON_TABLE`` over a JSON array of rows).

The JSON goes to MySQL hex-encoded and is decoded there (:data:`ROWS`). JSON text is full of
double quotes, and the driver escapes a string parameter that holds any character MySQL's
literals escape character by character (asyncmy: ``str.translate``, about 0.3 ms of the
consumer's CPU for the 8.6 KB of a batch of 100 orders, a tenth of its whole transaction);
a hex string holds none of them, so the driver sends it as it is (docs/BENCHMARKS.md, "The
consumer drain").
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

ROWS = "CONVERT(UNHEX(:rows) USING utf8mb4)"
"""The JSON text of ``:rows`` (:func:`json_rows`), as the first argument of ``JSON_TABLE``."""

_encode = msgspec.json.Encoder().encode


def json_rows(rows: Sequence[Sequence[object]]) -> str:
    """``rows`` (each a list of column values) as the ``:rows`` parameter of a statement that
    reads it through :data:`ROWS`."""
    return _encode(rows).hex()
