"""The Redis adapter's boundary: redis-py's failures leave it as the vocabulary, with the driver's
exception as the cause: ``StoreUnavailable("redis")`` when Redis did not answer (``StoreRefused``
for wrong credentials), ``StoreError`` for an error reply, so the outage classifier still tells
an outage from wrong credentials and from an answer."""

from __future__ import annotations

import pytest
from redis.exceptions import AuthenticationError, RedisClusterException, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from service.adapters.redis.boundary import translated
from service.failures import StoreError, StoreFailure, StoreUnavailable, outage_of


@pytest.mark.parametrize(
    "error",
    [RedisConnectionError("refused"), ResponseError("OOM"), RedisClusterException("no node"), OSError("reset")],
)
async def test_a_driver_error_becomes_the_vocabulary_with_its_cause(error: BaseException) -> None:
    @translated
    async def call() -> None:
        raise error

    with pytest.raises(StoreFailure) as raised:
        await call()
    assert raised.value.store == "redis" and raised.value.__cause__ is error
    # an error reply (OOM) is Redis answering: StoreError; the others are Redis not answering
    assert isinstance(raised.value, StoreError if isinstance(error, ResponseError) else StoreUnavailable)


async def test_other_errors_pass_through() -> None:
    @translated
    async def call() -> None:
        raise ValueError("a malformed reply")

    with pytest.raises(ValueError):
        await call()


async def _translated(error: BaseException) -> StoreUnavailable:
    @translated
    async def call() -> None:
        raise error

    with pytest.raises(StoreUnavailable) as raised:
        await call()
    return raised.value


async def test_the_classifier_tells_an_outage_from_wrong_credentials() -> None:
    assert outage_of(await _translated(RedisConnectionError("refused"))) == "Redis"
    assert outage_of(await _translated(AuthenticationError("WRONGPASS"))) is None  # configuration, no outage
    assert outage_of(StoreUnavailable("redis")) == "Redis"
