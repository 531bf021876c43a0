"""``flashsale migrate``: create the database if missing, then Alembic upgrade to head; the
current revision; a downgrade to a given revision."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from importlib.resources import files

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine


def alembic_config(url: str) -> Config:
    """Alembic configuration pointing at the migrations shipped in this package."""
    config = Config()
    config.set_main_option("script_location", str(files("db").joinpath("migrations")))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


async def create_database(url: str) -> None:
    """CREATE DATABASE IF NOT EXISTS for the database named in ``url`` (utf8mb4, binary collation).

    Raises:
        ValueError: the database name is not ``[A-Za-z0-9_]+``.
    """
    parsed = make_url(url)
    name = parsed.database or ""
    if not re.fullmatch(r"[A-Za-z0-9_]+", name):
        raise ValueError(f"database name {name!r} must match [A-Za-z0-9_]+")
    engine = create_async_engine(parsed._replace(database=None))
    try:
        async with engine.begin() as conn:
            await conn.execute(
                text(f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
            )
    finally:
        await engine.dispose()


async def database_exists(url: str) -> bool:
    """True when the database named in ``url`` exists on its server."""
    parsed = make_url(url)
    engine = create_async_engine(parsed._replace(database=None))
    try:
        async with engine.connect() as conn:
            query = text("SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = :n")
            return bool((await conn.execute(query, {"n": parsed.database})).scalar())
    finally:
        await engine.dispose()


async def drop_database(url: str) -> None:
    """DROP DATABASE IF EXISTS for the database named in ``url`` (a run's or a test's own)."""
    parsed = make_url(url)
    engine = create_async_engine(parsed._replace(database=None))
    try:
        async with engine.begin() as conn:
            await conn.execute(text(f"DROP DATABASE IF EXISTS `{parsed.database}`"))
    finally:
        await engine.dispose()


async def _on_connection(url: str, step: Callable[[Config, Connection], str | None]) -> str | None:
    """Run ``step(config, connection)`` in one transaction on ``url`` (Alembic is synchronous)."""
    # MariaDB notes that alembic_version's primary-key name is ignored; asyncmy logs each note.
    logging.getLogger("asyncmy").setLevel(logging.ERROR)
    config = alembic_config(url)
    engine = create_async_engine(url)

    def run(sync_connection: Connection) -> str | None:
        config.attributes["connection"] = sync_connection
        return step(config, sync_connection)

    try:
        async with engine.begin() as conn:
            return await conn.run_sync(run)
    finally:
        await engine.dispose()


def _revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


async def upgrade(url: str) -> str | None:
    """Bring the schema at ``url`` to the newest revision (idempotent); returns that revision."""
    await create_database(url)

    def step(config: Config, connection: Connection) -> str | None:
        command.upgrade(config, "head")
        return _revision(connection)

    return await _on_connection(url, step)


async def current(url: str) -> str | None:
    """The revision the schema at ``url`` is at (None: not migrated)."""
    return await _on_connection(url, lambda _, connection: _revision(connection))


async def downgrade(url: str, revision: str) -> str | None:
    """Take the schema at ``url`` down to ``revision`` (``base``: nothing; ``-1``: one step);
    returns the revision it is at afterwards.

    Raises:
        alembic.util.exc.CommandError: ``revision`` is unknown or not below the current one.
    """

    def step(config: Config, connection: Connection) -> str | None:
        command.downgrade(config, revision)
        return _revision(connection)

    return await _on_connection(url, step)
