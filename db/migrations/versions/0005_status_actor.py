"""Who made each status change: ``order_status_log.actor`` (the status log records
time, operator, reason). Rows written before this revision have none.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("order_status_log", sa.Column("actor", sa.String(80), nullable=True))


def downgrade() -> None:
    op.drop_column("order_status_log", "actor")
