"""The Lua scripts' registry: every ``lua/<name>.lua`` read once from the package data and
registered on one client, called by name with EVALSHA (EVAL's fallback on NOSCRIPT, when the
server lost its scripts: restart, failover, SCRIPT FLUSH).

Every key a script touches is passed in KEYS and all keys of one call share a hash tag
(:mod:`.keys`), so each call runs unchanged on Redis Cluster; ``SCRIPT LOAD`` and
``SCRIPT EXISTS`` go to every master there (redis-py's cluster client).

Failures: every call raises :class:`~service.failures.StoreUnavailable` ``("redis")``
from the driver's exception (:mod:`.boundary`), nothing of redis-py's.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from importlib.resources import files
from typing import Any

import structlog
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from service.adapters.redis.batcher import CommandBatcher
from service.adapters.redis.boundary import DRIVER_ERRORS, translated, unavailable
from service.adapters.redis.client import RedisClient

log = structlog.get_logger(__name__)

SCRIPT_NAMES = (
    "reserve",
    "release",
    "claim",
    "realign",
    "restock",
    "lease_renew",
    "lease_release",
    "take_token",
    "purge",
    "realign_drop",
    "republish_due",
    "mint",
    "epoch",
    "restore_replays",
    "bucket_fill",
    "queue",
    "journal_size",
)
"""Every script of the ``lua`` package, by file name without ``.lua``."""


@functools.cache
def _source(name: str) -> str:
    return files("lua").joinpath(f"{name}.lua").read_text(encoding="utf-8")


class Scripts:
    """The scripts of :data:`SCRIPT_NAMES` registered on ``redis`` (one registry per client)."""

    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis
        self._scripts: dict[str, AsyncScript] = {name: redis.register_script(_source(name)) for name in SCRIPT_NAMES}

    @property
    def shas(self) -> list[str]:
        """The SHA1 of every script, as EVALSHA and SCRIPT EXISTS name them."""
        return [script.sha for script in self._scripts.values()]

    async def run(self, name: str, keys: Sequence[str], args: Sequence[str | int | float]) -> Any:
        """EVALSHA of script ``name`` (loaded and run again once on NOSCRIPT): its reply."""
        try:
            return await self._scripts[name](keys=list(keys), args=list(args))
        except DRIVER_ERRORS as exc:
            raise unavailable(exc) from exc

    async def run_batched(
        self, batcher: CommandBatcher, name: str, keys: Sequence[str], args: Sequence[str | int | float]
    ) -> Any:
        """:meth:`run` on the hot path's shared pipeline (:class:`CommandBatcher`): concurrent
        calls share one round trip. On NOSCRIPT the script is loaded and the call sent once more."""
        script = self._scripts[name]
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        try:
            try:
                return await batcher.call(*command)
            except NoScriptError:  # the server lost its scripts (restart, SCRIPT FLUSH): load, once more
                await script.registered_client.script_load(script.script)
                return await batcher.call(*command)
        except DRIVER_ERRORS as exc:
            raise unavailable(exc) from exc

    @translated
    async def load(self) -> None:
        """SCRIPT LOAD every script, so the first EVALSHA of the hot path does not miss."""
        for script in self._scripts.values():
            await script.registered_client.script_load(script.script)

    @translated
    async def ready(self) -> bool:
        """True when the server holds every script: one SCRIPT EXISTS round trip, then SCRIPT
        LOAD (idempotent) of any script the server lost (restart, failover, SCRIPT FLUSH), so a
        probe recovers by itself instead of waiting for each script's next call."""
        scripts = list(self._scripts.values())
        held = await self._redis.script_exists(*self.shas)
        for script, present in zip(scripts, held, strict=True):
            if not present:
                log.info("redis_script_reloaded", sha=script.sha)
                await self._redis.script_load(script.script)
        return True


class KeyspaceStore:
    """Base of the stores of one key prefix: the client (``_redis``), the script registry
    (``_scripts``) and the prefix (``_prefix``) their key names start with (:mod:`.keys`)."""

    def __init__(self, redis: RedisClient, scripts: Scripts, key_prefix: str) -> None:
        self._redis = redis
        self._scripts = scripts
        self._prefix = key_prefix
