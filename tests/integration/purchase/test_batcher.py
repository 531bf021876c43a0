"""The hot path's auto-pipelining (:class:`service.adapters.redis.batcher.CommandBatcher`) on the
real Redis: concurrent callers share round trips and each gets its own reply or error; a
connection the server closed while idle is replaced unseen, one lost mid-way fails its batch only;
a silent server fails the callers with a timeout."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from service.adapters.redis.batcher import CommandBatcher
from service.adapters.redis.client import make_redis
from service.settings import Settings


@pytest.fixture
async def batcher(redis: Redis) -> AsyncIterator[CommandBatcher]:
    own = CommandBatcher(redis)
    yield own
    await own.aclose()


@pytest.fixture
def key(settings: Settings, product_id: int) -> str:
    return f"{settings.redis.key_prefix}batcher:{product_id}"


async def test_hundreds_of_concurrent_calls_share_round_trips_and_each_gets_its_own_reply(
    batcher: CommandBatcher, redis: Redis, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    round_trips = 0
    real = batcher._round_trip

    async def counted(*args: object) -> list[object]:
        nonlocal round_trips
        round_trips += 1
        return await real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(batcher, "_round_trip", counted)
    replies = await asyncio.gather(*(batcher.call("INCRBY", key, n) for n in range(1, 401)))
    # INCRBY answers the running total: every caller got the reply to its own command, in order
    assert replies == [n * (n + 1) // 2 for n in range(1, 401)]
    assert int(await redis.get(key)) == 400 * 401 // 2
    assert round_trips <= 2  # 400 commands issued together leave in (at most) one or two pipelines
    pair = await batcher.call_many(("SET", key, "x", "EX", 60), ("GET", key))
    assert pair == ["OK", "x"]  # the server's replies, no response callbacks
    await redis.delete(key)


async def test_an_error_reply_fails_only_its_own_caller(batcher: CommandBatcher, redis: Redis, key: str) -> None:
    await redis.set(key, "not a number", ex=60)
    answers = await asyncio.gather(
        batcher.call("GET", key), batcher.call("INCR", key), batcher.call("STRLEN", key), return_exceptions=True
    )
    assert answers[0] == "not a number"
    assert isinstance(answers[1], ResponseError)
    assert answers[2] == len("not a number")
    assert await batcher.call("GET", key) == "not a number"  # the connection is still in step
    await redis.delete(key)


async def test_a_connection_killed_while_idle_is_replaced_before_the_next_round_trip(
    batcher: CommandBatcher, redis: Redis, key: str
) -> None:
    await batcher.call("SET", key, "1", "EX", 60)
    for _ in range(3):
        own = await batcher.call("CLIENT", "ID")
        await redis.execute_command("CLIENT", "KILL", "ID", own)
        # the server's close is seen before anything is written: no caller hears of it
        assert await asyncio.gather(*(batcher.call("GET", key) for _ in range(20))) == ["1"] * 20
        assert await batcher.call("CLIENT", "ID") != own
    await redis.delete(key)


async def test_a_connection_lost_mid_round_trip_fails_that_batch_only(
    batcher: CommandBatcher, redis: Redis, key: str
) -> None:
    own = await batcher.call("CLIENT", "ID")
    # CLIENT KILL of the batcher's own connection, sent on it: the batch's socket closes while
    # its replies are being read, so its callers cannot know what ran; the next batch reconnects
    answers = await asyncio.gather(
        batcher.call("CLIENT", "KILL", "ID", own, "SKIPME", "no"),
        batcher.call("SET", key, "2", "EX", 60),
        return_exceptions=True,
    )
    assert any(isinstance(answer, RedisError) for answer in answers), answers
    assert await batcher.call("SET", key, "3", "EX", 60) == "OK"
    assert await redis.get(key) == "3"
    await redis.delete(key)


@contextlib.asynccontextmanager
async def _batcher_on_a_silent_server(settings: Settings) -> AsyncIterator[CommandBatcher]:
    """A batcher (deadline 0.3 s) on a server that reads every command and answers none."""

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass  # read everything, answer nothing
        writer.close()

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    silent = settings.redis.model_copy(update={"url": f"redis://127.0.0.1:{port}/0", "socket_timeout": 0.3})
    client = make_redis(settings.model_copy(update={"redis": silent}))
    batcher = CommandBatcher(client)
    try:
        yield batcher
    finally:
        await batcher.aclose()
        await client.aclose()
        server.close()
        await server.wait_closed()


async def test_a_server_that_never_answers_fails_every_caller_with_a_timeout(settings: Settings) -> None:
    async with _batcher_on_a_silent_server(settings) as batcher:
        answers = await asyncio.gather(*(batcher.call("GET", "k") for _ in range(50)), return_exceptions=True)
        assert all(isinstance(answer, RedisTimeoutError) for answer in answers)


async def _stall_the_loop(seconds: float) -> None:
    """Block the event loop (as a long synchronous call, a GC pause or a starved process does)
    once the caller's command is on the wire."""
    await asyncio.sleep(0)
    time.sleep(seconds)  # noqa: ASYNC251 -- the stall is the point


async def test_a_reply_that_came_while_the_process_stalled_past_the_deadline_is_read(
    settings: Settings, redis: Redis, key: str
) -> None:
    """Redis answered in time, but this process did not run until after the deadline: the
    reply waiting unread is its answer, not a timeout (and not a 503 for the buyer)."""
    quick = settings.redis.model_copy(update={"socket_timeout": 0.3})
    client = make_redis(settings.model_copy(update={"redis": quick}))
    batcher = CommandBatcher(client)
    try:
        assert await batcher.call("PING") == "PONG"  # connected
        stall = asyncio.create_task(_stall_the_loop(1.0))
        assert await batcher.call("SET", key, "stalled", "EX", 60) == "OK"
        await stall
        assert await redis.get(key) == "stalled"
    finally:
        await batcher.aclose()
        await client.aclose()
        await redis.delete(key)


async def test_a_silent_server_still_times_out_when_the_process_stalled(settings: Settings) -> None:
    """The deadline is put off by the stall once at most: a server that never answers still fails
    the caller with a timeout."""
    async with _batcher_on_a_silent_server(settings) as batcher:
        stall = asyncio.create_task(_stall_the_loop(1.0))
        async with asyncio.timeout(10):  # fails the test rather than hanging it
            with pytest.raises(RedisTimeoutError):
                await batcher.call("GET", "k")
        await stall
