"""Order-number generations: one row per shard (00-99), bumped whenever a minter finds that Redis
lost the shard's sequence (FLUSHALL, a restart or failover that may have rolled counters back).
The generation's last digit is the first digit of the 6-digit sequence of every order number
minted in it, so a counter that restarts after a Redis loss cannot mint a number again.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table(
        "order_no_generations",
        sa.Column("shard", sa.SmallInteger, primary_key=True, autoincrement=False),
        sa.Column("generation", sa.Integer, nullable=False, server_default="0"),
        sa.Column(
            "changed_at",
            sa.DateTime(timezone=False),
            nullable=False,
            server_default=sa.text("CURRENT_TIMESTAMP"),
        ),
    )
    op.bulk_insert(table, [{"shard": shard, "generation": 0} for shard in range(100)])


def downgrade() -> None:
    op.drop_table("order_no_generations")
