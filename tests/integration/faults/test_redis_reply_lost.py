"""A reserve whose reply is lost on the wire: the buyer gets 503 and nothing stays reserved.

A TCP proxy in front of the real Redis (``tests.support.ReplySwallowingProxy``) forwards everything
but swallows the reply to the first EVALSHA that names the user ``victim`` and drops that
connection: the script ran in Redis, the API never heard back.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from service.bootstrap import Resources
from service.domain.purchase import PurchaseRejected
from service.domain.request_id import mint_request_id
from tests.support import ReplySwallowingProxy, redis_state


@pytest.fixture
async def proxy(settings):
    url = urlsplit(settings.redis.url)
    proxy = ReplySwallowingProxy(url.hostname or "127.0.0.1", url.port or 6379)
    port = await proxy.start()
    yield proxy, port
    await proxy.stop()


async def test_lost_reserve_reply_is_503_and_leaves_nothing_reserved(
    settings, put_product, product_id, redis, store, proxy
):
    await put_product(product_id, stock=3, limit=1)
    watcher, port = proxy
    through_proxy = settings.model_copy(
        update={"redis": settings.redis.model_copy(update={"url": f"redis://127.0.0.1:{port}/0"})}
    )
    resources = await Resources.open(through_proxy)
    request_id = mint_request_id()
    try:
        with pytest.raises(PurchaseRejected) as rejected:
            await resources.purchases.purchase("victim", product_id, 1, request_id)
    finally:
        await resources.close()
    assert rejected.value.code == "unavailable"
    assert watcher.swallowed == 1
    state = await redis_state(redis, settings, product_id)
    assert (state["stock"], state["journal"], state["quota"]) == ("3", {}, {})
    keys = store.product_keys(product_id)
    assert await redis.hget(keys.replay(request_id), "state") == "released"
