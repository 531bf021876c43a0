"""Statements on ``order_no_generations``: the generation of each order-number shard (00-99),
kept in MySQL because it must survive whatever Redis forgets."""

from __future__ import annotations

from sqlalchemy import text

GENERATION = text("SELECT generation FROM order_no_generations WHERE shard = :s")
"""Shard ``:s``'s current generation (a row per shard exists from the migration on)."""

BUMP = text(
    "UPDATE order_no_generations SET generation = generation + 1, changed_at = CURRENT_TIMESTAMP"
    " WHERE shard = :s AND generation = :g"
)
"""Shard ``:s`` moves from generation ``:g`` to ``:g + 1``; matches no row when another minter
moved it first (exactly one minter wins each step)."""
