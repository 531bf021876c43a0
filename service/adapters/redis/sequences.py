"""Order-number sequences: per shard, a counter per UTC second, minted in blocks while the
shard's epoch (the generation it mints in, installed on this very Redis server) holds.

Failures raise the vocabulary only (:mod:`.boundary`).
"""

from __future__ import annotations

from service.adapters.redis.keys import epoch_key, sequence_key
from service.adapters.redis.scripts import Scripts

SEQUENCE_KEY_TTL_SECONDS = 120
"""Lifetime of an order-number sequence counter (one shard, one second)."""


class OrderNumberSequences:
    """The order-number sequences of one key prefix."""

    def __init__(self, scripts: Scripts, key_prefix: str) -> None:
        self._scripts = scripts
        self._prefix = key_prefix

    def key(self, shard: int, second: str) -> str:
        """The sequence counter of ``shard`` in UTC ``second`` (``yyyyMMddHHmmss``), for tests
        that inspect Redis."""
        return sequence_key(self._prefix, shard, second)

    async def mint_block(self, shard: int, generation: int, second: str, count: int) -> int | None:
        """``lua/mint.lua``: INCRBY ``count`` the sequence counter of ``shard`` in UTC ``second``
        (``yyyyMMddHHmmss``) and (re)set its expiry, only while the shard's epoch is
        ``generation`` installed on this Redis server. Returns the new value (the caller owns
        ``value - count + 1 .. value``; 1 is the first), or None when the epoch is gone or was
        installed on another server (FLUSHALL, restart, failover): see :meth:`epoch`."""
        reply = await self._scripts.run(
            "mint",
            keys=[epoch_key(self._prefix, shard), sequence_key(self._prefix, shard, second)],
            args=[generation, count, SEQUENCE_KEY_TTL_SECONDS],
        )
        return int(reply[1]) if reply[0] == "ok" else None

    async def epoch(self, shard: int, install: int | None = None) -> tuple[int | None, bool]:
        """``lua/epoch.lua``: the generation ``shard`` mints in (None: none) and whether it was
        installed on this Redis server. With ``install`` (a generation just taken in MySQL),
        installs it first unless the shard already has an epoch of this server."""
        generation, current = await self._scripts.run(
            "epoch", keys=[epoch_key(self._prefix, shard)], args=["" if install is None else install]
        )
        return (None if generation == "" else int(generation)), bool(current)
