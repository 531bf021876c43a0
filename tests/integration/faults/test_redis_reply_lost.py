"""A reserve whose reply is lost on the wire: the buyer gets 503 and nothing stays reserved.

A TCP proxy in front of the real Redis forwards everything but swallows the reply to the first
EVALSHA that names the user ``victim`` and drops that connection: the script ran in Redis, the
API never heard back.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit

import pytest

from service.bootstrap import Resources
from service.domain.purchase import PurchaseRejected
from service.domain.request_id import mint_request_id
from tests.support import redis_state


class ReplySwallowingProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._upstream = (upstream_host, upstream_port)
        self.armed = True
        self.swallowed = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _handle(self, client_reader, client_writer) -> None:
        server_reader, server_writer = await asyncio.open_connection(*self._upstream)
        swallow = asyncio.Event()

        async def client_to_server():
            while data := await client_reader.read(65536):
                if self.armed and b"EVALSHA" in data.upper() and b"victim" in data:
                    self.armed = False
                    swallow.set()
                server_writer.write(data)
                await server_writer.drain()

        async def server_to_client():
            while data := await server_reader.read(65536):
                if swallow.is_set():
                    self.swallowed += 1
                    return  # the script ran; its reply never arrives, the connection drops
                client_writer.write(data)
                await client_writer.drain()

        tasks = [asyncio.create_task(client_to_server()), asyncio.create_task(server_to_client())]
        with contextlib.suppress(Exception):
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        for writer in (client_writer, server_writer):
            writer.close()


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
