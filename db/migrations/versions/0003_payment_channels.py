"""Payments against a channel: payment attempts per order and channel, refund requests.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_NOW = sa.text("CURRENT_TIMESTAMP")
_NOW_ON_UPDATE = sa.text("CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP")


def upgrade() -> None:
    op.create_table(
        "payment_attempts",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("order_no", sa.String(26), nullable=False),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False, server_default=_NOW),
        sa.Column("updated_at", sa.DateTime, nullable=False, server_default=_NOW_ON_UPDATE),
        sa.UniqueConstraint("order_no", "channel", name="uq_payment_attempts_order_channel"),
        mysql_engine="InnoDB",
    )
    op.create_table(
        "refunds",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("refund_no", sa.String(32), nullable=False),
        sa.Column("order_no", sa.String(26), nullable=False),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("payment_txn_id", sa.String(64), nullable=False),
        sa.Column("amount", sa.BigInteger, nullable=False),
        sa.Column("restock", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False, server_default=_NOW),
        sa.Column("updated_at", sa.DateTime, nullable=False, server_default=_NOW_ON_UPDATE),
        sa.UniqueConstraint("refund_no", name="uq_refunds_refund_no"),
        mysql_engine="InnoDB",
    )
    op.create_index("ix_refunds_order_no", "refunds", ["order_no"])


def downgrade() -> None:
    op.drop_table("refunds")
    op.drop_table("payment_attempts")
