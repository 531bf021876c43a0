"""The crowd phase of ``flashsale sale --waiting-room`` / ``--crowd``, in place of the purchase
wave: the crowd of :mod:`toolkit.sale.crowd` is drawn from the seed and sent by the Locust crowd,
one user per buyer (:mod:`toolkit.sale.swarm_users`); once every user is spawned, the product's
sale is set to open :data:`LEAD` + :data:`~toolkit.sale.crowd.PRE_OPEN` seconds later, and every
buyer acts on its own from its arrival. Every purchase it sent becomes one request of a
:class:`~toolkit.sale.plan.Wave`, so the invariants of every sale are checked on it as on the
purchase wave.
"""

from __future__ import annotations

import math
import time

import httpx

from toolkit.sale.crowd import ARRIVAL_SPREAD, PRE_OPEN, CrowdRun, build_crowd
from toolkit.sale.phases import REQUEST_TIMEOUT, bearer_tokens, create_product
from toolkit.sale.plan import Job, Kind, Shot, Wave
from toolkit.sale.swarm_plan import CrowdPlan, SwarmPlan
from toolkit.sale.waves import Sender

LEAD = 1.0
"""Seconds between setting the opening and the first buyer's arrival."""
DEADLINE = 120.0
"""Seconds after the opening (with the room: after the room opens, its opening draw later) by which every
buyer must be done (else counted as timed out)."""
CROWD_CONNECTIONS = 8192
"""Connections a crowd may hold in all (shared out among the workers), unless ``--concurrency``
asks for more: a buyer's request goes out when it is due, as from the buyer's own browser,
instead of queueing in the crowd for one of a few hundred connections (there, polls waited
seconds and the buyers who sent most got ahead). Bounded to stay within both sides' open-file
limits."""


def as_wave(run: CrowdRun) -> Wave:
    """Every purchase the crowd sent, in the order sent, as a wave of one-shot jobs."""
    purchases = sorted(
        ((p, trail.buyer.user) for trail in run.trails for p in trail.purchases), key=lambda item: item[0].sent
    )
    jobs = [Job(Kind.BUY, (Shot(index, user, p.quantity, p.key),)) for index, (p, user) in enumerate(purchases)]
    return Wave(jobs, [p.answer for p, _ in purchases], run.seconds)


async def crowd_wave(
    send: Sender, buyers: int, seed: str, token_seconds: float, depart: tuple[float, int, int, int] = (3.0, 5000, 0, 0)
) -> tuple[Wave, CrowdRun]:
    """Draw ``buyers`` buyers from ``seed``, let them at the sale (through the waiting room when
    the sale has one) over up to :data:`CROWD_CONNECTIONS`; the purchases as a wave, and everything the
    buyers saw. ``token_seconds``: the admissions' lifetime; ``depart``: the room's departure
    bound (the multiple, ``poll_max_ms`` and the grace in ms) and the opening draw (ms)."""
    sale = send.sale
    crowd = build_crowd(buyers, seed)
    tokens = bearer_tokens(sale, {buyer.user for buyer in crowd})
    # The room admits nobody before it opens: the crowd's time counts from then.
    deadline = DEADLINE + (depart[3] / 1000 if sale.waiting_room else 0.0)
    plan = CrowdPlan(sale.product_id, sale.waiting_room, crowd, tokens, deadline)
    where = "through the waiting room" if sale.waiting_room else "straight at POST /orders"
    send.console.print(f"crowd: {buyers} buyers {where}, arrivals until {ARRIVAL_SPREAD:.0f}s after the opening")

    opened: list[float] = []

    async def opening() -> float:
        opens_at = math.ceil(time.time() + LEAD + PRE_OPEN)
        async with httpx.AsyncClient(base_url=sale.url, timeout=REQUEST_TIMEOUT, trust_env=not sale.isolated) as client:
            await create_product(client, sale, opens_at)
        opened.append(float(opens_at))
        return opened[0]

    connections = max(send.connections, CROWD_CONNECTIONS)
    swarm = await send.swarm(SwarmPlan("crowd", sale.url, connections, crowd=plan), opening, buyers)
    trails = sorted(swarm.trails, key=lambda trail: int(trail.buyer.user.rsplit("-", 1)[1]))
    timed_out = sum(1 for trail in trails if trail.timed_out)
    seconds = send.loads[-1].seconds
    run = CrowdRun(sale.waiting_room, opened[0], token_seconds, sale.stock, trails, seconds, timed_out, *depart)
    return as_wave(run), run
