"""Statements on ``order_no_sequences``: the MySQL order-number minter's counters, one row per
shard reserved to it (``service.domain.order_numbers.mysql_minter``)."""

from __future__ import annotations

from sqlalchemy import text

LOCKED = text("SELECT second, sequence FROM order_no_sequences WHERE shard = :s FOR UPDATE")
"""Shard ``:s``'s last second and sequence, the row locked until the transaction ends."""

CREATE = text("INSERT IGNORE INTO order_no_sequences (shard, second, sequence) VALUES (:s, '00000000000000', 0)")
"""The shard's row when the migration did not write it (a shard added later)."""

ADVANCE = text("UPDATE order_no_sequences SET second = :second, sequence = :sequence WHERE shard = :s")
"""Record shard ``:s``'s last handed-out second and sequence."""
