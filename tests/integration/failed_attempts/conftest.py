"""Fixtures of the failed-attempt tests: a reply-swallowing proxy in front of the real Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest

from service.settings import Settings
from tests.support import ReplySwallowingProxy


@pytest.fixture
async def proxy(settings: Settings) -> AsyncIterator[tuple[ReplySwallowingProxy, int]]:
    """A reply-swallowing proxy in front of the real Redis and its port, disarmed until a test
    arms it (``buy_losing_the_reserve_reply`` does)."""
    url = urlsplit(settings.redis.url)
    proxy = ReplySwallowingProxy(url.hostname or "127.0.0.1", url.port or 6379, armed=False)
    port = await proxy.start()
    yield proxy, port
    await proxy.stop()
