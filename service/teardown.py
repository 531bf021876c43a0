"""What one configuration made on the three servers, and removing it: the database of
``FLASHSALE_DB__URL``, the Redis keys of ``FLASHSALE_REDIS__KEY_PREFIX`` and the queues and
exchanges the ``FLASHSALE_AMQP__*`` names give (``flashsale teardown``, docs/OPERATIONS.md,
"Removing a trial"; an isolated run's clean-up, :func:`toolkit.sale.stores.tear_down`).

Only the objects those names give are touched: another configuration on the same servers (another
database, key prefix and queue names) keeps everything. Redis keys are found with SCAN (on a
cluster: every master) and removed with UNLINK (split by slot), never KEYS or FLUSHDB.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.engine import make_url

from db.migrate import database_exists, drop_database
from service.adapters.broker_topology import delete_topology, existing_topology
from service.adapters.redis.client import make_redis
from service.adapters.redis.stores import make_stores
from service.domain.order_numbers.minter import leased_shards
from service.settings import Settings

_BATCH = 1000


def key_pattern(settings: Settings) -> str:
    """The SCAN pattern of the configuration's Redis keys: every key starts ``<prefix>:``."""
    return f"{settings.redis.key_prefix}:*"


@dataclass(frozen=True, slots=True)
class Leftovers:
    """What a configuration has on the servers: its ``database`` (None when there is none),
    how many Redis ``keys`` match ``pattern``, its ``queues`` (name -> (messages, consumers))
    and ``exchanges``, and the API workers still holding an order-number shard (``leases``)."""

    database: str | None
    pattern: str
    keys: int
    queues: dict[str, tuple[int, int]]
    exchanges: list[str]
    leases: int

    @property
    def empty(self) -> bool:
        return self.database is None and not self.keys and not self.queues and not self.exchanges

    @property
    def in_use(self) -> list[str]:
        """Why removing it now would pull it from under running processes (a consumer on a
        queue, an API worker's shard lease), one phrase each; empty when nothing runs."""
        busy = [f"{consumers} consumer(s) on {name}" for name, (_, consumers) in self.queues.items() if consumers]
        if self.leases:
            busy.append(f"{self.leases} API worker(s) holding an order-number shard")
        return busy


async def survey(settings: Settings, pattern: str | None = None) -> Leftovers:
    """What ``settings``'s names have on the servers (Redis keys matching ``pattern``, default
    :func:`key_pattern`); changes nothing."""
    pattern = pattern or key_pattern(settings)
    database = make_url(settings.db.url).database
    exists = await database_exists(settings.db.url)
    store = make_stores(settings)
    try:
        keys = 0
        async for _ in store.redis.scan_iter(match=pattern, count=_BATCH):
            keys += 1
        leases = await leased_shards(store)
    finally:
        await store.aclose()
    queues, exchanges = await existing_topology(settings.amqp.url, settings.amqp)
    return Leftovers(database if exists else None, pattern, keys, queues, exchanges, leases)


async def remove(settings: Settings, pattern: str | None = None) -> None:
    """Drop the database, unlink the Redis keys matching ``pattern`` (default
    :func:`key_pattern`), delete the queues (their messages with them) and exchanges."""
    await drop_database(settings.db.url)
    redis = make_redis(settings)  # on a cluster: SCAN every master, UNLINK split by slot
    try:
        batch = []
        async for key in redis.scan_iter(match=pattern or key_pattern(settings), count=_BATCH):
            batch.append(key)
            if len(batch) >= _BATCH:
                await redis.unlink(*batch)
                batch.clear()
        if batch:
            await redis.unlink(*batch)
    finally:
        await redis.aclose()
    await delete_topology(settings.amqp)
