"""The locustfile of ``flashsale sale``, shipped in the package: the crowd's user classes
(:mod:`toolkit.sale.swarm_users`; a buyer's visit is :mod:`toolkit.sale.swarm_visit`, a
worker's share :mod:`toolkit.sale.swarm_crew`) and the messages between the Locust master and
its workers that carry the sale's plan out and every request's trail back (docs/OPERATIONS.md,
"Rehearse a sale").

``flashsale sale`` starts the master (``locust -f <this file> --master --sale-plan FILE
--sale-out DIR``) and its local workers for every wave; a worker on another host is
``locust -f <this file> --worker --master-host HOST`` (or ``flashsale sale-worker``). Then:

1. the master reads the plan (:class:`~toolkit.sale.swarm_plan.SwarmPlan`) and sets each user
   class's ``fixed_count``, so Locust spawns one lane user per lane or one buyer user per buyer;
2. once every worker has spawned its users, the master gives each worker its share
   (:class:`~toolkit.sale.swarm_plan.Assignment`): errands in proportion to its lanes, or exactly
   the buyers its users of each class stand for. A crowd waits for its opening: the master writes
   ``DIR/spawned``, the sale puts the product on sale and writes the opening to ``DIR/opening``;
3. each worker sends its trail to the master in chunks as it goes, then a closing message
   (:class:`~toolkit.sale.swarm_plan.WorkerDone`: requests, CPU seconds, event-loop lag); the
   master appends every chunk to ``DIR/trail.msgpack`` (each prefixed by its length, 8 bytes
   big-endian) and every closing to ``DIR/done.jsonl``;
4. when every worker has closed, the master quits (its workers with it).
"""

from __future__ import annotations

import math
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import gevent
import msgspec
from locust import events
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

from toolkit.sale.swarm_crew import crew
from toolkit.sale.swarm_plan import CROWD_CLASSES, Assignment, Errand, SwarmPlan, TrailChunk, WorkerDone
from toolkit.sale.swarm_users import HonestBuyer, ImpatientBuyer, Payer, PlanBuyer, ScriptedBuyer

__all__ = ["HonestBuyer", "ImpatientBuyer", "Payer", "PlanBuyer", "ScriptedBuyer"]

FLUSH_SECONDS = 0.5  # a worker sends its trail this often
LAG_PROBE_SECONDS = 0.05  # the event-loop lag probe's sleep
OPENING_POLL = 0.02  # seconds between the master's looks for DIR/opening
REPORTS_TIMEOUT = 600.0
"""Seconds the master waits for the workers' reports of their spawned users to add up to the plan
(20,000 buyers on a loaded two-core box took 90 s to spawn; Locust itself waits 1 s)."""


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    parser.add_argument("--sale-plan", default="", help="flashsale sale: the plan of this run (master only)")
    parser.add_argument("--sale-out", default="", help="flashsale sale: directory for the merged trail (master only)")


USAGE = (
    "flashsale's locustfile runs as a worker of a flashsale sale (--worker --master-host HOST --master-port PORT),"
    " or as the master flashsale sale starts for each wave (--master --sale-plan FILE --sale-out DIR)"
)


@events.init.add_listener
def _init(environment: Environment, **_: Any) -> None:
    runner, options = environment.runner, environment.parsed_options
    if isinstance(runner, WorkerRunner):
        runner.register_message("sale_assign", _on_assignment)
    elif isinstance(runner, MasterRunner) and options is not None and options.sale_plan and options.sale_out:
        _Master(environment)
    else:
        sys.exit(USAGE)


def _on_assignment(environment: Environment, msg: Any) -> None:
    runner = environment.runner
    assert isinstance(runner, WorkerRunner)
    data = msg.data
    crew.take(msgspec.msgpack.decode(data["assignment"], type=Assignment), data["users"])
    gevent.spawn(_report, runner)


def _report(runner: WorkerRunner) -> None:
    """Send the trail in chunks while the users work, then the closing message."""
    started_cpu, started = time.process_time(), time.time()
    lag: list[float] = []
    probe = gevent.spawn(_probe_lag, lag)
    while not crew.all_done.wait(FLUSH_SECONDS):
        _flush(runner)
    probe.kill()
    _flush(runner)
    done = WorkerDone(
        runner.worker_index,
        _this_host(runner),
        crew.requests,
        time.process_time() - started_cpu,
        time.time() - started,
        lag,
    )
    runner.send_message("sale_done", {"done": msgspec.msgpack.encode(done)})


def _this_host(runner: WorkerRunner) -> str:
    """``<host name> (<address toward the master>)``: tells apart workers on several hosts, and
    in network namespaces of one host."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((runner.master_host, runner.master_port))
        return f"{socket.gethostname()} ({probe.getsockname()[0]})"


def _flush(runner: WorkerRunner) -> None:
    sent, trails = crew.drain()
    if sent or trails:
        chunk = msgspec.msgpack.encode(TrailChunk(runner.worker_index, sent, trails))
        runner.send_message("sale_trail", {"chunk": chunk})


def _probe_lag(samples: list[float]) -> None:
    """How late this process's event loop wakes a sleeping greenlet: what every request of this
    worker waits before it is sent or its answer read."""
    while True:
        started = time.perf_counter()
        gevent.sleep(LAG_PROBE_SECONDS)
        samples.append(time.perf_counter() - started - LAG_PROBE_SECONDS)


class _Master:
    """The master's part: the plan out, the trail in (see the module docstring)."""

    def __init__(self, environment: Environment) -> None:
        options = environment.parsed_options
        assert options is not None
        self.environment = environment
        self.out = Path(options.sale_out)
        self.plan = msgspec.json.decode(Path(options.sale_plan).read_bytes(), type=SwarmPlan)
        counts = self.plan.user_counts()
        for user_class in environment.user_classes:
            user_class.fixed_count = counts.get(user_class.__name__, 0)
        self.assigning = False
        self.assigned: set[str] = set()
        self.closed: set[int] = set()
        runner = environment.runner
        assert isinstance(runner, MasterRunner)
        self.runner = runner
        runner.register_message("sale_trail", self._on_trail)
        runner.register_message("sale_done", self._on_done)
        environment.events.spawning_complete.add_listener(lambda user_count: gevent.spawn(self._assign_or_fail))

    def _spawned(self) -> dict[str, dict[str, int]]:
        """Users per class of each worker, once their reports add up to the plan's counts.

        Raises:
            TimeoutError: they did not within :data:`REPORTS_TIMEOUT` (a share assigned from a
                partial report would leave buyers out).
        """
        wanted = self.plan.user_counts()
        deadline = time.time() + REPORTS_TIMEOUT
        while True:
            reported = {client.id: dict(client.user_classes_count) for client in self.runner.clients.all}
            totals = {name: sum(counts.get(name, 0) for counts in reported.values()) for name in wanted}
            if totals == wanted:
                return reported
            if time.time() > deadline:
                raise TimeoutError(f"the workers reported {totals} users spawned, the plan has {wanted}")
            gevent.sleep(0.05)

    def _opening(self) -> float:
        """The crowd's opening (epoch seconds), once the sale has written it."""
        (self.out / "spawned").touch()
        opening = self.out / "opening"
        while not opening.exists():
            gevent.sleep(OPENING_POLL)
        return float(opening.read_text())

    def _assign_or_fail(self) -> None:
        """Assign; a failure ends the run, its trace in ``DIR/failed`` for the sale to show."""
        try:
            self._assign()
        except Exception:
            (self.out / "failed").write_text(traceback.format_exc())
            self._quit()

    def _assign(self) -> None:
        if self.assigning:  # Locust fires spawning_complete again when late reports come in
            return
        self.assigning = True
        reported = {
            worker: {name: count for name, count in counts.items() if count}
            for worker, counts in self._spawned().items()
        }
        plan, crowd, counts = self.plan, self.plan.crowd, self.plan.user_counts()
        if crowd is None:
            shares = _share_errands(plan.errands, {w: sum(c.values()) for w, c in reported.items()})
            # a lane is a connection (a duplicate pair two at once): nothing to wait for
            assignments = {w: Assignment(0, errands=shares[w]) for w in reported}
        else:
            opened = self._opening()
            per_worker = math.ceil(self.plan.connections / max(1, len(reported)))
            pending = {name: [b for b in crowd.buyers if CROWD_CLASSES[b.behaviour] == name] for name in counts}
            assignments = {}
            for worker, spawned in reported.items():
                buyers = {}
                for name, count in spawned.items():
                    buyers[name], pending[name] = pending[name][:count], pending[name][count:]
                users = {b.user for mine in buyers.values() for b in mine}
                tokens = {user: crowd.tokens[user] for user in users}
                assignments[worker] = Assignment(
                    per_worker, [], buyers, tokens, opened, crowd.deadline, crowd.room, crowd.product_id
                )
        self.assigned = set(assignments)  # all of them before any worker can close
        for worker, assignment in assignments.items():
            data = {"assignment": msgspec.msgpack.encode(assignment), "users": sum(reported[worker].values())}
            self.runner.send_message("sale_assign", data, client_id=worker)

    def _on_trail(self, environment: Environment, msg: Any) -> None:
        with (self.out / "trail.msgpack").open("ab") as trail:
            chunk = msg.data["chunk"]
            trail.write(len(chunk).to_bytes(8, "big") + chunk)

    def _on_done(self, environment: Environment, msg: Any) -> None:
        done = msgspec.msgpack.decode(msg.data["done"], type=WorkerDone)
        with (self.out / "done.jsonl").open("ab") as closing:
            closing.write(msgspec.json.encode(done) + b"\n")
        self.closed.add(done.worker)
        if len(self.closed) == len(self.assigned):
            gevent.spawn(self._quit)

    def _quit(self) -> None:
        """Quit the run and the workers; with the web UI (``--web``) the UI too."""
        self.runner.quit()
        if self.environment.web_ui is not None:
            self.environment.web_ui.stop()


def _share_errands(errands: list[Errand], lanes: dict[str, int]) -> dict[str, list[Errand]]:
    """``errands`` dealt out to the workers in proportion to their lanes, in plan order (each
    worker's share is a contiguous run of the plan, so its lanes keep the plan's order)."""
    total = sum(lanes.values()) or 1
    shares: dict[str, list[Errand]] = {}
    start = 0
    for number, (worker, count) in enumerate(sorted(lanes.items())):
        end = len(errands) if number == len(lanes) - 1 else start + round(len(errands) * count / total)
        shares[worker] = errands[start:end]
        start = end
    return shares
