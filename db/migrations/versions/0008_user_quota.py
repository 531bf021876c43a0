"""The per-user limit backed in MySQL, and order numbers met twice.

``user_quota``: units each user holds of each product against its per-user limit, updated in the
transaction that writes the order (the consumer's batch and the ``database``-mode purchase), so a
buyer whose quota Redis lost (eviction, failover, FLUSHALL) still cannot go over the limit.
Backfilled from the orders that hold units (every status but ``cancelled`` and ``rejected``: a
refunded buyer keeps the quota, as in realignment).

``order_no_conflicts``: an accepted order whose order number the consumer found taken by another
request's order; its buyer reaches the order's final ``rejected`` row through it with the number
of the 202.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_NOT_HOLDING = (4, 7)  # cancelled, rejected: the units went back (or never left)


def upgrade() -> None:
    op.create_table(
        "user_quota",
        sa.Column("product_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("user_id", sa.String(64), primary_key=True),
        sa.Column("bought", sa.Integer, nullable=False),
        mysql_engine="InnoDB",
    )
    op.execute(
        sa.text(
            "INSERT INTO user_quota (product_id, user_id, bought)"
            " SELECT product_id, user_id, SUM(quantity) FROM orders"
            f" WHERE status NOT IN {_NOT_HOLDING} GROUP BY product_id, user_id"
        )
    )
    op.create_table(
        "order_no_conflicts",
        sa.Column("request_id", sa.String(32), primary_key=True),
        sa.Column("order_no", sa.String(26), nullable=False),
        sa.Column("user_id", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False, server_default=sa.text("CURRENT_TIMESTAMP")),
        mysql_engine="InnoDB",
    )
    op.create_index("ix_order_no_conflicts_order_no_user", "order_no_conflicts", ["order_no", "user_id"])


def downgrade() -> None:
    op.drop_table("order_no_conflicts")
    op.drop_table("user_quota")
