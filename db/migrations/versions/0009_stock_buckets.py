"""Stock buckets: a hot product's Redis stock split over K key sets with distinct hash tags.

``products.buckets``: K, 1..64, set when the product is created and fixed from then on (a buyer's
bucket is ``crc32(user_id) % K``; changing K would move buyers, with their per-user quota and
replay records, to another bucket). Existing products get 1: their Redis keys do not change.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("products", sa.Column("buckets", sa.SmallInteger, nullable=False, server_default="1"))


def downgrade() -> None:
    op.drop_column("products", "buckets")
