"""One wave of ``flashsale sale`` sent by its Locust crowd (docs/OPERATIONS.md, "Rehearse a
sale"): the plan written to a file, the Locust master and the local workers started as
subprocesses (gevent cannot share this asyncio process), workers on other hosts awaited, and the
merged trail read back once the master quits (:func:`run_swarm`).

The master runs the shipped locustfile (:mod:`toolkit.sale.locustfile`), which carries the plan
out to the workers and every request's record back. Here the trail is decoded and checked to
hold every request exactly once (:class:`SwarmRun`: ``duplicates``, ``missing``).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
from rich.console import Console

from toolkit.sale.crowd import Trail
from toolkit.sale.errors import SetupError
from toolkit.sale.plan import Answer
from toolkit.sale.processes import Processes
from toolkit.sale.swarm_plan import Sent, SwarmPlan, TrailChunk, WorkerDone

LOCUSTFILE = str(Path(__file__).with_name("locustfile.py"))
SWARM_TIMEOUT = 900.0  # seconds one wave may take, start-up to the last worker's closing
WORKERS_WAIT = 120  # seconds the master waits for every expected worker before it starts without them
POLL = 0.05
STOP_GRACE = 10.0  # seconds the workers get to quit after their master


@dataclass(frozen=True, slots=True)
class CrowdHosts:
    """Where the crowd runs: ``workers`` local worker processes and ``remote`` more expected from
    other hosts; the master (and ``--web``'s UI on ``web_port``) listen on ``bind`` at
    ``master_port``."""

    workers: int
    remote: int = 0
    bind: str = "127.0.0.1"
    master_port: int = 5557
    web: bool = False
    web_port: int = 8089

    def worker_command(self) -> str:
        """What to run on another host for it to join this sale's crowd."""
        return f"flashsale sale-worker --master {self.bind}:{self.master_port}"


@dataclass(slots=True)
class SwarmRun:
    """A wave's merged trail: ``sent`` one answer per errand call (by index), ``trails`` one per
    buyer; ``workers`` each worker's closing; ``duplicates`` and ``missing`` requests of the plan
    found twice or not at all in the trail (both 0 when every request came back once)."""

    label: str
    sent: list[Sent] = field(default_factory=list)
    trails: list[Trail] = field(default_factory=list)
    workers: list[WorkerDone] = field(default_factory=list)
    duplicates: int = 0
    missing: int = 0

    @property
    def requests(self) -> int:
        """Requests in the trail: one per errand call, one per lag a buyer recorded."""
        return len(self.sent) + sum(len(t.lags) for t in self.trails)

    def outcomes(self, calls: int) -> list[Answer]:
        """The answers by errand-call index (``calls`` of them; every one present when
        ``missing`` is 0)."""
        answers: list[Answer] = [None] * calls  # type: ignore[list-item]
        for record in self.sent:
            answers[record.index] = record.answer
        return answers


def _lines(path: Path) -> int:
    return len(path.read_bytes().splitlines()) if path.exists() else 0


def locust_argv(*args: str) -> list[str]:
    """``locust -f <the shipped locustfile> ARGS`` with this interpreter."""
    return [sys.executable, "-m", "locust", "-f", LOCUSTFILE, *args]


def _master_argv(plan: SwarmPlan, hosts: CrowdHosts, directory: Path) -> list[str]:
    counts = plan.user_counts()
    users = str(sum(counts.values()))
    argv = locust_argv(
        "--master",
        "--master-bind-host",
        hosts.bind,
        "--master-bind-port",
        str(hosts.master_port),
        "--expect-workers",
        str(hosts.workers + hosts.remote),
        "--expect-workers-max-wait",
        str(WORKERS_WAIT),
        "--host",
        plan.host,
        "--users",
        users,
        "--spawn-rate",
        users,
        "--exit-code-on-error",
        "0",
        "--sale-plan",
        str(directory / "plan.json"),
        "--sale-out",
        str(directory),
    )
    view = ["--autostart", "--web-host", hosts.bind, "--web-port", str(hosts.web_port)] if hosts.web else []
    return [*argv, *(view or ["--headless", "--only-summary"]), *counts]


def read_trail(directory: Path, label: str, calls: int) -> SwarmRun:
    """The merged trail the master wrote to ``directory`` (``calls`` errand calls planned)."""
    run = SwarmRun(label)
    data = (directory / "trail.msgpack").read_bytes() if (directory / "trail.msgpack").exists() else b""
    offset = 0
    while offset < len(data):
        size = int.from_bytes(data[offset : offset + 8], "big")
        chunk = msgspec.msgpack.decode(data[offset + 8 : offset + 8 + size], type=TrailChunk)
        run.sent += chunk.sent
        run.trails += chunk.trails
        offset += 8 + size
    done = directory / "done.jsonl"
    lines = done.read_bytes().splitlines() if done.exists() else []
    run.workers = [msgspec.json.decode(line, type=WorkerDone) for line in lines]
    seen = Counter(record.index for record in run.sent)
    buyers = Counter(trail.buyer.user for trail in run.trails)
    run.duplicates = sum(n - 1 for n in seen.values()) + sum(n - 1 for n in buyers.values())
    run.missing = sum(1 for index in range(calls) if index not in seen)
    # every request a worker sent is in its trail: the workers' own counts against the records
    run.missing += max(0, sum(w.requests for w in run.workers) - run.requests)
    run.duplicates += max(0, run.requests - sum(w.requests for w in run.workers))
    return run


async def run_swarm(
    plan: SwarmPlan,
    hosts: CrowdHosts,
    processes: Processes,
    console: Console,
    opening: Callable[[], Awaitable[float]] | None = None,
    buyers: int = 0,
) -> SwarmRun:
    """Send ``plan`` with the Locust crowd and return the merged trail. A crowd plan needs
    ``opening``: called once every user is spawned, it puts the product on sale and returns the
    opening (epoch seconds); ``buyers`` of the crowd must all come back.

    Raises:
        SetupError: a Locust process failed, a worker never closed, or the wave outlasted
            :data:`SWARM_TIMEOUT`.
    """
    directory = processes.log_dir / f"swarm-{plan.label}"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "plan.json").write_bytes(msgspec.json.encode(plan))
    master = f"locust-{plan.label}"
    names = [master, *(f"{master}-worker-{n}" for n in range(1, hosts.workers + 1))]
    await processes.start_argv(master, _master_argv(plan, hosts, directory))
    worker = locust_argv("--worker", "--master-host", hosts.bind, "--master-port", str(hosts.master_port))
    for name in names[1:]:
        await processes.start_argv(name, worker)
    started, ended = time.time(), False
    try:
        with console.status(f"{plan.label}: Locust master and {hosts.workers} local workers starting") as status:
            opened = False
            while processes.returncode(master) is None and not (directory / "failed").exists():
                if failed := [n for n in names[1:] if processes.returncode(n) not in (None, 0)]:
                    raise SetupError(f"{', '.join(failed)} failed (see its log)")
                if time.time() - started > SWARM_TIMEOUT:
                    raise SetupError(f"the {plan.label} wave did not end within {SWARM_TIMEOUT:.0f}s")
                if opening is not None and not opened and (directory / "spawned").exists():
                    when = await opening()
                    (directory / "opening.tmp").write_text(repr(when))
                    (directory / "opening.tmp").rename(directory / "opening")
                    opened = True
                closed = _lines(directory / "done.jsonl")
                seconds = time.time() - started
                status.update(f"{plan.label}: Locust crowd at work, {seconds:.0f}s, {closed} workers done")
                await asyncio.sleep(POLL)
        ended = True
    finally:
        codes = await processes.finish(names, grace=STOP_GRACE if ended else 0.0)
    if (directory / "failed").exists():
        raise SetupError(f"the Locust master of the {plan.label} wave failed: {(directory / 'failed').read_text()}")
    if codes[master] != 0:
        raise SetupError(f"the Locust master of the {plan.label} wave exited {codes[master]} (see its log)")
    calls = sum(len(errand.calls) for errand in plan.errands)
    run = read_trail(directory, plan.label, calls)
    if buyers and len(run.trails) != buyers:
        run.missing += buyers - len(run.trails)
    return run
