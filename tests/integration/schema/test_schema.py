"""The SQLAlchemy models and the Alembic migrations describe the same schema."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from db.models import Base


async def test_models_match_the_migrated_schema(engine):
    def differences(sync_connection):
        context = MigrationContext.configure(sync_connection, opts={"compare_type": True})
        return [
            diff
            for diff in compare_metadata(context, Base.metadata)
            if diff[0] != "remove_table" or diff[1].name != "alembic_version"
        ]

    async with engine.connect() as conn:
        assert await conn.run_sync(differences) == []
