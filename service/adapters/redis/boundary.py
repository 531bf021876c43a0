"""The Redis adapter's boundary: redis-py's failures become the failure vocabulary
(:class:`StoreUnavailable` ``("redis")`` when Redis did not answer, ``StoreError`` for an error reply).

Every public method of the adapter raises nothing of redis-py's: a script call is translated by
the registry (:mod:`.scripts`), every other command by :func:`translated` on the method. The
driver's exception stays the ``__cause__`` (for logs). See docs/ARCHITECTURE.md, "Failure vocabulary".
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from redis.exceptions import RedisClusterException, RedisError

from service.failures import StoreFailure, StoreUnavailable, translate

DRIVER_ERRORS: tuple[type[BaseException], ...] = (RedisError, RedisClusterException, OSError)
"""What redis-py raises when a call fails: its own errors (connection, timeout, error replies),
the cluster client's "no node answers", and socket errors (``OSError``, ``TimeoutError``)."""

P = ParamSpec("P")
T = TypeVar("T")


def unavailable(exc: BaseException) -> StoreFailure:
    """The vocabulary's exception that stands for ``exc`` (raise it ``from exc``):
    :func:`service.failures.translate`'s (wrong credentials are a
    :class:`~service.failures.StoreRefused`, an error reply a :class:`~service.failures.StoreError`),
    else :class:`StoreUnavailable` (the cluster client's "no node answers", a socket error)."""
    failure = translate(exc)
    if failure is not None:
        return failure
    return StoreUnavailable("redis", str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)


def translated(method: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    """``method`` (a coroutine function) raising the vocabulary's exception (:func:`unavailable`)
    from the driver's exception instead of it."""

    @functools.wraps(method)
    async def call(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await method(*args, **kwargs)
        except DRIVER_ERRORS as exc:
            raise unavailable(exc) from exc

    return call
