"""Waiting room: ``products.waiting_room`` and the record of each pre-queue draw.

``products.waiting_room``: a purchase needs an admission from the product's waiting room
(docs/ARCHITECTURE.md, "Waiting room"); off for existing products.
``waiting_room_draws``: one row per draw of a product's pre-queue at the opening of its sale: the
seed the order derives from, how many took part, and the drawn order itself (user ids,
newline-separated), so the draw can be audited and reproduced after Redis forgot it.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("products", sa.Column("waiting_room", sa.Boolean, nullable=False, server_default=sa.false()))
    op.create_table(
        "waiting_room_draws",
        sa.Column("product_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("opened_ms", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("seed", sa.String(64), nullable=False),
        sa.Column("entrants", sa.Integer, nullable=False),
        sa.Column("drawn_order", mysql.LONGTEXT(), nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False, server_default=sa.func.current_timestamp()),
    )


def downgrade() -> None:
    op.drop_table("waiting_room_draws")
    op.drop_column("products", "waiting_room")
