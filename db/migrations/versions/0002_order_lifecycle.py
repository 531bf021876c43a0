"""Order lifecycle: payments.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_NOW = sa.text("CURRENT_TIMESTAMP")
_NOW_ON_UPDATE = sa.text("CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP")


def upgrade() -> None:
    op.create_table(
        "payments",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("order_no", sa.String(26), nullable=False),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("channel_txn_id", sa.String(64), nullable=False),
        sa.Column("event", sa.String(16), nullable=False),
        sa.Column("amount", sa.BigInteger, nullable=False),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("flagged", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("raw", sa.JSON, nullable=False),
        sa.Column("idem_key", sa.String(64), nullable=True),
        sa.Column("created_at", sa.DateTime, nullable=False, server_default=_NOW),
        sa.Column("updated_at", sa.DateTime, nullable=False, server_default=_NOW_ON_UPDATE),
        sa.UniqueConstraint("idem_key", name="uq_payments_idem_key"),
        sa.UniqueConstraint("channel", "channel_txn_id", name="uq_payments_channel_txn"),
        mysql_engine="InnoDB",
    )
    op.create_index("ix_payments_order_no", "payments", ["order_no"])


def downgrade() -> None:
    op.drop_table("payments")
