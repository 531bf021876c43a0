"""A reserve whose reply is lost on the wire: the buyer gets 503 and nothing stays reserved.

A TCP proxy in front of the real Redis (``tests.support.ReplySwallowingProxy``) forwards everything
but swallows the reply to the first EVALSHA that names the user ``victim`` and drops that
connection: the script ran in Redis, the API never heard back.
"""

from __future__ import annotations

from service.domain.purchase.request_id import mint_request_id
from tests.support import buy_losing_the_reserve_reply, redis_state


async def test_lost_reserve_reply_is_503_and_leaves_nothing_reserved(
    settings, put_product, product_id, redis, store, proxy
):
    await put_product(product_id, stock=3, limit=1)
    watcher, port = proxy
    request_id = mint_request_id()
    await buy_losing_the_reserve_reply(settings, watcher, port, product_id, request_id)
    state = await redis_state(redis, settings, product_id)
    assert (state["stock"], state["journal"], state["quota"]) == ("3", {}, {})
    keys = store.product_keys(product_id)
    assert await redis.hget(keys.replay(request_id), "state") == "released"
