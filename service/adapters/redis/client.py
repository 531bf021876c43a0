"""The Redis client types the adapters accept: one server (``redis.asyncio.Redis``) or a Redis
Cluster (``redis.asyncio.cluster.RedisCluster``, chosen by ``FLASHSALE_REDIS__CLUSTER``).

Every key of one script call shares a hash tag (:mod:`.keys`), so both run every command the
same way. Of the commands about a server rather than a key, ``SCRIPT LOAD``/``SCRIPT EXISTS``
go to every master (redis-py's cluster client), pub/sub works on any node (a cluster delivers
every ``PUBLISH`` to every node) and ``CONFIG GET`` is asked of every master here.
"""

from __future__ import annotations

from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError, RedisClusterException

RedisClient = Redis | RedisCluster
"""A client of one Redis server or of a Redis Cluster (decoding responses)."""


class ClusterClient(RedisCluster):
    r"""redis-py's ``RedisCluster`` whose "cannot reach the cluster" errors are Redis
    ``ConnectionError``\ s, as one unreachable server's are: redis-py raises
    ``RedisClusterException`` (not a ``RedisError``) when no node it knows answers the slot map
    (at start, or after a node failed), which every caller would otherwise have to know about
    (the purchase path answers ``503`` on a ``RedisError``; the start-up check names the URL)."""

    async def initialize(self, *args: Any, **kwargs: Any) -> ClusterClient:
        try:
            await super().initialize(*args, **kwargs)
        except RedisClusterException as exc:
            raise ConnectionError(f"Redis Cluster unreachable: {exc}") from exc
        return self

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().execute_command(*args, **kwargs)
        except RedisClusterException as exc:
            raise ConnectionError(f"Redis Cluster unreachable: {exc}") from exc


async def config_values(redis: RedisClient, parameter: str) -> list[str | None]:
    """``CONFIG GET parameter`` of the server, or of every master of a cluster (one value each,
    None where the server does not know the parameter).

    Raises:
        redis.exceptions.ResponseError: ``CONFIG`` renamed away or denied (NOPERM).
    """
    if isinstance(redis, RedisCluster):
        answers = cast(dict[str, Any], await redis.config_get(parameter, target_nodes=RedisCluster.PRIMARIES))
        # several nodes: {node name: reply}; a one-master cluster: the reply itself
        replies = [answers] if parameter in answers else list(answers.values())
    else:
        replies = [cast(dict[str, Any], await redis.config_get(parameter))]
    return [_text(reply.get(parameter)) for reply in replies]


def _text(value: object) -> str | None:
    return value.decode() if isinstance(value, bytes) else None if value is None else str(value)
