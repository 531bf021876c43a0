"""The load plan of ``flashsale sale``: what each simulated buyer sends (:class:`Kind`,
:class:`Shot`, :class:`Job`), the answer to each request (:class:`Answer`), one phase's requests
and answers (:class:`Wave`), and :func:`build_plan`, which deals out a plan.

The bottom of the package: it imports nothing from it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum

ACCEPTED = "accepted"  # the code recorded for a 202


class Kind(StrEnum):
    """What a job of the load plan exercises."""

    BUY = "buy"  # one request, with or without an Idempotency-Key
    RETRY = "retry"  # the same request twice in a row, same key: the second replays the first
    DUPLICATE = "duplicate"  # the same request twice at once, same key: at most one order
    OVER_LIMIT = "over_limit"  # the whole per-user allowance, then one unit more: limit_exceeded
    PAY = "pay"  # a payment channel's signed notification for one order (not a purchase)


@dataclass(frozen=True, slots=True)
class Shot:
    """One request of a plan (a purchase, or a notification for ``user``'s order of ``quantity``).
    ``index`` is its position in the request and answer lists; ``quantity`` in units; ``key`` is
    the Idempotency-Key (None: the server mints the request id, or no purchase)."""

    index: int
    user: str
    quantity: int
    key: str | None


@dataclass(frozen=True, slots=True)
class Job:
    """Requests one buyer sends together (see :class:`Kind`)."""

    kind: Kind
    shots: tuple[Shot, ...]


@dataclass(frozen=True, slots=True)
class Answer:
    """The answer to one request. ``status`` 0 = no HTTP answer (``code`` ``connection_error`` or
    ``timeout``); ``code`` is ``accepted`` for a 202, a payment notification's ``result`` for a 200
    (``paid``, ...), else the problem's ``code`` (``http_<status>`` when the body has none);
    ``latency`` in seconds; ``finished`` when it arrived (epoch seconds)."""

    status: int
    code: str
    order_no: str | None
    request_id: str | None
    latency: float
    finished: float = 0.0


@dataclass(frozen=True, slots=True)
class Wave:
    """One phase of requests (no-op, purchase, payments, resale): ``outcomes[shot.index]`` answers
    each shot of ``jobs``; ``seconds`` from the first request to the last answer."""

    jobs: list[Job]
    outcomes: list[Answer]
    seconds: float


# The load mix: job kind -> weight.
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
        shots: tuple[Shot, ...]
        if kind is Kind.OVER_LIMIT:
            shots = (Shot(index, user, per_user_limit, key), Shot(index + 1, user, 1, f"{key}+1"))
        else:
            quantity = 2 if per_user_limit >= 2 and rng.random() < TWO_UNITS_SHARE else 1
            shots = tuple(Shot(index + i, user, quantity, key) for i in range(1 if kind is Kind.BUY else 2))
        jobs.append(Job(kind, shots))
        index += len(shots)
    rng.shuffle(jobs)
    return jobs
