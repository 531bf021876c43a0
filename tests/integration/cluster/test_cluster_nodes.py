"""``FLASHSALE_REDIS__CLUSTER_NODES``: a process whose ``url`` names a node that does not answer
(killed, being replaced) finds the cluster through the other nodes it was given
(docs/OPERATIONS.md, "Redis Cluster")."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from pydantic import ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError

from service.adapters.redis.client import make_redis
from service.settings import RedisSettings
from toolkit.sale.isolation import free_port


async def test_a_client_whose_url_node_is_down_finds_the_cluster_through_the_others(cluster_settings, cluster_url):
    down = f"redis://127.0.0.1:{free_port()}/0"
    live = urlsplit(cluster_url).netloc
    key = f"{cluster_settings.redis.key_prefix}:cluster-nodes-probe"

    def on(**redis: object):
        return cluster_settings.model_copy(update={"redis": cluster_settings.redis.model_copy(update=redis)})

    alone = make_redis(on(url=down))
    with pytest.raises(RedisConnectionError):
        await alone.set(key, "1")
    await alone.aclose()

    guided = make_redis(on(url=down, cluster_nodes=[f"127.0.0.1:{free_port()}", live]))
    try:
        assert await guided.set(key, "1", ex=60)
        assert await guided.get(key) == "1"
    finally:
        await guided.delete(key)
        await guided.aclose()


@pytest.mark.parametrize("node", ["127.0.0.1", "redis://127.0.0.1:7000", "127.0.0.1:", "a b:7000"])
def test_a_node_is_host_colon_port(node):
    with pytest.raises(ValidationError):
        RedisSettings(cluster=True, cluster_nodes=[node])
