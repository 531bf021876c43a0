"""Path and query parameter types shared by the controllers."""

from __future__ import annotations

from typing import Annotated

from litestar.params import PathParameter

ProductIdPath = Annotated[int, PathParameter(ge=1, le=2**63 - 1)]
"""A product id in a path: 1 to 2**63 - 1 (BIGINT)."""
