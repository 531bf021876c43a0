"""Teardown on a Redis Cluster: the configuration's keys on every master go (SCAN each master,
UNLINK split by slot), another prefix's keys stay."""

from __future__ import annotations

from service.teardown import remove, survey
from toolkit.sale.isolation import isolated_settings, new_run_id


async def test_teardown_removes_a_prefix_from_every_master(cluster_settings, cluster_redis):
    run_id = new_run_id("tdc")
    # on the cluster too: isolated_settings keeps the Redis URL and cluster flag, sets the prefix
    mine, other = isolated_settings(cluster_settings, run_id), isolated_settings(cluster_settings, f"{run_id}x")
    for prefix in (run_id, f"{run_id}x"):
        for product in range(60):  # 60 hash tags: keys on every master
            await cluster_redis.set(f"{prefix}:{{p:{product}}}:stock", 1)
    slots = {cluster_redis.keyslot(f"{run_id}:{{p:{product}}}:stock") for product in range(60)}
    masters = {cluster_redis.get_node_from_key(f"{run_id}:{{p:{product}}}:stock").name for product in range(60)}
    assert len(slots) == 60 and len(masters) == 3
    try:
        assert (await survey(mine)).keys == 60
        await remove(mine)
        assert (await survey(mine)).empty
        assert (await survey(other)).keys == 60
    finally:
        await remove(other)
