"""The sale's waves of errands (no-op, purchase, payers, resale) as its Locust crowd sends them:
the errands of a plan built before the clock starts (:func:`errands_of`), one wave sent and read
back as a :class:`~toolkit.sale.plan.Wave` (:class:`Sender`), and what each wave cost the client
and the server (:class:`~toolkit.sale.facts.WaveLoad`)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import msgspec
from rich.console import Console

from toolkit.sale.errors import SetupError
from toolkit.sale.facts import WaveLoad
from toolkit.sale.isolation import Sale
from toolkit.sale.plan import Answer, Job, Kind, Wave
from toolkit.sale.processes import Processes
from toolkit.sale.swarm import CrowdHosts, SwarmRun, run_swarm
from toolkit.sale.swarm_plan import Call, Errand, SwarmPlan
from toolkit.sale.timeline import percentile

SERVER_PROCESSES = ("api", "consumer-")
"""The processes whose CPU is the server's: the API (its workers are its children) and the consumers."""


def errands_of(url: str, name: str, jobs: list[Job], product_id: int, tokens: dict[str, str]) -> list[Errand]:
    """One errand per job of the plan, purchase-shaped requests to ``url`` (the orders or the
    no-op route; ``name`` its row in Locust's statistics); a duplicate pair goes at once."""
    bodies = {
        q: msgspec.json.encode({"product_id": product_id, "quantity": q})
        for q in {s.quantity for j in jobs for s in j.shots}
    }
    errands = []
    for job in jobs:
        calls = []
        for shot in job.shots:
            headers = {"Authorization": tokens[shot.user], "Content-Type": "application/json"}
            if shot.key is not None:
                headers["Idempotency-Key"] = shot.key
            calls.append(Call(shot.index, "POST", url, name, headers, bodies[shot.quantity]))
        errands.append(Errand(calls, together=job.kind is Kind.DUPLICATE))
    return errands


def wave_load(run: SwarmRun, server_cpu: float | None, opened: float | None = None) -> WaveLoad:
    """What ``run`` cost: its requests and span, the workers' CPU, ``server_cpu`` seconds, the
    lags (a crowd's arrivals included, from ``opened``)."""
    answers = [record.answer for record in run.sent] + [p.answer for trail in run.trails for p in trail.purchases]
    stamps = [(a.finished - a.latency, a.finished) for a in answers]
    stamps += [(told.at, told.at) for trail in run.trails for told in trail.told()]
    seconds = max(end for _, end in stamps) - min(start for start, _ in stamps) if stamps else 0.0
    lags = [record.sent - record.due for record in run.sent] + [lag for t in run.trails for lag in t.lags]
    hosts: Counter[str] = Counter()
    for worker in run.workers:
        hosts[worker.host] += worker.requests
    arrivals = [] if opened is None else [t.arrived - (opened + t.buyer.arrival) for t in run.trails if t.arrived]
    return WaveLoad(
        label=run.label,
        requests=run.requests,
        seconds=seconds,
        workers=len(run.workers),
        hosts=dict(sorted(hosts.items())),
        client_cpu=sum(w.cpu_seconds for w in run.workers),
        client_busy=sum(w.wall_seconds for w in run.workers),
        server_cpu=server_cpu,
        lags=lags + arrivals,
        loop_lags=[lag for w in run.workers for lag in w.loop_lag],
        duplicates=run.duplicates,
        missing=run.missing,
        latency_p99=percentile(sorted(a.latency for a in answers), 0.99) if answers else 0.0,
        load_average=os.getloadavg()[0],
    )


@dataclass
class Sender:
    """Sends the sale's waves with its crowd on ``hosts``; ``loads`` what each wave cost."""

    sale: Sale
    hosts: CrowdHosts
    processes: Processes
    console: Console
    connections: int
    loads: list[WaveLoad] = field(default_factory=list)

    def server_cpu(self) -> float | None:
        """CPU seconds of the server's processes so far (None with ``--url``: not ours to see)."""
        return self.processes.cpu_seconds(*SERVER_PROCESSES) if self.sale.isolated else None

    async def swarm(
        self, plan: SwarmPlan, opening: Callable[[], Awaitable[float]] | None = None, buyers: int = 0
    ) -> SwarmRun:
        """Run ``plan`` (:func:`~toolkit.sale.swarm.run_swarm`); records its :class:`WaveLoad`."""
        opened: list[float] = []

        async def open_sale() -> float:
            assert opening is not None
            opened.append(await opening())
            return opened[0]

        before = self.server_cpu()
        run = await run_swarm(plan, self.hosts, self.processes, self.console, open_sale if opening else None, buyers)
        after = self.server_cpu()
        server = None if before is None or after is None else after - before
        self.loads.append(wave_load(run, server, opened[0] if opened else None))
        return run

    async def errands(
        self, label: str, errands: list[Errand], lane_class: str = "PlanBuyer", connections: int = 0
    ) -> list[Answer]:
        """Send ``errands`` from lanes of ``lane_class`` (one per connection, ``connections`` or
        the sale's); the answers by call index.

        Raises:
            SetupError: an answer is missing from the trail.
        """
        lanes = connections or self.connections
        plan = SwarmPlan(label, self.sale.url, lanes, lanes, lane_class, errands)
        run = await self.swarm(plan)
        calls = sum(len(errand.calls) for errand in errands)
        if run.missing:
            raise SetupError(f"{label}: {run.missing} of {calls} requests missing from the crowd's trail")
        return run.outcomes(calls)

    async def wave(self, label: str, errands: list[Errand], jobs: list[Job]) -> Wave:
        """Send a plan's ``errands`` (one per job of ``jobs``) as one :class:`Wave`."""
        outcomes = await self.errands(label, errands)
        return Wave(jobs, outcomes, self.loads[-1].seconds)
