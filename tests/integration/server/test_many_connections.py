"""Every connection a crowd holds open is served: granian holds one permit per connection, idle
keep-alive ones included, and by default has 4,096 / workers of them; a connection past the last
waited unanswered in the listen backlog (in a 20,000-buyer rehearsal, half the crowd's polls
until their client gave up). ``flashsale serve`` sizes the permits to the open-file limit."""

from __future__ import annotations

import asyncio
import resource

import pytest

from tests.support import flashsale_process
from toolkit.sale.isolation import free_port

pytestmark = pytest.mark.slow  # starts a server process

CONNECTIONS = 4_400
"""More than granian's default permits for one worker (its 4,096-connection backlog / 1)."""


async def _ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    """One request on the connection; the status line (b"" when the server closed it)."""
    try:
        writer.write(b"GET /api/v1/health/live HTTP/1.1\r\nHost: flashsale\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return b""
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    await reader.readexactly(length)
    return head.split(b"\r\n", 1)[0]


class Crowd:
    def __init__(self) -> None:
        self.held: list[asyncio.StreamWriter] = []
        self.opened = asyncio.Event()  # every connection is open
        self.first_answers = 0
        self.answered = asyncio.Event()  # every connection was answered once

    async def hold_one(self, port: int) -> tuple[bytes, bytes]:
        """Open a connection, ask once when every connection is open, and again on the same
        connection once every connection was answered."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        self.held.append(writer)
        await self.opened.wait()
        first = await _ask(reader, writer)
        self.first_answers += 1
        if self.first_answers == CONNECTIONS:
            self.answered.set()
        await self.answered.wait()
        return first, await _ask(reader, writer)


async def test_more_idle_connections_than_granians_default_are_all_answered(settings):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 3 * CONNECTIONS
    if soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.skip(f"open-file limit {hard} < {wanted}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    port = free_port()
    live = f"http://127.0.0.1:{port}/api/v1/health/live"
    crowd = Crowd()
    try:
        async with flashsale_process(settings, live, "serve", "--port", str(port), "--workers", "1"):
            calls = [asyncio.create_task(crowd.hold_one(port)) for _ in range(CONNECTIONS)]
            while len(crowd.held) < CONNECTIONS and not any(call.done() for call in calls):
                await asyncio.sleep(0.05)
            crowd.opened.set()
            statuses = await asyncio.gather(*calls)
            # Served together, none closed to let another in: each answers twice on one connection
            # (with too few permits the last connections got in only once the server closed idle
            # ones, at its header-read timeout, 30 s later)
            assert set(statuses) == {(b"HTTP/1.1 200 OK", b"HTTP/1.1 200 OK")}
    finally:
        for writer in crowd.held:
            writer.close()
        if soft < wanted:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
