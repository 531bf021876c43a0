"""Asynchronous, signed, retried notifications to the merchant, with fault knobs.

Each notification is a JSON body signed ``X-Signature: hex(HMAC-SHA256(channel secret, raw
body))`` (the contract of ``POST /api/v1/payments/notify``) and POSTed to the payment's
``notify_url``; any answer but 2xx (or no answer) is retried with backoff (0.2 s doubling to
5 s, ``retries`` attempts), as real channels retry until the merchant says success.

Fault knobs (probabilities 0..1, ``delay`` in seconds): ``drop`` loses a notification for good,
``duplicate`` delivers it twice, ``delay`` waits up to that long first, ``reorder`` holds it back
until after the next one (at most 1 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import random
import secrets
from collections import Counter
from datetime import UTC, datetime
from typing import Annotated, Any

import httpx
import msgspec
from msgspec import Meta

Probability = Annotated[float, Meta(ge=0, le=1)]


class Faults(msgspec.Struct, forbid_unknown_fields=True):
    """What goes wrong with notifications (and refunds: ``fail_refunds`` of them fail)."""

    drop: Probability = 0.0
    duplicate: Probability = 0.0
    delay: Annotated[float, Meta(ge=0, le=60)] = 0.0
    reorder: Probability = 0.0
    fail_refunds: Probability = 0.0


def signature(secret: str, body: bytes) -> str:
    """``hex(HMAC-SHA256(secret, body))`` over the raw body, as the merchant verifies it."""
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class Notifier:
    """Sends notifications in the background; ``stats`` counts ``sent`` (asked), ``delivered``
    (2xx), ``dropped``, ``duplicated``, ``reordered``, ``attempts`` and ``gave_up``."""

    REORDER_HOLD = 1.0

    def __init__(self, secrets_: dict[str, str], client: httpx.AsyncClient, retries: int = 8) -> None:
        self._secrets = secrets_
        self._client = client
        self._retries = retries
        self.faults = Faults()
        self.stats: Counter[str] = Counter()
        self._tasks: set[asyncio.Task[None]] = set()
        self._held: list[asyncio.Event] = []
        self._random = random.Random()

    @property
    def in_flight(self) -> int:
        """Notifications not yet delivered nor given up (held, delayed, or being retried)."""
        return len(self._tasks)

    def chance(self, probability: float) -> bool:
        """True with ``probability`` (a fault knob's draw)."""
        return self._random.random() < probability

    def send(self, url: str, channel: str, note: dict[str, Any]) -> None:
        """Queue ``note`` (the notification's fields) for ``url``, signed with ``channel``'s secret.
        Extra fields a real channel adds (``notify_id``, ``notified_at``) are added here."""
        self.stats["sent"] += 1
        faults = self.faults
        if self.chance(faults.drop):
            self.stats["dropped"] += 1
            return
        body = json.dumps(
            {**note, "notify_id": secrets.token_hex(8), "notified_at": datetime.now(UTC).isoformat()}
        ).encode()
        released, self._held = self._held, []
        hold = asyncio.Event()
        if self.chance(faults.reorder):
            self.stats["reordered"] += 1
            self._held.append(hold)
            asyncio.get_running_loop().call_later(self.REORDER_HOLD, hold.set)
        else:
            hold.set()
        copies = 2 if self.chance(faults.duplicate) else 1
        self.stats["duplicated"] += copies - 1
        delay = self._random.uniform(0, faults.delay)
        for _ in range(copies):
            self._spawn(self._deliver(url, channel, body, delay, hold))
        for event in released:  # held back ones go after this one
            asyncio.get_running_loop().call_later(0.05, event.set)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver(self, url: str, channel: str, body: bytes, delay: float, hold: asyncio.Event) -> None:
        await hold.wait()
        if delay:
            await asyncio.sleep(delay)
        headers = {"Content-Type": "application/json", "X-Signature": signature(self._secrets[channel], body)}
        backoff = 0.2
        for _ in range(self._retries):
            self.stats["attempts"] += 1
            with contextlib.suppress(httpx.HTTPError):
                response = await self._client.post(url, content=body, headers=headers)
                if response.is_success:
                    self.stats["delivered"] += 1
                    return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
        self.stats["gave_up"] += 1

    async def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for notifications in flight, then cancel the rest."""
        for event in self._held:
            event.set()
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
            for task in pending:
                task.cancel()
