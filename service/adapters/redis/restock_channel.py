"""The restock channel: every script that puts stock back PUBLISHes the product id on
``<prefix>:restocked`` (``lua/restock.lua``, ``release.lua``, ``realign.lua``); API processes
follow it to drop their sold-out flags (``service/domain/purchase/sold_out.py``), and the stores of
this process tell their own listeners before the call that put stock back returns."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from service.adapters.redis.client import RedisClient
from service.adapters.redis.keys import restock_channel

log = structlog.get_logger(__name__)

RESUBSCRIBE_SECONDS = 0.5
"""Wait before subscribing again after the channel's connection failed."""


async def follow(
    redis: RedisClient,
    channel: str,
    restocked: Callable[[int], None],
    following: Callable[[], None],
    lost: Callable[[], None],
    resubscribe_seconds: float = RESUBSCRIBE_SECONDS,
) -> None:
    """Follow ``channel`` until cancelled, on a connection of its own: ``following()`` each time
    the subscription is confirmed (the first time and after every reconnect, since announcements
    may have been missed in between), ``restocked(product_id)`` for each announcement, ``lost()``
    when the connection fails (then it subscribes again after ``resubscribe_seconds``). Never
    raises but :class:`asyncio.CancelledError`."""
    while True:
        pubsub = redis.pubsub()
        try:
            await pubsub.subscribe(channel)
            async for message in pubsub.listen():
                if message["type"] == "subscribe":
                    following()
                elif message["type"] == "message":
                    try:
                        product_id = int(message["data"])
                    except ValueError:
                        log.warning("restock_announcement_unreadable", data=repr(message["data"]))
                        continue
                    restocked(product_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Redis down or the connection cut: flags off until subscribed again
            log.warning("restock_channel_lost", error=repr(exc))
        finally:
            lost()
            try:
                await pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]  # typed from redis 8.2
            except Exception as exc:  # the connection is gone already
                log.debug("restock_channel_close_failed", error=repr(exc))
        await asyncio.sleep(resubscribe_seconds)


class RestockChannel:
    """The restock channel of one key prefix: its name (the scripts PUBLISH on it), this
    process's listeners (:meth:`on_restock`, told by :meth:`announce`) and :meth:`follow`."""

    def __init__(self, redis: RedisClient, key_prefix: str) -> None:
        self._redis = redis
        self.name = restock_channel(key_prefix)
        self._listeners: list[Callable[[int], None]] = []

    def on_restock(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(product_id)`` whenever a call of *this* process's stores may have put
        stock of the product back (a restock that returned units, a release, a realignment that
        wrote, a filled bucket), before that call returns. Other processes learn it from
        :meth:`follow`."""
        self._listeners.append(listener)

    def announce(self, product_id: int) -> None:
        """Tell this process's listeners that stock of ``product_id`` may be back."""
        for listener in self._listeners:
            listener(product_id)

    async def follow(
        self,
        restocked: Callable[[int], None],
        following: Callable[[], None],
        lost: Callable[[], None],
        *,
        resubscribe_seconds: float = RESUBSCRIBE_SECONDS,
    ) -> None:
        """Follow the channel until cancelled: see :func:`follow`."""
        await follow(self._redis, self.name, restocked, following, lost, resubscribe_seconds)
