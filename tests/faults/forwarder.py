"""A TCP forwarder in the test process: the one address that moves in front of a replicated
MariaDB (tests/faults/replication.py: a Kubernetes Service or MaxScale stands there in
production), the load balancer in front of two API hosts, and the link that adds latency between
a host and a server (tests/faults/netns.py)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time

from toolkit.sale.isolation import free_port


class Forwarder:
    """A TCP forwarder on ``host``:``port`` (127.0.0.1 and a free port by default) to ``targets``
    (host, port), a connection to each in turn: one address that moves. :meth:`point_at` changes
    the targets and closes the connections it carried; while :meth:`hold` is on, new connections
    wait (at most ``HOLD_LIMIT`` seconds) instead of reaching a server. While :attr:`delay` is
    (mean, spread) seconds, every chunk is passed on that long (uniformly within the spread)
    after it came, each direction, in order."""

    HOLD_LIMIT = 30.0

    def __init__(self, targets: list[tuple[str, int]], host: str = "127.0.0.1", port: int | None = None) -> None:
        self.host = host
        self.port = port or free_port()
        self.delay: tuple[float, float] | None = None
        self.targets = targets
        self._turn = itertools.count()
        self._open = asyncio.Event()
        self._open.set()
        self._pairs: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, reuse_address=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._pairs.add(task)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._open.wait(), self.HOLD_LIMIT)
            host, port = self.targets[next(self._turn) % len(self.targets)]
            try:
                up_reader, up_writer = await asyncio.open_connection(host, port)
            except OSError:
                return  # no primary there: the client sees its connection lost
            try:
                await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
            finally:
                up_writer.close()
        except asyncio.CancelledError:
            pass
        finally:
            writer.close()
            self._pairs.discard(task)

    def hold(self) -> None:
        """New connections wait; the ones carried are closed."""
        self._open.clear()
        self._drop()

    def point_at(self, targets: list[tuple[str, int]]) -> None:
        """Connections go to ``targets`` from now on (the held ones too); the old ones are closed."""
        self.targets = targets
        self._drop()
        self._open.set()

    def _drop(self) -> None:
        for task in list(self._pairs):
            task.cancel()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """``reader`` to ``writer``; with :attr:`delay`, each chunk at its due time, in order."""
        chunks: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                due, data = await chunks.get()
                if not data:
                    return
                if (wait := due - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()

        sender = asyncio.create_task(send())
        last_due = 0.0
        try:
            while data := await reader.read(65536):
                due = time.monotonic()
                if self.delay is not None:
                    mean, spread = self.delay
                    due += random.uniform(mean - spread, mean + spread)
                last_due = max(due, last_due)  # never overtakes an earlier chunk
                chunks.put_nowait((last_due, data))
            chunks.put_nowait((last_due, b""))
            await sender
        except OSError:
            pass
        finally:
            sender.cancel()
            with contextlib.suppress(OSError):
                writer.write_eof()
            writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self._drop()
        await asyncio.gather(*self._pairs, return_exceptions=True)
