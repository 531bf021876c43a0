"""Statements on ``waiting_room_draws``: the record of each pre-queue's draw (docs/ARCHITECTURE.md,
"Waiting room")."""

from __future__ import annotations

from sqlalchemy import text

RECORD = text(
    "INSERT IGNORE INTO waiting_room_draws (product_id, opened_ms, seed, entrants, drawn_order)"
    " VALUES (:product_id, :opened_ms, :seed, :entrants, :drawn_order)"
)
"""Record a draw once (a second process recording the same opening changes nothing)."""

LATEST = text(
    "SELECT opened_ms, seed, drawn_order FROM waiting_room_draws WHERE product_id = :product_id"
    " ORDER BY opened_ms DESC LIMIT 1"
)
"""Product ``:product_id``'s newest draw."""
