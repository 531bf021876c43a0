"""The Lua scripts, read from the ``lua`` package and registered once per Redis client."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files

from redis.asyncio import Redis
from redis.commands.core import AsyncScript


def _source(name: str) -> str:
    return files("lua").joinpath(f"{name}.lua").read_text(encoding="utf-8")


@dataclass(frozen=True, slots=True)
class Scripts:
    """redis-py script objects (EVALSHA, falling back to EVAL once if the server lost the script)."""

    reserve: AsyncScript
    release: AsyncScript
    claim: AsyncScript
    realign: AsyncScript
    restock: AsyncScript
    lease_renew: AsyncScript
    lease_release: AsyncScript

    @classmethod
    def register(cls, redis: Redis) -> Scripts:
        """Register every script on ``redis``; call once per client at start-up."""
        return cls(**{name: redis.register_script(_source(name)) for name in cls.__slots__})

    async def load(self) -> None:
        """SCRIPT LOAD every script, so the first EVALSHA of the hot path does not miss."""
        for name in self.__slots__:
            script: AsyncScript = getattr(self, name)
            await script.registered_client.script_load(script.script)
