"""Alembic environment: runs on the connection handed in by ``db.migrate.upgrade``."""

from alembic import context

from db.models import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, compare_type=True)
with context.begin_transaction():
    context.run_migrations()
