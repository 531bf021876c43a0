"""The crowd's buyers at work (:func:`run_crowd`): each buyer of :mod:`service.sale.crowd` is one
task that arrives at its time and then, with the waiting room, joins the product's queue,
follows its ticket and buys with the admission token; without the room it sends purchases
straight at ``POST /orders``, as people and scripts do at a sale without a queue. Every answer
goes into the buyer's :class:`~service.sale.crowd.Trail`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from contextlib import AsyncExitStack

import httpx
import msgspec

from service.sale.crowd import SCRIPT_JOINS, SCRIPT_POLL, Behaviour, Buyer, CrowdRun, Purchase, Told, Trail
from service.sale.load import REQUEST_TIMEOUT, answer_of
from service.sale.plan import ACCEPTED, Answer

ORDERS_PATH = "/api/v1/orders"
FALLBACK_POLL = 1.0
"""Seconds an honest buyer waits when an answer names no interval."""
SNIPE_EVERY = 10
"""A scripted buyer in the queue fires a purchase without an admission every this many polls."""
NOT_IN_QUEUE = "not_in_queue"
"""``GET .../queue/me`` of a buyer without a place (recorded as a ticket in this state)."""
TOO_SOON = "too_many_requests"
"""``GET .../queue/me`` sooner than the last answer said (a ticket in this state, ``poll_after_ms``
its ``Retry-After``)."""
CLOCK_SLACK = 1.0
"""Seconds past the opening after which ``sale_not_active`` means the sale is over, not yet to open."""
DONE = frozenset({"sold_out", "closed"})
"""Ticket states after which a buyer stops."""
GIVE_UP = frozenset({"sold_out", "limit_exceeded", "product_not_found", "sale_not_active"})
"""Purchase answers after which a buyer without the room stops (once the sale is open)."""


class _Ticket(msgspec.Struct):
    state: str = ""
    ticket: str | None = None
    position: int | None = None
    ahead: int | None = None
    units_left: int | None = None
    admission_token: str | None = None
    admission_expires_at: int | None = None
    poll_after_ms: int | None = None


_decode_ticket = msgspec.json.Decoder(_Ticket).decode


class _Client:
    """One buyer's calls on the shared HTTP client, each answer written into ``trail``."""

    def __init__(
        self, http: httpx.AsyncClient, slots: asyncio.Semaphore, product_id: int, authorization: str, trail: Trail
    ) -> None:
        self._http = http
        self._slots = slots
        self._queue = f"/api/v1/products/{product_id}/queue"
        self._product_id = product_id
        self._headers = {"Authorization": authorization}
        self.trail = trail
        self._keys = 0

    async def _ticket(self, method: str, path: str, into: list[Told]) -> Told | None:
        """One queue call; the ticket it answered (None: no ticket, counted in ``errors``; a
        ``Retry-After`` of such an answer is slept here)."""
        try:
            async with self._slots:
                response = await self._http.request(method, path, headers=self._headers)
        except httpx.HTTPError as exc:
            self._error("timeout" if isinstance(exc, httpx.TimeoutException) else "connection_error")
            return None
        if response.status_code != 200:
            try:
                code = msgspec.json.decode(response.content).get("code") or f"http_{response.status_code}"
            except (msgspec.DecodeError, AttributeError):
                code = f"http_{response.status_code}"
            self._error(code)
            if code == NOT_IN_QUEUE:  # no place (an admission lapsed or was used): the buyer may join again
                return Told(time.perf_counter(), NOT_IN_QUEUE, None, None, None, None, None, None, None)
            if code == TOO_SOON:  # asked sooner than told: wait_of decides how long this buyer waits
                retry_ms = int(response.headers.get("Retry-After") or FALLBACK_POLL) * 1000
                return Told(time.perf_counter(), TOO_SOON, None, None, None, None, None, None, retry_ms)
            await asyncio.sleep(float(response.headers.get("Retry-After") or FALLBACK_POLL))
            return None
        body = _decode_ticket(response.content)
        told = Told(
            time.perf_counter(),
            body.state,
            body.ticket,
            body.position,
            body.ahead,
            body.units_left,
            body.admission_token,
            body.admission_expires_at,
            body.poll_after_ms,
        )
        into.append(told)
        return told

    def _error(self, code: str) -> None:
        self.trail.errors[code] = self.trail.errors.get(code, 0) + 1

    async def join(self) -> Told | None:
        return await self._ticket("POST", self._queue, self.trail.joins)

    async def poll(self) -> Told | None:
        return await self._ticket("GET", f"{self._queue}/me", self.trail.polls)

    def next_key(self) -> str:
        """A new Idempotency-Key: one per unit the buyer goes after."""
        self._keys += 1
        return f"{self.trail.buyer.user}-{self._keys}"

    async def buy(self, key: str, admission: str | None) -> Purchase:
        headers = {**self._headers, "Idempotency-Key": key}
        if admission is not None:
            headers["Admission-Token"] = admission
        sent = time.perf_counter()
        body = {"product_id": self._product_id, "quantity": 1}
        try:
            async with self._slots:
                response = await self._http.post(ORDERS_PATH, json=body, headers=headers)
        except httpx.HTTPError as exc:
            code = "timeout" if isinstance(exc, httpx.TimeoutException) else "connection_error"
            answer = Answer(0, code, None, None, time.perf_counter() - sent, time.perf_counter())
        else:
            answer = answer_of(response.status_code, response.content, time.perf_counter() - sent)
        purchase = Purchase(sent, admission, key, 1, answer)
        self.trail.purchases.append(purchase)
        return purchase


def _impatient_gone(client: _Client) -> bool:
    """An impatient buyer past its patience leaves (and says when)."""
    buyer, trail = client.trail.buyer, client.trail
    if buyer.patience is None or time.perf_counter() < trail.arrived + buyer.patience:
        return False
    trail.left = time.perf_counter()
    return True


def _wait_of(told: Told, buyer: Buyer) -> float:
    """How long a buyer waits before its next poll: a person what it was told; a script its own
    interval, except after a ``429``: then it hammers again from a second before the whole-second
    ``Retry-After`` ends (hammering sooner is answered ``429`` again)."""
    if buyer.behaviour is Behaviour.SCRIPTED:
        if told.state == TOO_SOON and told.poll_after_ms:
            return max(told.poll_after_ms / 1000 - 1.0, SCRIPT_POLL)
        return SCRIPT_POLL
    return told.poll_after_ms / 1000 if told.poll_after_ms else FALLBACK_POLL


async def _joined(client: _Client, background: set[asyncio.Task[object]]) -> Told | None:
    """Join: a script joins :data:`SCRIPT_JOINS` times and fires a purchase without an admission,
    all at once, and goes on with the first ticket answered (one ticket for all: the invariants
    check it); the other calls finish in ``background``."""
    if client.trail.buyer.behaviour is not Behaviour.SCRIPTED:
        return await client.join()
    joins: list[asyncio.Task[object]] = [asyncio.create_task(client.join()) for _ in range(SCRIPT_JOINS)]
    background.update(joins)
    background.add(asyncio.create_task(client.buy(client.next_key(), None)))
    for answered in asyncio.as_completed(joins):
        told = await answered
        if isinstance(told, Told):
            return told
    return None


async def in_the_room(client: _Client) -> None:
    """Join, follow the ticket, buy with the admission until the buyer has its unit, is told
    ``sold_out``/``closed``, or (impatient) leaves."""
    background: set[asyncio.Task[object]] = set()
    try:
        await _follow(client, await _joined(client, background))
    except BaseException:  # stopped at the deadline: so are its calls still in flight
        for task in background:
            task.cancel()
        raise
    finally:
        await asyncio.gather(*background, return_exceptions=True)


async def _follow(client: _Client, told: Told | None) -> None:
    """The ticket from ``told`` on (see :func:`in_the_room`)."""
    buyer = client.trail.buyer
    polls, spent = 0, set()
    while True:
        if told is not None and told.state == NOT_IN_QUEUE:  # back in line
            if _impatient_gone(client):
                return
            told = await client.join()
            continue
        if told is None or told.state not in ("admitted", *DONE) or told.admission_token in spent:
            if _impatient_gone(client):
                return
            polls += 1
            if buyer.behaviour is Behaviour.SCRIPTED and polls % SNIPE_EVERY == 0:
                if (await client.buy(client.next_key(), None)).answer.code == ACCEPTED:  # expected: 428
                    return
            await asyncio.sleep(FALLBACK_POLL if told is None else _wait_of(told, buyer))
            told = await client.poll()
            continue
        if told.state in DONE:
            return
        if _impatient_gone(client):
            return  # walked away from its turn: the token lapses
        assert told.admission_token is not None
        purchase = await client.buy(client.next_key(), told.admission_token)
        spent.add(told.admission_token)
        if purchase.answer.code == ACCEPTED:
            if buyer.behaviour is Behaviour.SCRIPTED:  # the spent admission again, for a second unit
                await client.buy(client.next_key(), told.admission_token)
            return
        if purchase.answer.code in ("sold_out", "limit_exceeded", "sale_not_active"):
            return
        told = await client.poll()


async def without_room(client: _Client, opened: float) -> None:
    """Straight at ``POST /orders``: a person who came early presses the button its reaction time
    after the opening and retries only what says to retry; a script fires from its arrival every
    :data:`SCRIPT_POLL` seconds until it has its unit or is told ``sold_out``."""
    buyer = client.trail.buyer
    scripted = buyer.behaviour is Behaviour.SCRIPTED
    if not scripted:
        await _sleep_until(max(time.perf_counter(), opened + buyer.reaction))
    key = client.next_key()
    while True:
        answer = (await client.buy(key, None)).answer
        if answer.code == ACCEPTED:
            return
        open_now = time.perf_counter() >= opened + CLOCK_SLACK
        if answer.code in GIVE_UP and (open_now or answer.code != "sale_not_active"):
            return
        if _impatient_gone(client):
            return
        if not scripted and answer.status not in (0, 409, 429, 503):
            return  # a person stops at an error it cannot act on
        await asyncio.sleep(SCRIPT_POLL if scripted else FALLBACK_POLL)


async def _sleep_until(moment: float) -> None:
    await asyncio.sleep(max(0.0, moment - time.perf_counter()))


async def run_crowd(
    url: str,
    product_id: int,
    crowd: list[Buyer],
    tokens: dict[str, str],
    *,
    stock: int,
    room: bool,
    opened: float,
    token_seconds: float,
    connections: int,
    deadline: float,
    trust_env: bool,
) -> CrowdRun:
    """Every buyer of ``crowd`` at once (``stock`` units on sale), each arriving at ``opened + buyer.arrival``
    (``time.perf_counter()``), over at most ``connections`` connections; buyers still busy
    ``deadline`` seconds after the opening are stopped and counted."""
    trails = [Trail(buyer) for buyer in crowd]
    # Requests wait for a connection here, not in httpcore's pool, which scans every waiting
    # request each time it assigns one: with 20,000 buyers that scan was the client's whole CPU.
    slots = asyncio.Semaphore(connections)
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(
            httpx.AsyncClient(
                base_url=url, limits=limits, timeout=httpx.Timeout(REQUEST_TIMEOUT, pool=None), trust_env=trust_env
            )
        )

        async def one(trail: Trail) -> None:
            await _sleep_until(opened + trail.buyer.arrival)
            trail.arrived = time.perf_counter()
            client = _Client(http, slots, product_id, tokens[trail.buyer.user], trail)
            await (in_the_room(client) if room else without_room(client, opened))

        started = time.perf_counter()
        tasks = [asyncio.create_task(one(trail)) for trail in trails]
        _, busy = await asyncio.wait(tasks, timeout=max(0.0, opened + deadline - time.perf_counter()))
        for task in busy:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*busy, return_exceptions=True)
        for task in tasks:
            if not task.cancelled() and (exc := task.exception()) is not None:
                raise exc
    seconds = time.perf_counter() - started
    offset = time.time() - time.perf_counter()
    return CrowdRun(room, opened, token_seconds, offset, stock, trails, seconds, len(busy))
