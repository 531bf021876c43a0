"""The crowd of ``flashsale sale --waiting-room`` (and of ``--crowd``, the same buyers sent
straight at the purchase route): who the buyers are (:class:`Behaviour`, :class:`Buyer`,
:func:`build_crowd`) and what each of them saw (:class:`Trail`, :class:`Told`), plain data.

Buyers arrive at a time of their own, some before the sale opens (the pre-queue) and the rest
spread over :data:`ARRIVAL_SPREAD` seconds after it. ``honest`` buyers join once and poll as
the server's ``poll_after_ms`` says; ``impatient`` ones behave the same but leave after a
patience of their own; ``scripted`` ones join :data:`SCRIPT_JOINS` times at once, poll every
:data:`SCRIPT_POLL` seconds whatever they are told and fire purchases without an admission.
Every buyer wants one unit. The mix is drawn from a seed, so a run with the room and a run
without it can be given the same crowd (``--seed``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from enum import StrEnum

from toolkit.sale.plan import Answer

PRE_OPEN = 3.0
"""Seconds between the first arrivals and the opening of the sale (the pre-queue's window)."""
ARRIVAL_SPREAD = 4.0
"""Seconds after the opening over which the other buyers arrive."""
PRE_QUEUE_SHARE = 0.4
IMPATIENT_SHARE = 0.2
SCRIPTED_SHARE = 0.2
PATIENCE = (1.0, 6.0)
"""An impatient buyer leaves this many seconds (drawn uniformly) after arriving."""
REACTION = (0.2, 1.5)
"""Without the room, a person who came early presses the button this long after the opening."""
NOT_IN_QUEUE = "not_in_queue"
"""``GET .../queue/me`` of a buyer without a place (recorded as a ticket in this state)."""
SCRIPT_JOINS = 8
SCRIPT_POLL = 0.1
"""A script polls ten times as often as the server ever asks (``poll_min_ms``, 1 s by default);
faster only loads the sale's own client, which then delays every buyer's calls alike."""


class Behaviour(StrEnum):
    HONEST = "honest"
    IMPATIENT = "impatient"
    SCRIPTED = "scripted"


@dataclass(frozen=True, slots=True)
class Buyer:
    """One buyer: JWT subject ``user``; ``arrival`` in seconds relative to the opening (negative:
    before it, in the pre-queue); ``patience`` seconds after arriving before an impatient buyer
    leaves (None: stays until told); ``reaction``: seconds
    after the opening a person who arrived early presses the button (used without the room)."""

    user: str
    behaviour: Behaviour
    arrival: float
    patience: float | None
    reaction: float


def build_crowd(buyers: int, seed: str) -> list[Buyer]:
    """``buyers`` buyers (``crowd-<n>``) drawn from ``seed``: :data:`PRE_QUEUE_SHARE` of them
    arrive in the :data:`PRE_OPEN` seconds before the opening, the others over
    :data:`ARRIVAL_SPREAD` seconds after it, whatever their behaviour (so no behaviour arrives
    earlier on average); :data:`SCRIPTED_SHARE` are scripted,
    :data:`IMPATIENT_SHARE` impatient, the rest honest."""
    rng = random.Random(seed)
    scripted = round(buyers * SCRIPTED_SHARE)
    impatient = round(buyers * IMPATIENT_SHARE)
    kinds = [Behaviour.SCRIPTED] * scripted + [Behaviour.IMPATIENT] * impatient
    kinds += [Behaviour.HONEST] * (buyers - len(kinds))
    rng.shuffle(kinds)
    crowd = []
    for number, behaviour in enumerate(kinds):
        early = rng.random() < PRE_QUEUE_SHARE
        arrival = -rng.uniform(0.0, PRE_OPEN) if early else rng.uniform(0.0, ARRIVAL_SPREAD)
        patience = rng.uniform(*PATIENCE) if behaviour is Behaviour.IMPATIENT else None
        crowd.append(Buyer(f"crowd-{number}", behaviour, arrival, patience, rng.uniform(*REACTION)))
    return crowd


@dataclass(frozen=True, slots=True)
class Told:
    """One answer of the queue routes as a buyer saw it: ``at`` (``time.time()``) and the
    ticket's fields (``admission_expires_at`` in epoch ms, ``poll_after_ms`` in ms); ``sent``:
    when the call was sent (``time.time()``, 0 unknown)."""

    at: float
    state: str
    ticket: str | None
    position: int | None
    ahead: int | None
    units_left: int | None
    admission_token: str | None
    admission_expires_at: int | None
    poll_after_ms: int | None
    holds_unit: bool = False
    sent: float = 0.0


@dataclass(frozen=True, slots=True)
class Purchase:
    """One purchase a buyer sent: ``sent`` (``time.time()``), the ``admission`` token it
    carried (None: none), its Idempotency-Key and the answer."""

    sent: float
    admission: str | None
    key: str
    quantity: int
    answer: Answer


@dataclass(slots=True)
class Trail:
    """Everything one buyer did and was told. ``arrived``: when it first acted
    (``time.time()``); ``joins``: answers to its ``POST .../queue`` calls; ``polls``:
    answers to ``GET .../queue/me``; ``left``: when an impatient buyer gave up (None: it did
    not); ``errors``: answers that were neither a ticket nor a purchase answer (by code);
    ``unticketed``: when each queue call answered without a ticket (an error, a ``429``) was
    sent (the room may have seen it: a ``503`` after its script ran); ``lags``: per request,
    seconds from when it was due to when it got a connection;
    ``timed_out``: still busy at the deadline."""

    buyer: Buyer
    arrived: float = 0.0
    joins: list[Told] = field(default_factory=list)
    polls: list[Told] = field(default_factory=list)
    purchases: list[Purchase] = field(default_factory=list)
    left: float | None = None
    errors: dict[str, int] = field(default_factory=dict)
    unticketed: list[float] = field(default_factory=list)
    lags: list[float] = field(default_factory=list)
    timed_out: bool = False

    def told(self) -> list[Told]:
        """Every ticket answer, in the order they arrived."""
        return sorted(self.joins + self.polls, key=lambda told: told.at)


@dataclass(frozen=True, slots=True)
class CrowdRun:
    """The crowd phase: ``room`` whether the product had the waiting room; ``opened`` the
    opening (``time.time()``); ``token_seconds`` the admission tokens' lifetime (to
    date an admission from its expiry); ``trails`` one per buyer; ``seconds`` from the first
    arrival to the last buyer done; ``timed_out`` buyers still busy at the deadline;
    ``stock``: the units on sale; ``depart_after_polls``: the room's departure bound (a waiting
    buyer silent this many times the longest interval it was told, at least ``poll_max_ms``,
    loses its place), plus ``depart_grace_ms``; ``opening_draw_ms``: the room opens that long
    after the sale (who came in before is drawn by lottery). Every time
    is epoch seconds, the server's clock as the buyers' (the hosts of a rehearsal keep their
    clocks in sync)."""

    room: bool
    opened: float
    token_seconds: float
    stock: int
    trails: list[Trail]
    seconds: float
    timed_out: int
    depart_after_polls: float = 3.0
    poll_max_ms: int = 5000
    depart_grace_ms: int = 0
    opening_draw_ms: int = 0
