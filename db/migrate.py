"""``flashsale migrate``: create the database if missing, then Alembic upgrade to head."""

from __future__ import annotations

import logging
import re
from importlib.resources import files

from alembic import command
from alembic.config import Config
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


async def upgrade(url: str) -> None:
    """Bring the schema at ``url`` to the newest revision (idempotent)."""
    # MariaDB notes that alembic_version's primary-key name is ignored; asyncmy logs each note.
    logging.getLogger("asyncmy").setLevel(logging.ERROR)
    await create_database(url)
    config = alembic_config(url)
    engine = create_async_engine(url)

    def run(sync_connection: Connection) -> None:
        config.attributes["connection"] = sync_connection
        command.upgrade(config, "head")

    try:
        async with engine.begin() as conn:
            await conn.run_sync(run)
    finally:
        await engine.dispose()
