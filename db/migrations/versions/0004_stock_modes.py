"""Stock modes and order tokens: ``products.stock_mode`` and ``products.require_token``.

Seed "order system database design", schemes 1 (MySQL row lock, ``database``) and 2 (Redis
pre-decrement, ``redis``). Products that exist before this revision were sold through Redis
and stay ``redis``; new products default to ``database``.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("products", sa.Column("stock_mode", sa.String(8), nullable=False, server_default="redis"))
    op.alter_column("products", "stock_mode", existing_type=sa.String(8), server_default="database")
    op.add_column("products", sa.Column("require_token", sa.Boolean, nullable=False, server_default=sa.false()))


def downgrade() -> None:
    op.drop_column("products", "require_token")
    op.drop_column("products", "stock_mode")
