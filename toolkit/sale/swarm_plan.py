"""What the sale hands its Locust crowd and what the crowd hands back (docs/OPERATIONS.md,
"Rehearse a sale"): plain msgspec types, shared by the sale's process and the shipped locustfile
(:mod:`toolkit.sale.locustfile`), so a worker on another host decodes exactly what the sale wrote.

A :class:`SwarmPlan` is one Locust run: either errands for lanes (closed-loop users that take the
next errand as soon as they are free: purchases, no-op requests, payers) or a crowd of buyers who
each act on their own clock (the waiting room, ``--crowd``). Every request the crowd sends comes
back once in the merged trail: a :class:`Sent` per errand call, a
:class:`~toolkit.sale.crowd.Trail` per buyer.
"""

from __future__ import annotations

import msgspec

from toolkit.sale.crowd import Buyer, Trail
from toolkit.sale.plan import Answer

LANE_CLASSES = ("PlanBuyer", "Payer")
"""The lane user classes of the locustfile: buyers of the load plan (buys, retries, duplicates,
over-limit attempts, and the no-op wave), and payers (start a payment, then pay at the channel)."""
CROWD_CLASSES = {"honest": "HonestBuyer", "impatient": "ImpatientBuyer", "scripted": "ScriptedBuyer"}
"""The crowd's user class per :class:`~toolkit.sale.crowd.Behaviour`."""


class Call(msgspec.Struct, array_like=True, frozen=True):
    """One request of an errand, built before the clock starts: ``index`` its place in the
    wave's answers; ``url`` absolute (the API, or a payment channel); ``name`` its row in
    Locust's statistics."""

    index: int
    method: str
    url: str
    name: str
    headers: dict[str, str]
    body: bytes | None = None


class Errand(msgspec.Struct, array_like=True, frozen=True):
    """Calls one lane sends in a row, or all at once (``together``: a duplicate pair)."""

    calls: list[Call]
    together: bool = False


class CrowdPlan(msgspec.Struct, frozen=True):
    """A crowd: ``buyers`` each with its ``Authorization`` value in ``tokens``; ``room``: they go
    through the product's waiting room (else straight at ``POST /orders``); ``deadline`` seconds
    after the opening by which every buyer must be done."""

    product_id: int
    room: bool
    buyers: list[Buyer]
    tokens: dict[str, str]
    deadline: float


class SwarmPlan(msgspec.Struct, frozen=True):
    """One Locust run: ``host`` the API's base URL; ``connections`` in all (shared out among the
    workers); ``lanes`` users of class ``lane_class`` working through ``errands``, or ``crowd``."""

    label: str
    host: str
    connections: int
    lanes: int = 0
    lane_class: str = "PlanBuyer"
    errands: list[Errand] = []
    crowd: CrowdPlan | None = None

    def user_counts(self) -> dict[str, int]:
        """Users per locustfile class: one per lane, or one per buyer of each behaviour."""
        if self.crowd is None:
            return {self.lane_class: min(self.lanes, len(self.errands))}
        counts = dict.fromkeys(CROWD_CLASSES.values(), 0)
        for buyer in self.crowd.buyers:
            counts[CROWD_CLASSES[buyer.behaviour]] += 1
        return {name: count for name, count in counts.items() if count}


class Assignment(msgspec.Struct, frozen=True):
    """What the master gives one worker: its ``connections`` (0: as many as its users open, one
    per lane), and its errands, or its buyers (by class) with their tokens, the opening (epoch
    seconds) and the crowd's terms."""

    connections: int
    errands: list[Errand] = []
    buyers: dict[str, list[Buyer]] = {}
    tokens: dict[str, str] = {}
    opened: float = 0.0
    deadline: float = 0.0
    room: bool = False
    product_id: int = 0


class Sent(msgspec.Struct, array_like=True, frozen=True):
    """One errand call's answer (``answer.finished`` epoch seconds); ``due`` when it was due and
    ``sent`` when it got a connection (epoch seconds): ``sent - due`` is the client's lag."""

    index: int
    answer: Answer
    due: float
    sent: float


class TrailChunk(msgspec.Struct, frozen=True):
    """Part of one worker's trail, as it goes to the master."""

    worker: int
    sent: list[Sent] = []
    trails: list[Trail] = []


class WorkerDone(msgspec.Struct, frozen=True):
    """A worker's closing message: requests it sent, the CPU seconds its process used from the
    run's start, its event loop's oversleep samples (seconds), its host."""

    worker: int
    host: str
    requests: int
    cpu_seconds: float
    wall_seconds: float
    loop_lag: list[float]
