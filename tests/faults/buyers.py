"""The fault suite's buyers: the plan of ``flashsale sale`` sent with an Idempotency-Key per
purchase, each retried on a 503, a 429, a 409 ``request_in_progress`` or a lost connection
until its answer is final (:data:`tests.faults.terms.BUYER_PATIENCE`)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

import httpx
import msgspec

from service.api.tokens import issue_token
from service.settings import Settings
from tests.faults import availability, terms
from tests.faults.terms import (
    BUYER_PATIENCE,
    CONCURRENCY,
    LIMIT,
    RETRY_CODES,
    RETRY_STATUSES,
    monotonic,
)
from toolkit.sale.plan import ACCEPTED, Answer, Job, Kind, Shot, build_plan


@dataclass
class Sent:
    """One answer a buyer got (every try, final or not): when, status, code, over which
    connection (:func:`availability.connection_of`)."""

    at: float
    status: int
    code: str
    connection: int = 0


class _Body(msgspec.Struct):
    """The fields read from a 202 or a problem body (``status`` differs in type between them)."""

    code: str | None = None
    order_no: str | None = None
    request_id: str | None = None


class Buyers:
    """Sends the plan's purchases; each one retried with its Idempotency-Key until final."""

    def __init__(self, url: str, product_id: int, settings: Settings) -> None:
        self._url = url
        self._product_id = product_id
        self._secret = settings.auth.jwt_secret
        self._tokens: dict[str, str] = {}
        self.jobs: list[Job] = []
        self.outcomes: list[Answer | None] = []
        self.tries: list[Sent] = []
        self.done = 0
        self.sent = 0  # tries
        self.started = 0  # purchases sent at least once
        self.deadline = float("inf")
        self.accepted_units = 0
        self._paced_from = 0.0
        self._slots = 0

    def token(self, user: str) -> str:
        if user not in self._tokens:
            self._tokens[user] = f"Bearer {issue_token(self._secret, user, ttl_seconds=3600)}"
        return self._tokens[user]

    def plan(self, seed: str) -> list[Job]:
        """The sale's plan, every purchase with an Idempotency-Key (a buyer who retries a 503
        without one could buy twice: that is the buyer's doing, not a fault of the service)."""
        jobs = build_plan(terms.REQUESTS, terms.USERS, LIMIT, random.Random(seed))
        keyed = []
        for job in jobs:
            shots = tuple(
                shot if shot.key else Shot(shot.index, shot.user, shot.quantity, f"nk{shot.index}")
                for shot in job.shots
            )
            keyed.append(Job(job.kind, shots))
        return keyed

    def add(self, jobs: list[Job]) -> list[Job]:
        """Take ``jobs`` (indices from 0) into the record, renumbered after what is there."""
        offset = len(self.outcomes)
        moved = [
            Job(job.kind, tuple(Shot(s.index + offset, s.user, s.quantity, s.key) for s in job.shots)) for job in jobs
        ]
        self.jobs.extend(moved)
        self.outcomes.extend([None] * sum(len(job.shots) for job in jobs))
        return moved

    async def run(self, jobs: list[Job], concurrency: int = CONCURRENCY) -> None:
        """Send ``jobs`` from ``concurrency`` connections, within :data:`tests.faults.terms.LOAD_DEADLINE` seconds."""
        self.deadline = monotonic() + terms.LOAD_DEADLINE
        self._paced_from, self._slots = monotonic(), 0
        pending = iter(self.add(jobs))
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=self._url, limits=limits, timeout=30, trust_env=False) as client:

            async def worker() -> None:
                for job in pending:
                    if monotonic() > self.deadline:
                        for shot in job.shots:
                            self.outcomes[shot.index] = Answer(0, "not_sent", None, None, 0.0, monotonic())
                        continue
                    await self._pace(len(job.shots))
                    if job.kind is Kind.DUPLICATE:
                        await asyncio.gather(*(self._buy(client, shot) for shot in job.shots))
                    else:
                        for shot in job.shots:
                            await self._buy(client, shot)

            await asyncio.gather(*(worker() for _ in range(concurrency)))

    async def _pace(self, purchases: int) -> None:
        """Wait for this job's turn at :data:`tests.faults.terms.PURCHASE_RATE` purchases a second."""
        turn = self._paced_from + self._slots / terms.PURCHASE_RATE
        self._slots += purchases
        if (wait := turn - monotonic()) > 0:
            await asyncio.sleep(wait)

    async def _buy(self, client: httpx.AsyncClient, shot: Shot) -> None:
        body = msgspec.json.encode({"product_id": self._product_id, "quantity": shot.quantity})
        headers = {"Authorization": self.token(shot.user), "Content-Type": "application/json"}
        if shot.key:
            headers["Idempotency-Key"] = shot.key
        began = monotonic()
        self.started += 1
        while True:
            started = monotonic()
            self.sent += 1
            connection = 0
            try:
                response = await client.post("/api/v1/orders", content=body, headers=headers)
            except httpx.HTTPError as exc:
                code = "timeout" if isinstance(exc, httpx.TimeoutException) else "connection_error"
                answer = Answer(0, code, None, None, monotonic() - started, monotonic())
                retry_after = 0.5
            else:
                try:
                    parsed = msgspec.json.decode(response.content, type=_Body)
                except msgspec.DecodeError:
                    parsed = _Body()
                status = response.status_code
                connection = availability.connection_of(response)
                code = ACCEPTED if status == 202 else parsed.code or f"http_{status}"
                answer = Answer(status, code, parsed.order_no, parsed.request_id, monotonic() - started, monotonic())
                retry_after = min(float(response.headers.get("retry-after", "0.5") or 0.5), 1.0)
            self.tries.append(Sent(monotonic(), answer.status, answer.code, connection))
            final = answer.status not in RETRY_STATUSES and answer.code not in RETRY_CODES
            if final or monotonic() - began > BUYER_PATIENCE or monotonic() > self.deadline:
                self.outcomes[shot.index] = answer
                if answer.code == ACCEPTED:
                    self.accepted_units += shot.quantity
                self.done += 1
                return
            await asyncio.sleep(retry_after * random.uniform(0.5, 1.0))
