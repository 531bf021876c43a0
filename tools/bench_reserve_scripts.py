"""The reserve script on a 3-master Redis Cluster: one hot product with K=1 vs K=3 stock buckets,
in the same run (does spreading a hot product over masters pay?), and the per-master cost of one call (docs/SCALING.md).

Starts a private cluster (:func:`tests.redis_cluster.private_redis_cluster`: three masters on
free ports, stopped at the end), loads four products through the service's own
:class:`~service.adapters.redis.stock.Stock` (realign, as ``product set`` does): an
accept product and a sold-out product (stock 0) for K=1 and for K=3, the K=3 ones picked so that
their buckets' hash tags (``{p:ID}``, ``{p:ID:1}``, ``{p:ID:2}``) sit on three distinct masters
(asserted). Then, round robin so outside load hits every phase alike, ``--processes`` client
processes each keep ``--concurrency`` ``Reservations.reserve`` calls in flight for ``--duration``
seconds (the API's own path: EVALSHA through its command batcher, pipelines split by node), each
buyer calling the bucket ``bucket_of(user, K)`` names.

Measured per phase: accepts/s (``reserved``) or rejects/s (``sold_out``), and from every master's
``INFO commandstats``/``INFO cpu`` before and after: EVALSHA calls, the script's own time per call
(``usec``/``calls``: inside Redis, without I/O), Redis CPU per call (user+sys of the masters that
served the calls: I/O and parsing included, the figure capacity follows from) and the busiest
master's CPU share. On a 2-core box three masters and the Python clients share two cores, so the
client saturates first and K=3/K=1 in calls/s says little; capacity per master (1 s of CPU / CPU
per call) is the figure that carries over to a fleet with a core per master.

    .venv/bin/python tools/bench_reserve_scripts.py [--duration 5] [--rounds 2] [--processes 2]
        [--concurrency 128] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.redis_cluster, run as a file

from redis import Redis
from redis.crc import key_slot

from service.adapters.redis.keys import ProductKeys
from service.model.stock import ReserveRequest

PREFIX = "bench"
PATHS = ("accept", "sold_out")
EXPECTED = {"accept": "reserved", "sold_out": "sold_out"}
USERS_PER_PROCESS = 1000
ACCEPT_STOCK = 10**9
"""Units of an accept product: never runs out, nor does any buyer's limit."""


# -- pure parts (tests/unit/test_bench_reserve_scripts.py) -------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per phase and round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds; each runs every phase once")
    parser.add_argument("--processes", type=int, default=2, help="client processes per phase")
    parser.add_argument("--concurrency", type=int, default=128, help="reserve calls in flight per process")
    parser.add_argument("--buckets", type=int, nargs=2, default=(1, 3), metavar=("K_LOW", "K_HIGH"))
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout (the table on stderr)")
    args = parser.parse_args(argv)
    if args.duration <= 0 or min(args.rounds, args.processes, args.concurrency) < 1:
        parser.error("--duration must be > 0; --rounds, --processes and --concurrency >= 1")
    if not 1 <= args.buckets[0] < args.buckets[1] <= 3:
        parser.error("--buckets: 1 <= K_LOW < K_HIGH <= 3 (three masters)")
    return args


def slot_owner(ranges: Sequence[tuple[int, int, str]]) -> Callable[[int], str]:
    """The master (``host:port``) of a slot, from ``(first, last, node)`` ranges (CLUSTER SLOTS)."""

    def owner(slot: int) -> str:
        for first, last, node in ranges:
            if first <= slot <= last:
                return node
        raise LookupError(f"slot {slot} is not covered")

    return owner


def bucket_masters(owner: Callable[[int], str], product_id: int, buckets: int) -> list[str]:
    """The master of each of the product's ``buckets`` (its keys' hash tag decides the slot)."""
    return [owner(key_slot(ProductKeys(PREFIX, product_id, b).stock.encode())) for b in range(buckets)]


def pick_product(owner: Callable[[int], str], buckets: int, taken: set[int], start: int = 1) -> int:
    """The first product id from ``start``, not in ``taken``, whose ``buckets`` sit on distinct masters."""
    for product_id in itertools.count(start):
        masters = bucket_masters(owner, product_id, buckets)
        if product_id not in taken and len(set(masters)) == buckets:
            return product_id
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class NodeStats:
    """One master's counters at one moment: EVALSHA calls and their µs, CPU seconds (user+sys)."""

    calls: int
    usec: int
    cpu: float

    @staticmethod
    def from_info(commandstats: dict[str, Any], cpu: dict[str, Any]) -> NodeStats:
        evalsha = commandstats.get("cmdstat_evalsha", {})
        return NodeStats(
            int(evalsha.get("calls", 0)),
            int(evalsha.get("usec", 0)),
            float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
        )

    def minus(self, earlier: NodeStats) -> NodeStats:
        return NodeStats(self.calls - earlier.calls, self.usec - earlier.usec, self.cpu - earlier.cpu)


@dataclass
class Phase:
    """One configuration (K, path) in one round: what the clients counted and the masters did."""

    buckets: int
    path: str
    seconds: float
    outcomes: dict[str, int]
    masters: dict[str, NodeStats]
    client_cpu: float = 0.0
    machine_busy: float = 0.0
    """Cores the whole machine used over the phase (/proc/stat), everything else included."""


@dataclass
class Row:
    buckets: int
    path: str
    per_s: float
    rounds_min: float
    rounds_max: float
    unexpected: int
    masters_used: int
    script_us_per_call: float
    redis_cpu_us_per_call: float
    busiest_master_cpu_share: float
    client_cores: float
    machine_cores: float
    capacity_per_master: float
    ratio: float | None = None
    per_master_calls: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)


def summarize(phases: Sequence[Phase]) -> list[Row]:
    """One row per (K, path), rounds pooled: rate = expected outcomes / seconds (mean of rounds,
    min-max beside it); µs per call over every master that ran calls; ``ratio`` = the higher K's
    rate / the lower K's on the same path."""
    rows: list[Row] = []
    for key in dict.fromkeys((p.buckets, p.path) for p in phases):
        mine = [p for p in phases if (p.buckets, p.path) == key]
        rates = [p.outcomes.get(EXPECTED[p.path], 0) / p.seconds for p in mine]
        calls: Counter[str] = Counter()
        outcomes: Counter[str] = Counter()
        usec = cpu = 0.0
        shares = []
        for phase in mine:
            outcomes.update(phase.outcomes)
            used = {node: s for node, s in phase.masters.items() if s.calls > 0}
            calls.update({node: s.calls for node, s in used.items()})
            usec += sum(s.usec for s in used.values())
            cpu += sum(s.cpu for s in used.values())
            shares.append(max((s.cpu / phase.seconds for s in used.values()), default=0.0))
        total = sum(calls.values())
        cpu_us = cpu * 1e6 / total if total else 0.0
        rows.append(
            Row(
                buckets=key[0],
                path=key[1],
                per_s=statistics.fmean(rates),
                rounds_min=min(rates),
                rounds_max=max(rates),
                unexpected=sum(outcomes.values()) - outcomes[EXPECTED[key[1]]],
                masters_used=len(calls),
                script_us_per_call=usec / total if total else 0.0,
                redis_cpu_us_per_call=cpu_us,
                busiest_master_cpu_share=statistics.fmean(shares),
                client_cores=statistics.fmean(p.client_cpu / p.seconds for p in mine),
                machine_cores=statistics.fmean(p.machine_busy for p in mine),
                capacity_per_master=1e6 / cpu_us if cpu_us else 0.0,
                per_master_calls=dict(calls),
                outcomes=dict(outcomes),
            )
        )
    for row in rows:
        low = next((r for r in rows if r.path == row.path and r.buckets < row.buckets), None)
        if low is not None and low.per_s:
            row.ratio = row.per_s / low.per_s
    return rows


def render(rows: Sequence[Row]) -> str:
    head = (
        f"{'K':>2} {'path':<9} {'per s':>9} {'rounds min-max':>16} {'ratio':>6} {'masters':>7} "
        f"{'script us/call':>14} {'redis CPU us/call':>17} {'busiest master':>14} {'client':>6} "
        f"{'machine':>7} {'calls/s per master core':>23}"
    )
    lines = [head]
    for r in rows:
        ratio = f"{r.ratio:.2f}" if r.ratio is not None else "-"
        lines.append(
            f"{r.buckets:>2} {r.path:<9} {r.per_s:>9,.0f} {f'{r.rounds_min:,.0f}-{r.rounds_max:,.0f}':>16} "
            f"{ratio:>6} {r.masters_used:>7} {r.script_us_per_call:>14.1f} {r.redis_cpu_us_per_call:>17.1f} "
            f"{r.busiest_master_cpu_share:>13.0%} {r.client_cores:>6.2f} {r.machine_cores:>7.2f} "
            f"{r.capacity_per_master:>23,.0f}"
        )
    return "\n".join(lines)


# -- the clients (one process each) ------------------------------------------------------------


def _client(url: str, product_id: int, buckets: int, seed: int, args: dict[str, Any], pipe: Any) -> None:
    pipe.send(asyncio.run(_drive(url, product_id, buckets, seed, args["concurrency"], args["duration"], pipe)))


async def _drive(
    url: str, product_id: int, buckets: int, seed: int, concurrency: int, duration: float, pipe: Any
) -> tuple[dict[str, int], float, float]:
    from service.adapters.redis.client import make_redis
    from service.adapters.redis.reservations import new_attempt
    from service.adapters.redis.stores import open_stores
    from service.domain.stock.buckets import bucket_of
    from service.settings import Settings

    settings = Settings()
    settings = settings.model_copy(update={"redis": settings.redis.model_copy(update={"url": url, "cluster": True})})
    client = make_redis(settings)
    store = open_stores(client, PREFIX)
    users = [(user, bucket_of(user, buckets)) for user in (f"c{seed}-{i}" for i in range(USERS_PER_PROCESS))]
    sequence = itertools.count()
    outcomes: Counter[str] = Counter()

    async def one() -> str:
        n = next(sequence)
        user, bucket = users[n % len(users)]
        reply = await store.reservations.reserve(
            ReserveRequest(
                product_id,
                f"r{seed}-{n}",
                user,
                1,
                f"{seed:04d}{n:016d}",
                new_attempt(),
                bucket=bucket,
                buckets=buckets,
            )
        )
        return reply.outcome.value

    await asyncio.gather(*(one() for _ in range(concurrency)))  # warm up: connections to every master
    pipe.send("ready")
    await asyncio.get_running_loop().run_in_executor(None, pipe.recv)  # "go"
    cpu_before, started = time.process_time(), time.monotonic()
    end = started + duration

    async def loop() -> None:
        while time.monotonic() < end:
            outcomes[await one()] += 1

    await asyncio.gather(*(loop() for _ in range(concurrency)))
    elapsed = time.monotonic() - started
    await client.aclose()
    return dict(outcomes), elapsed, time.process_time() - cpu_before


# -- the run -----------------------------------------------------------------------------------


def _machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    fields = [float(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


def _snapshot(nodes: dict[str, Redis]) -> dict[str, NodeStats]:
    return {name: NodeStats.from_info(r.info("commandstats"), r.info("cpu")) for name, r in nodes.items()}


def _phase(
    url: str, nodes: dict[str, Redis], product_id: int, buckets: int, path: str, args: argparse.Namespace, first: int
) -> Phase:
    """One phase: ``args.processes`` clients with seeds from ``first`` (request and user ids of
    their own: a request id used twice would be a replay)."""
    spawn = multiprocessing.get_context("spawn")
    pipes, clients = [], []
    for seed in range(first, first + args.processes):
        ours, theirs = spawn.Pipe()
        client = spawn.Process(target=_client, args=(url, product_id, buckets, seed, vars(args), theirs))
        client.start()
        pipes.append(ours)
        clients.append(client)
    for pipe in pipes:
        if pipe.recv() != "ready":
            raise RuntimeError("a client process failed to start")
    before, (busy0, total0) = _snapshot(nodes), _machine_busy()
    for pipe in pipes:
        pipe.send("go")
    results = [pipe.recv() for pipe in pipes]
    after, (busy1, total1) = _snapshot(nodes), _machine_busy()
    for client in clients:
        client.join(timeout=30)
    outcomes: Counter[str] = Counter()
    for counted, _, _ in results:
        outcomes.update(counted)
    return Phase(
        buckets=buckets,
        path=path,
        seconds=statistics.fmean(elapsed for _, elapsed, _ in results),
        outcomes=dict(outcomes),
        masters={name: after[name].minus(before[name]) for name in nodes},
        client_cpu=sum(cpu for _, _, cpu in results),
        machine_busy=(busy1 - busy0) / (total1 - total0) * (os.cpu_count() or 1),
    )


async def _load(url: str, products: dict[tuple[int, str], int]) -> None:
    """Each product's buckets loaded by a realignment write (stock split evenly, sale open, no end)."""
    from service.adapters.redis.client import make_redis
    from service.adapters.redis.stores import open_stores
    from service.domain.stock.buckets import split
    from service.model.stock import SaleTerms
    from service.settings import Settings

    settings = Settings()
    settings = settings.model_copy(update={"redis": settings.redis.model_copy(update={"url": url, "cluster": True})})
    client = make_redis(settings)
    store = open_stores(client, PREFIX)
    await store.scripts.load()
    for (buckets, path), product_id in products.items():
        stock = ACCEPT_STOCK if path == "accept" else 0
        terms = SaleTerms(0, 0, ACCEPT_STOCK, 100, 0, buckets)
        for bucket, share in enumerate(split(stock, buckets)):
            await store.stock.realign(
                product_id,
                mysql_stock=share,
                inventory_version=1,
                terms=terms,
                resolved=[],
                dry_run=False,
                bucket=bucket,
            )
    await client.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    from tests.redis_cluster import private_redis_cluster

    args = parse_args(argv)
    low, high = args.buckets
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with private_redis_cluster() as url:
        seed = Redis.from_url(url, decode_responses=True)
        ranges = [
            (first, last, f"{node[0]}:{node[1]}") for first, last, node, *_ in seed.execute_command("CLUSTER SLOTS")
        ]
        owner = slot_owner(ranges)
        nodes = {name: Redis.from_url(f"redis://{name}/0", decode_responses=True) for *_, name in ranges}
        products: dict[tuple[int, str], int] = {}
        for path, buckets in itertools.product(PATHS, (low, high)):  # K=1 and K=3 back to back
            products[(buckets, path)] = pick_product(owner, buckets, set(products.values()))
        for (buckets, _), product_id in products.items():
            masters = bucket_masters(owner, product_id, buckets)
            assert len(set(masters)) == buckets, (product_id, masters)
        asyncio.run(_load(url, products))
        phases: list[Phase] = []
        for round_no in range(1, args.rounds + 1):
            for (buckets, path), product_id in products.items():
                print(f"round {round_no}/{args.rounds}: K={buckets} {path} (product {product_id})", file=sys.stderr)
                phases.append(_phase(url, nodes, product_id, buckets, path, args, len(phases) * args.processes))
        for client in (seed, *nodes.values()):
            client.close()
    rows = summarize(phases)
    masters = {f"K={k} {p}": bucket_masters(owner, pid, k) for (k, p), pid in products.items()}
    table = sys.stderr if args.json else sys.stdout  # with --json the table goes to stderr
    print(f"bench_reserve_scripts at {started}: {len(nodes)} masters, {os.cpu_count()} CPUs", file=table)
    print(f"{args.processes} client processes x {args.concurrency} in flight", end="", file=table)
    print(f", {args.duration} s x {args.rounds} rounds", file=table)
    for name, where in masters.items():
        print(f"  {name}: buckets on {', '.join(where)}", file=table)
    print(render(rows), file=table)
    if args.json:
        document = {"started_at": started, "args": vars(args), "products": masters, "rows": [asdict(r) for r in rows]}
        print(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
