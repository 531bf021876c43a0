"""The kept stock modes' expiry under a stampede, on the real MariaDB: the purchases that find a
product's kept mode expired together share one read (counted at the driver, every statement the
engine sends), what that read answers (a mode, or ``ProductNotFound``) reaches each, and a
read whose connection stalled is shared for ``SHARED_READ_SECONDS`` only (MariaDB behind a
proxy that holds that connection's bytes)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from db.engine import make_engine
from db.models import StockMode
from service.domain.errors import ProductNotFound
from service.domain.purchase.product_modes import ProductModes
from tests.support import PausableProxy

BUYERS = 200


@contextlib.contextmanager
def mode_reads(engine: AsyncEngine) -> Iterator[list[str]]:
    """Every statement ``engine`` sends while the block runs that reads ``products``."""
    sent: list[str] = []

    def count(_conn, _cursor, statement, *_args) -> None:
        if "FROM products" in statement:
            sent.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", count)
    try:
        yield sent
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", count)


async def test_200_purchases_finding_the_mode_expired_share_one_read(engine, put_product, product_id):
    await put_product(product_id, stock=5, limit=1, stock_mode="database")
    modes = ProductModes(engine, ttl_seconds=0.2)
    with mode_reads(engine) as sent:
        first = await asyncio.gather(*(modes.load(product_id) for _ in range(BUYERS)))
        assert len(sent) == 1
        assert {known.stock_mode for known in first} == {StockMode.DATABASE}
        assert modes.cached(product_id) is not None
        await asyncio.sleep(0.25)  # expired
        assert modes.cached(product_id) is None
        await asyncio.gather(*(modes.mode(product_id) for _ in range(BUYERS)))
    assert len(sent) == 2


async def test_an_unknown_product_is_refused_to_every_caller_of_the_one_read(engine, new_product_id):
    modes = ProductModes(engine)
    unknown = new_product_id()
    with mode_reads(engine) as sent:
        answers = await asyncio.gather(*(modes.load(unknown) for _ in range(BUYERS)), return_exceptions=True)
        assert len(sent) == 1
        assert all(isinstance(answer, ProductNotFound) for answer in answers)
        with pytest.raises(ProductNotFound):  # nothing kept: the next caller asks MySQL again
            await modes.load(unknown)
    assert len(sent) == 2


async def test_a_caller_cancelled_while_it_waits_leaves_the_read_to_the_others(engine, put_product, product_id):
    await put_product(product_id, stock=5, limit=1)
    modes = ProductModes(engine)
    with mode_reads(engine) as sent:
        starter = asyncio.ensure_future(modes.load(product_id))  # the caller that started the read
        others = [asyncio.ensure_future(modes.load(product_id)) for _ in range(BUYERS - 1)]
        await asyncio.sleep(0)
        starter.cancel()
        answers = await asyncio.gather(*others)
    assert starter.cancelled()
    assert {known.stock_mode for known in answers} == {StockMode.REDIS}
    assert len(sent) == 1


async def test_a_read_whose_connection_stalled_holds_the_others_only_for_a_while(settings, put_product, product_id):
    """The one pooled connection stalls (a dropped peer: no error, no bytes) under the shared
    read: the 100 callers behind it move to a new read on a new connection and all get the mode
    while the stall lasts (before, each waited until TCP gave up, ~15 min)."""
    await put_product(product_id, stock=5, limit=1, stock_mode="database")
    url = make_url(settings.db.url)
    proxy = PausableProxy((url.host or "127.0.0.1", url.port or 3306))
    port = await proxy.start()
    engine = make_engine(url.set(host="127.0.0.1", port=port).render_as_string(hide_password=False), pool_size=5)
    modes = ProductModes(engine, ttl_seconds=0.1)
    try:
        await modes.load(product_id)  # the pool's one connection, through the proxy
        await asyncio.sleep(0.15)  # expired
        proxy.stall_open_connections()
        first = asyncio.ensure_future(modes.load(product_id))  # its read takes the stalled connection
        await asyncio.sleep(0.3)
        assert not first.done()
        others = [asyncio.ensure_future(modes.load(product_id)) for _ in range(100)]
        done, _ = await asyncio.wait([first, *others], timeout=20)  # a bound for the old code only
        assert len(done) == 101  # the stall is still on
        assert {task.result().stock_mode for task in done} == {StockMode.DATABASE}
    finally:
        proxy.release()
        await engine.dispose()
        await proxy.stop()
