"""A process stopped in the middle of a MySQL transaction (SIGSTOP, a frozen host) sends nothing
and holds its row locks: every other writer of those rows waits. With
``FLASHSALE_DB__IDLE_SESSION_SECONDS`` the server closes such a session and rolls its transaction
back, so the others go on; the stopped process, when it wakes, finds its session gone (MySQL
unavailable: the consumer's transient path) and nothing it wrote kept (docs/RELIABILITY.md, the
pause rows).

A client that stops sending is, to the server, exactly a paused process: here it is a
connection that sleeps inside its transaction.
"""

from __future__ import annotations

import asyncio
import secrets

import pytest
from sqlalchemy import text

from db.engine import make_engine
from service.failures import StoreUnavailable

IDLE_SECONDS = 2
PAUSE_SECONDS = 4.0  # the stopped session sends nothing for longer than IDLE_SECONDS


async def test_a_session_stopped_mid_transaction_gives_its_locks_back(settings):
    stopped = make_engine(settings.db.url, pool_size=1, max_overflow=0, idle_session_seconds=IDLE_SECONDS)
    other = make_engine(settings.db.url, pool_size=1, max_overflow=0)
    table = f"paused_{secrets.token_hex(4)}"
    try:
        async with other.begin() as conn:
            await conn.execute(text(f"CREATE TABLE {table} (id INT PRIMARY KEY, n INT NOT NULL)"))
            await conn.execute(text(f"INSERT INTO {table} VALUES (1, 0)"))
        async with stopped.connect() as paused:
            await paused.begin()
            await paused.execute(text(f"UPDATE {table} SET n = n + 1 WHERE id = 1"))  # the row lock is held
            await asyncio.sleep(PAUSE_SECONDS)
            async with other.begin() as conn:  # before the fix: 1205 lock wait timeout
                await conn.execute(text("SET SESSION innodb_lock_wait_timeout = 2"))
                await conn.execute(text(f"UPDATE {table} SET n = n + 10 WHERE id = 1"))
            with pytest.raises(StoreUnavailable):
                await paused.execute(text("SELECT 1"))  # woken: its session is gone
        async with other.connect() as conn:
            assert (await conn.execute(text(f"SELECT n FROM {table}"))).scalar_one() == 10
        async with stopped.connect() as conn:  # the pool replaced the closed connection
            assert (await conn.execute(text("SELECT @@wait_timeout"))).scalar_one() == IDLE_SECONDS
    finally:
        async with other.begin() as conn:
            await conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
        await stopped.dispose()
        await other.dispose()
