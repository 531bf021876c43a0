"""The HTTP load generator of ``flashsale sale``: the requests of a plan built before the clock
starts, the keep-alive clients, the workers that send them at a fixed concurrency (one
:class:`~service.sale.plan.Answer` each), and the progress bar.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack

import httpx
import msgspec
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from service.sale.plan import ACCEPTED, Answer, Job, Kind, Shot, Wave

REQUEST_TIMEOUT = 30.0  # seconds per purchase request
CLIENT_POOL = 4  # connections per load client: httpcore checks every pooled connection on each request


def build_requests(url: str, jobs: list[Job], product_id: int, tokens: dict[str, str]) -> list[httpx.Request]:
    """Every purchase-shaped request of the plan to ``url`` (the orders or the no-op route),
    built before the clock starts (``[shot.index]``)."""
    bodies = {
        q: msgspec.json.encode({"product_id": product_id, "quantity": q})
        for q in {s.quantity for j in jobs for s in j.shots}
    }
    # Filled by index below, every slot exactly once; None only until then.
    requests: list[httpx.Request] = [None] * sum(len(job.shots) for job in jobs)  # type: ignore[list-item]
    for job in jobs:
        for shot in job.shots:
            headers = {"Authorization": tokens[shot.user], "Content-Type": "application/json"}
            if shot.key is not None:
                headers["Idempotency-Key"] = shot.key
            requests[shot.index] = httpx.Request("POST", url, content=bodies[shot.quantity], headers=headers)
    return requests


class _Body(msgspec.Struct):
    """The fields read from a 202 body, a notification's 200 body or a problem body."""

    code: str | None = None
    result: str | None = None
    order_no: str | None = None
    request_id: str | None = None


_decode_body = msgspec.json.Decoder(_Body).decode


def answer_of(status: int, content: bytes, latency: float) -> Answer:
    """The :class:`~service.sale.plan.Answer` to a response with ``status`` and body ``content``
    (``latency`` in seconds)."""
    try:
        body = _decode_body(content)
    except msgspec.DecodeError:
        body = _Body()
    code = ACCEPTED if status == 202 else body.result or body.code or f"http_{status}"
    return Answer(status, code, body.order_no, body.request_id, latency, time.perf_counter())


def load_clients(stack: AsyncExitStack, concurrency: int, trust_env: bool) -> list[httpx.AsyncClient]:
    """HTTP clients holding ``concurrency`` keep-alive connections in all, at most
    :data:`CLIENT_POOL` each (closed by ``stack``)."""
    clients = []
    for start in range(0, concurrency, CLIENT_POOL):
        size = min(CLIENT_POOL, concurrency - start)
        client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=size, max_keepalive_connections=size),
            timeout=httpx.Timeout(REQUEST_TIMEOUT, pool=None),
            trust_env=trust_env,
        )
        stack.push_async_callback(client.aclose)
        clients.append(client)
    return clients


class LoadGenerator:
    """Sends the plan's jobs from one worker task per connection of ``clients`` (worker ``i``
    uses client ``i // CLIENT_POOL``) and keeps one :class:`Answer` per request
    (``outcomes[shot.index]``)."""

    def __init__(self, requests: list[httpx.Request]) -> None:
        self._requests = requests
        # Filled by index as answers arrive; read only after every request was answered.
        self.outcomes: list[Answer] = [None] * len(requests)  # type: ignore[list-item]
        self.done = 0
        self.succeeded = 0  # 2xx answers

    async def run(
        self, jobs: list[Job], clients: list[httpx.AsyncClient], concurrency: int, progress: Progress, label: str
    ) -> float:
        """Send everything from ``concurrency`` workers, progress as task ``label``; seconds from
        the first request to the last answer."""
        pending = iter(jobs)
        started = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for number in range(min(concurrency, len(jobs))):
                group.create_task(self._worker(clients[number // CLIENT_POOL], pending))
            group.create_task(self._show(progress, started, label))
        return time.perf_counter() - started

    async def _worker(self, client: httpx.AsyncClient, pending: Iterator[Job]) -> None:
        for job in pending:
            if job.kind is Kind.DUPLICATE:
                await asyncio.gather(*(self._send(client, shot) for shot in job.shots))
            else:
                for shot in job.shots:
                    await self._send(client, shot)

    async def _send(self, client: httpx.AsyncClient, shot: Shot) -> None:
        start = time.perf_counter()
        try:
            response = await client.send(self._requests[shot.index])
        except httpx.HTTPError as exc:
            code = "timeout" if isinstance(exc, httpx.TimeoutException) else "connection_error"
            outcome = Answer(0, code, None, None, time.perf_counter() - start, time.perf_counter())
        else:
            outcome = answer_of(response.status_code, response.content, time.perf_counter() - start)
        self.outcomes[shot.index] = outcome
        self.done += 1
        self.succeeded += 200 <= outcome.status < 300

    async def _show(self, progress: Progress, started: float, label: str) -> None:
        task = progress.add_task(label, total=len(self._requests), rate=0, succeeded=0)
        while True:
            rate = round(self.done / max(time.perf_counter() - started, 1e-9))
            progress.update(task, completed=self.done, rate=rate, succeeded=self.succeeded)
            if self.done == len(self._requests):
                return
            await asyncio.sleep(0.2)


def progress_bar(console: Console) -> Progress:
    """Progress on the console's stream (stderr): requests done, rate, 2xx answers."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]} req/s, {task.fields[succeeded]} answered 2xx"),
        TimeElapsedColumn(),
        console=console,
        disable=console.quiet,
    )


async def send_wave(
    console: Console, label: str, requests: list[httpx.Request], jobs: list[Job], concurrency: int, trust_env: bool
) -> Wave:
    """Send ``requests`` (``[shot.index]`` for the shots of ``jobs``) from ``concurrency``
    connections (:func:`load_clients`), with progress ``label``: every wave (no-op, purchase,
    payments, resale) goes through here. ``trust_env``: honour proxy variables (``--url`` runs)."""
    generator = LoadGenerator(requests)
    async with AsyncExitStack() as stack:
        clients = load_clients(stack, concurrency, trust_env)
        with progress_bar(console) as progress:
            seconds = await generator.run(jobs, clients, concurrency, progress, label)
    return Wave(jobs, generator.outcomes, seconds)
