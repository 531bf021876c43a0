"""Alembic environment: runs on the connection handed in by ``db.migrate`` (``flashsale
migrate``), or, when Alembic's own command line runs it (``alembic upgrade head`` with the
repository's ``alembic.ini``), on a connection to ``FLASHSALE_DB__URL`` (the process settings)."""

import asyncio

from alembic import context
from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from db.models import Base


def _migrate(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=Base.metadata, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


async def _from_settings() -> None:
    from service.settings import get_settings

    engine = create_async_engine(get_settings().db.url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_migrate)
    finally:
        await engine.dispose()


handed_in = context.config.attributes.get("connection")
if handed_in is not None:
    _migrate(handed_in)
else:
    asyncio.run(_from_settings())
