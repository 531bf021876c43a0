"""Purchase pipeline: products, inventory, orders, order_status_log.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import TINYINT

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_NOW = sa.text("CURRENT_TIMESTAMP")
_NOW_ON_UPDATE = sa.text("CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP")


def upgrade() -> None:
    op.create_table(
        "products",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("price", sa.BigInteger, nullable=False),
        sa.Column("per_user_limit", sa.Integer, nullable=False),
        sa.Column("sale_starts_at", sa.DateTime, nullable=False),
        sa.Column("sale_ends_at", sa.DateTime, nullable=True),
        mysql_engine="InnoDB",
    )
    op.create_table(
        "inventory",
        sa.Column("product_id", sa.BigInteger, sa.ForeignKey("products.id", ondelete="CASCADE"), primary_key=True, autoincrement=False),
        sa.Column("stock", sa.Integer, nullable=False),
        sa.Column("sold", sa.Integer, nullable=False, server_default="0"),
        sa.Column("version", sa.Integer, nullable=False, server_default="0"),
        sa.Column("updated_at", sa.DateTime, nullable=False, server_default=_NOW_ON_UPDATE),
        sa.CheckConstraint("stock >= 0", name="ck_inventory_stock_nonnegative"),
        mysql_engine="InnoDB",
    )
    op.create_table(
        "orders",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("order_no", sa.String(26), nullable=False),
        sa.Column("request_id", sa.String(32), nullable=False),
        sa.Column("user_id", sa.String(64), nullable=False),
        sa.Column("product_id", sa.BigInteger, sa.ForeignKey("products.id"), nullable=False),
        sa.Column("quantity", sa.Integer, nullable=False),
        sa.Column("amount", sa.BigInteger, nullable=False),
        sa.Column("status", TINYINT, nullable=False),
        sa.Column("reason", sa.String(64), nullable=True),
        sa.Column("created_at", sa.DateTime, nullable=False, server_default=_NOW),
        sa.Column("updated_at", sa.DateTime, nullable=False, server_default=_NOW_ON_UPDATE),
        sa.UniqueConstraint("order_no", name="uq_orders_order_no"),
        sa.UniqueConstraint("request_id", name="uq_orders_request_id"),
        mysql_engine="InnoDB",
    )
    op.create_index("ix_orders_user_created", "orders", ["user_id", "created_at"])
    op.create_index("ix_orders_status_created", "orders", ["status", "created_at"])
    op.create_table(
        "order_status_log",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("order_id", sa.BigInteger, sa.ForeignKey("orders.id", ondelete="CASCADE"), nullable=False),
        sa.Column("from_status", TINYINT, nullable=True),
        sa.Column("to_status", TINYINT, nullable=False),
        sa.Column("reason", sa.String(64), nullable=True),
        sa.Column("created_at", sa.DateTime, nullable=False, server_default=_NOW),
        mysql_engine="InnoDB",
    )
    op.create_index("ix_order_status_log_order_id", "order_status_log", ["order_id"])


def downgrade() -> None:
    op.drop_table("order_status_log")
    op.drop_table("orders")
    op.drop_table("inventory")
    op.drop_table("products")
