"""Several broker addresses (``FLASHSALE_AMQP__FAILOVER_URLS``): a connection is made at the first
address that answers, and a connection lost with its node is made again at the next address by
itself (:class:`service.adapters.broker_connection.FailoverConnection`), which also holds aio-pika
to what that class relies on (it reads ``url`` once per connection attempt).

The "nodes" are the test broker behind TCP relays of the test's own (a relay cut is a node lost):
no second broker is needed, and the broker itself is never touched.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aio_pika
from yarl import URL

from service.adapters.broker_connection import broker_addresses, connect_once, connect_robust
from tests.support import eventually
from toolkit.sale.isolation import free_port


class Relay:
    """Forwards 127.0.0.1:``port`` to the broker; :meth:`cut` drops every connection and stops listening."""

    def __init__(self, target: URL) -> None:
        self.port = free_port()
        self._target = target
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.accepted = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        assert self._target.host is not None and self._target.port is not None
        up_reader, up_writer = await asyncio.open_connection(self._target.host, self._target.port)
        self._writers |= {writer, up_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)

    def url(self, broker: URL) -> str:
        return str(broker.with_port(self.port))

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        await self._server.wait_closed()


@contextlib.asynccontextmanager
async def relays(broker: URL, count: int) -> AsyncIterator[list[Relay]]:
    started = [Relay(broker) for _ in range(count)]
    for relay in started:
        await relay.start()
    try:
        yield started
    finally:
        for relay in started:
            with contextlib.suppress(Exception):
                await relay.cut()


def _dead_url(broker: URL) -> str:
    return str(broker.with_port(free_port()))  # nothing listens there


async def test_the_first_connect_goes_to_the_first_node_that_answers(settings):
    broker = URL(settings.amqp.url)
    dead = [_dead_url(broker), _dead_url(broker)]
    amqp = settings.amqp.model_copy(update={"url": dead[0], "failover_urls": [dead[1], str(broker)]})
    connection = await connect_robust(amqp)
    try:
        channel = await connection.channel()
        await channel.declare_queue(exclusive=True)
    finally:
        await connection.close()
    once = await connect_once(amqp)
    await once.close()


async def test_a_lost_connection_is_made_again_at_the_next_node(settings):
    broker = URL(settings.amqp.url)
    async with relays(broker, 2) as (first, second):
        amqp = settings.amqp.model_copy(update={"url": first.url(broker), "failover_urls": [second.url(broker)]})
        connection = await connect_robust(amqp)
        try:
            assert (first.accepted, second.accepted) == (1, 0)
            channel = await connection.channel(publisher_confirms=True)
            queue = await channel.declare_queue(exclusive=True)

            await first.cut()  # the node is lost: the next attempt goes to the other one

            async def publishes_again() -> bool:
                try:
                    await channel.default_exchange.publish(aio_pika.Message(b"after"), routing_key=queue.name)
                except Exception:
                    return False
                return True

            await eventually(publishes_again, timeout=30, interval=0.2)
            assert second.accepted == 1
            assert connection.address == f"127.0.0.1:{second.port}"  # type: ignore[attr-defined]
        finally:
            await connection.close()


def test_every_address_asks_for_the_heartbeat_unless_it_names_one(settings):
    amqp = settings.amqp.model_copy(
        update={
            "url": "amqp://guest:guest@node-a:5672/",
            "failover_urls": ["amqp://guest:guest@node-b:5672/?heartbeat=30"],
            "heartbeat_seconds": 7,
        }
    )
    assert [address.query["heartbeat"] for address in broker_addresses(amqp)] == ["7", "30"]
