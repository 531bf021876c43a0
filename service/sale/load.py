"""The load generator of ``flashsale sale``: a plan of purchase-shaped jobs (buys, retries with
the same Idempotency-Key, concurrent duplicates, over-limit attempts), the requests built before
the clock starts, and the workers that send them at a fixed concurrency, one outcome each.
"""

from __future__ import annotations

import asyncio
import random
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

from service.sale.report import ACCEPTED, Job, Kind, Outcome, Shot

REQUEST_TIMEOUT = 30.0  # seconds per purchase request
CLIENT_POOL = 4  # connections per load client: httpcore checks every pooled connection on each request

# The load mix: job kind -> weight (see service.sale.report.Kind).
MIX = {Kind.BUY: 70, Kind.RETRY: 12, Kind.DUPLICATE: 6, Kind.OVER_LIMIT: 12}
TWO_UNITS_SHARE = 0.15  # share of buys for 2 units (when the limit allows it)
NO_KEY_SHARE = 0.2  # share of plain buys sent without an Idempotency-Key


def user_name(prefix: str, index: int) -> str:
    """``<prefix>-<index>``: the JWT subject of a simulated buyer."""
    return f"{prefix}-{index}"


def build_plan(
    requests_: int, users: int, per_user_limit: int, rng: random.Random, user_prefix: str = "buyer"
) -> list[Job]:
    """Jobs totalling exactly ``requests_`` requests, in random order (mix: :data:`MIX`).

    Users (``<user_prefix>-<n>``) are dealt out one per job until each of ``users`` has one, then
    at random. A retry, duplicate or over-limit job always carries Idempotency-Keys; a plain buy
    has none in :data:`NO_KEY_SHARE` of cases. Over-limit jobs ask for the whole limit, then (new
    key) one unit more.
    """
    kinds, weights = list(MIX), list(MIX.values())
    jobs: list[Job] = []
    index = 0
    while index < requests_:
        kind = rng.choices(kinds, weights)[0] if requests_ - index >= 2 else Kind.BUY
        number = len(jobs)
        user = user_name(user_prefix, number if number < users else rng.randrange(users))
        key = None if kind is Kind.BUY and rng.random() < NO_KEY_SHARE else f"k{number}"
        if kind is Kind.OVER_LIMIT:
            shots = (Shot(index, user, per_user_limit, key), Shot(index + 1, user, 1, f"{key}+1"))
        else:
            quantity = 2 if per_user_limit >= 2 and rng.random() < TWO_UNITS_SHARE else 1
            shots = tuple(Shot(index + i, user, quantity, key) for i in range(1 if kind is Kind.BUY else 2))
        jobs.append(Job(kind, shots))
        index += len(shots)
    rng.shuffle(jobs)
    return jobs


def build_requests(url: str, jobs: list[Job], product_id: int, tokens: dict[str, str]) -> list[httpx.Request]:
    """Every purchase-shaped request of the plan to ``url`` (the orders or the no-op route),
    built before the clock starts (``[shot.index]``)."""
    bodies = {q: msgspec.json.encode({"product_id": product_id, "quantity": q}) for q in {s.quantity for j in jobs for s in j.shots}}
    requests: list[httpx.Request] = [None] * sum(len(job.shots) for job in jobs)  # type: ignore[list-item]
    for job in jobs:
        for shot in job.shots:
            headers = {"Authorization": tokens[shot.user], "Content-Type": "application/json"}
            if shot.key is not None:
                headers["Idempotency-Key"] = shot.key
            requests[shot.index] = httpx.Request("POST", url, content=bodies[shot.quantity], headers=headers)
    return requests


class _Answer(msgspec.Struct):
    """The fields read from a 202 body, a notification's 200 body or a problem body."""

    code: str | None = None
    result: str | None = None
    order_no: str | None = None
    request_id: str | None = None


_decode_answer = msgspec.json.Decoder(_Answer).decode


def _outcome(status: int, content: bytes, latency: float) -> Outcome:
    try:
        answer = _decode_answer(content)
    except msgspec.DecodeError:
        answer = _Answer()
    code = ACCEPTED if status == 202 else answer.result or answer.code or f"http_{status}"
    return Outcome(status, code, answer.order_no, answer.request_id, latency)


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
    uses client ``i // CLIENT_POOL``) and keeps one :class:`Outcome` per request
    (``outcomes[shot.index]``)."""

    def __init__(self, requests: list[httpx.Request]) -> None:
        self._requests = requests
        self.outcomes: list[Outcome] = [None] * len(requests)  # type: ignore[list-item]
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
            outcome = Outcome(0, code, None, None, time.perf_counter() - start)
        else:
            outcome = _outcome(response.status_code, response.content, time.perf_counter() - start)
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
