"""The composition root's Redis client: timeouts, keepalive and the idle-connection health check
come from the settings; no retry of commands (only of the health-check PING)."""

from __future__ import annotations

from redis.asyncio.connection import Connection, SSLConnection
from redis.connection import PythonRespSerializer

from service.adapters.redis.client import make_redis
from service.settings import RedisSettings, Settings


async def test_make_redis_applies_the_settings() -> None:
    settings = Settings(
        redis=RedisSettings(socket_timeout=1.5, connect_timeout=0.5, health_check_interval=7, max_connections=3)
    )
    client = make_redis(settings)
    try:
        pool = client.connection_pool
        kwargs = pool.connection_kwargs
        assert kwargs["socket_timeout"] == 1.5
        assert kwargs["socket_connect_timeout"] == 0.5
        assert kwargs["socket_keepalive"] is True
        assert kwargs["health_check_interval"] == 7
        assert "retry" not in kwargs and "retry_on_error" not in kwargs
        connection = pool.make_connection()  # not connected: nothing is dialled
        assert isinstance(connection, Connection)
        assert connection.retry.get_retries() == 0  # commands are never re-sent
    finally:
        await client.aclose()


async def test_tls_urls_keep_their_connection_class() -> None:
    client = make_redis(Settings(redis=RedisSettings(url="rediss://127.0.0.1:6380/0")))
    try:
        assert issubclass(client.connection_pool.connection_class, SSLConnection)
    finally:
        await client.aclose()


def test_timeouts_default_to_two_seconds() -> None:
    redis = RedisSettings()
    assert (redis.socket_timeout, redis.connect_timeout) == (2.0, 2.0)


async def test_commands_are_packed_as_redis_py_packs_them() -> None:
    client = make_redis(Settings())
    try:
        connection = client.connection_pool.make_connection()
        reference = PythonRespSerializer(6000, client.connection_pool.get_encoder().encode)
        commands: list[tuple[object, ...]] = [
            ("EVALSHA", "a" * 40, 2, "{p:1}:stock", "{p:1}:sale", "user-1", 3, 86400, 0.5, b"raw", "ünïcode"),
            ("CLIENT KILL", "ID", 7),  # a command name of two words
            (b"SCRIPT LOAD", "return 1"),
            ("SET", bytearray(b"key"), memoryview(b"value")),  # not hiredis's types: redis-py's serializer
        ]
        for command in commands:
            assert b"".join(connection.pack_command(*command)) == b"".join(reference.pack(*command)), command
    finally:
        await client.aclose()
