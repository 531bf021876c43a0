"""Order numbers minted in MySQL (stock mode ``database`` sells with Redis down):
``order_no_sequences``, one row per reserved shard (90-99) holding the last second and sequence
handed out (``service.domain.order_numbers.mysql_minter``).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import TINYINT

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table(
        "order_no_sequences",
        sa.Column("shard", TINYINT, primary_key=True, autoincrement=False),
        sa.Column("second", sa.String(14), nullable=False),
        sa.Column("sequence", sa.Integer, nullable=False),
    )
    op.bulk_insert(table, [{"shard": shard, "second": "00000000000000", "sequence": 0} for shard in range(90, 100)])


def downgrade() -> None:
    op.drop_table("order_no_sequences")
