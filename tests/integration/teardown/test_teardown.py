"""``flashsale teardown`` removes what one configuration made (database, Redis keys under its
prefix, queues and exchanges) and nothing of another configuration on the same servers, even
one whose key prefix starts with the same letters; it lists first, asks, and refuses while a
consumer still reads its queues."""

from __future__ import annotations

import asyncio
import subprocess

import aio_pika
import pytest

from db.migrate import upgrade
from service.adapters.broker_topology import declare_topology
from service.settings import Settings
from service.teardown import Leftovers, survey
from tests.support import run_flashsale
from toolkit.sale.isolation import isolated_settings, new_run_id
from toolkit.sale.stores import tear_down

pytestmark = pytest.mark.slow  # runs CLI processes


def _teardown(settings: Settings, *args: str, answer: str = "") -> subprocess.CompletedProcess[str]:
    return run_flashsale(settings, "teardown", *args, answer=answer)


def _product_set(settings: Settings) -> None:
    done = run_flashsale(settings, "product", "set", "7", "--stock", "5", "--stock-mode", "redis")
    assert done.returncode == 0, done.stderr


async def _make(settings: Settings) -> Leftovers:
    """What a trial of ``settings`` leaves: its database, a product loaded into Redis, its topology."""
    await upgrade(settings.db.url)
    await asyncio.to_thread(_product_set, settings)
    connection = await aio_pika.connect(settings.amqp.url)
    async with connection:
        await declare_topology(await connection.channel(), settings.amqp)
    return await survey(settings)


async def _ignore(message: aio_pika.abc.AbstractIncomingMessage) -> None:
    """A consumer that takes nothing in (its deliveries go back when it leaves)."""


async def test_teardown_removes_one_configuration_and_nothing_else(settings):
    run_id = new_run_id("td")
    mine, other = isolated_settings(settings, run_id), isolated_settings(settings, f"{run_id}x")
    try:
        made, kept = await _make(mine), await _make(other)
        for found in (made, kept):
            assert found.database and found.keys > 0 and len(found.queues) == 7 and len(found.exchanges) == 2

        listed = await asyncio.to_thread(_teardown, mine, "--dry-run")
        assert listed.returncode == 0, listed.stderr
        assert f"MySQL database {run_id} at " in listed.stdout and f"{run_id}:*" in listed.stdout
        assert f"RabbitMQ queue {run_id}.orders (0 messages)" in listed.stdout
        assert listed.stdout.rstrip().endswith("Dry run: nothing removed.")
        assert await survey(mine) == made

        declined = await asyncio.to_thread(_teardown, mine, answer="n\n")
        assert declined.returncode == 1 and "Remove all of this?" in declined.stdout
        assert await survey(mine) == made

        connection = await aio_pika.connect(mine.amqp.url)  # a consumer still reading the order queue
        async with connection:
            queue = await (await connection.channel()).get_queue(mine.amqp.queue)
            await queue.consume(_ignore)
            busy = await asyncio.to_thread(_teardown, mine, "--yes")
        assert busy.returncode == 1 and f"1 consumer(s) on {run_id}.orders" in busy.stderr
        assert await survey(mine) == made

        removed = await asyncio.to_thread(_teardown, mine, "--yes")
        assert removed.returncode == 0, removed.stderr
        assert removed.stdout.rstrip().endswith("Removed.")
        assert (await survey(mine)).empty
        assert await survey(other) == kept  # the other configuration, prefix "<run_id>x", untouched
        again = await asyncio.to_thread(_teardown, mine, "--yes")
        assert again.returncode == 0 and "Nothing to remove" in again.stdout
    finally:
        await tear_down(mine)
        await tear_down(other)
