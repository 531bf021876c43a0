"""The crowd phase of ``flashsale sale --waiting-room`` / ``--crowd``, in place of the purchase
wave: the crowd of :mod:`service.sale.crowd` is drawn from the seed, the product's sale is set
to open :data:`LEAD` seconds after the first buyers arrive, every buyer acts on its own
(:func:`service.sale.buyers.run_crowd`), and every purchase it sent becomes one request of a
:class:`~service.sale.plan.Wave`, so the invariants of every sale are checked on it as on the
purchase wave.
"""

from __future__ import annotations

import math
import time

import httpx
from rich.console import Console

from service.sale.buyers import run_crowd
from service.sale.crowd import ARRIVAL_SPREAD, PRE_OPEN, CrowdRun, build_crowd
from service.sale.isolation import Sale
from service.sale.load import REQUEST_TIMEOUT
from service.sale.phases import bearer_tokens, create_product
from service.sale.plan import Job, Kind, Shot, Wave

LEAD = 1.0
"""Seconds between setting the opening and the first buyer's arrival."""
DEADLINE = 120.0
"""Seconds after the opening by which every buyer must be done (else counted as timed out)."""


def as_wave(run: CrowdRun) -> Wave:
    """Every purchase the crowd sent, in the order sent, as a wave of one-shot jobs."""
    purchases = sorted(
        ((p, trail.buyer.user) for trail in run.trails for p in trail.purchases), key=lambda item: item[0].sent
    )
    jobs = [Job(Kind.BUY, (Shot(index, user, p.quantity, p.key),)) for index, (p, user) in enumerate(purchases)]
    return Wave(jobs, [p.answer for p, _ in purchases], run.seconds)


async def crowd_wave(
    sale: Sale, console: Console, buyers: int, seed: str, token_seconds: float, connections: int
) -> tuple[Wave, CrowdRun]:
    """Draw ``buyers`` buyers from ``seed``, set the sale to open, let them at it (through the
    waiting room when the sale has one) over at most ``connections`` connections; the purchases
    as a wave, and everything the buyers saw. ``token_seconds``: the admissions' lifetime."""
    crowd = build_crowd(buyers, seed)
    tokens = bearer_tokens(sale, {buyer.user for buyer in crowd})
    opens_at = math.ceil(time.time() + LEAD + PRE_OPEN)
    async with httpx.AsyncClient(base_url=sale.url, timeout=REQUEST_TIMEOUT, trust_env=not sale.isolated) as client:
        await create_product(client, sale, opens_at)
    opened = time.perf_counter() + (opens_at - time.time())
    where = "through the waiting room" if sale.waiting_room else "straight at POST /orders"
    with console.status(
        f"crowd: {buyers} buyers {where}, opening in {opens_at - time.time():.1f}s, arrivals until"
        f" {ARRIVAL_SPREAD:.0f}s after it"
    ):
        run = await run_crowd(
            sale.url,
            sale.product_id,
            crowd,
            tokens,
            stock=sale.stock,
            room=sale.waiting_room,
            opened=opened,
            token_seconds=token_seconds,
            connections=connections,
            deadline=DEADLINE,
            trust_env=not sale.isolated,
        )
    return as_wave(run), run
