"""What a change to ``lua/queue.lua`` costs Redis, paired (docs/BENCHMARKS.md, "Waiting room").

One run's figure on a loaded box swings by half, so this runs the phases of
:mod:`tools.bench_waiting_room` against two private ``redis-server``s at once, one with the
``lua/queue.lua`` of another checkout (``--against``, e.g. ``git worktree add /tmp/main main``)
and one with this checkout's, batches of 256 calls alternating between them, so both see the
same load. Per phase and server: the main thread's CPU time per call
(``/proc/PID/task/PID/schedstat``: not inflated by waiting for a core) and the script's time in
Redis (``INFO commandstats``). Scripts are called with raw ``EVALSHA`` in the layout each one
declares: 12 keys and 13 arguments (departures, the poll budget, the departure grace and the
opening draw, here 0 so the room opens with the sale as before), 11, 10 (departures), or the 10
and 9 before them.

    .venv/bin/python tools/bench_waiting_room_paired.py --against /tmp/main [--buyers 50000]
        [--polls 20000] [--factor 1.0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import secrets
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from redis.asyncio import Redis

from toolkit.sale.isolation import free_port

BATCH = 256
STOCK = 1000
TAG = "b:{p:1}"
NAMES = ["stock", "sale", "wr", "wr:line", "wr:waiting", "wr:admitted", "wr:grants", "wr:joined", "wr:pre", "wr:due"]


class Side:
    """One private redis-server with one checkout's script."""

    def __init__(self, tree: Path, factor: str) -> None:
        self.script = (tree / "lua" / "queue.lua").read_text()
        self.departures = "KEYS[12]" in self.script
        self.budget = "ARGV[11]" in self.script
        self.grace_and_draw = "ARGV[13]" in self.script
        self.factor = factor if self.departures else "1.5"
        names = NAMES + (["wr:seen", "wr:closed"] if self.departures else [])
        self.keys = [f"{TAG}:{name}" for name in names]
        self.port = free_port()
        command = ["redis-server", "--port", str(self.port), "--save", "", "--appendonly", "no"]
        self.server = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        self.redis = Redis(port=self.port, decode_responses=True)
        self.sha = ""

    def cpu_ns(self) -> int:
        stat = Path(f"/proc/{self.server.pid}/task/{self.server.pid}/schedstat").read_text()
        return int(stat.split()[0])

    def args(self, user: str, join: bool) -> list[str | int]:
        pace: list[str | int] = [100, 100, 20, 1000] + (["1000.0"] if self.departures else [])
        pace += [1000] if self.budget else []  # the default poll budget (polls/s of a whole line)
        pace += [45_000, 0] if self.grace_and_draw else []  # the default grace; the room opens with the sale
        return [user, "1" if join else "0", self.factor, 120_000, secrets.token_hex(16), *pace]

    async def calls(self, batch: list[tuple[str, bool]]) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            for user, join in batch:
                pipe.evalsha(self.sha, len(self.keys), *self.keys, *self.args(user, join))
            await pipe.execute()


async def _phase(sides: list[Side], calls: list[tuple[str, bool]]) -> list[dict[str, float]]:
    before = [(side.cpu_ns(), await side.redis.info("commandstats")) for side in sides]
    for start in range(0, len(calls), BATCH):
        for side in sides:
            await side.calls(calls[start : start + BATCH])
    figures = []
    for side, (cpu, stats) in zip(sides, before, strict=True):
        after = await side.redis.info("commandstats")
        made = int(after["cmdstat_evalsha"]["calls"]) - int(stats.get("cmdstat_evalsha", {"calls": 0})["calls"])
        usec = int(after["cmdstat_evalsha"]["usec"]) - int(stats.get("cmdstat_evalsha", {"usec": 0})["usec"])
        figures.append({"cpu_us": round((side.cpu_ns() - cpu) / 1000 / made, 1), "usec": round(usec / made, 1)})
    return figures


async def measure(sides: list[Side], buyers: int, polls: int) -> list[dict[str, object]]:
    now_ms = int(time.time() * 1000)
    for side in sides:
        side.sha = await side.redis.script_load(side.script)
        terms = {"starts_ms": now_ms + 3_600_000, "ends_ms": 0, "limit": 1, "price": 100, "token": 0, "buckets": 1}
        await side.redis.hset(side.keys[1], mapping={**terms, "room": 1})
        await side.redis.set(side.keys[0], STOCK)
    users = [f"u{i}" for i in range(buyers)]
    rows: list[dict[str, object]] = [
        {"phase": "pre-queue joins", "figures": await _phase(sides, [(u, True) for u in users])}
    ]
    for side in sides:
        await side.redis.hset(side.keys[1], "starts_ms", now_ms - 1000)
    await _phase(sides, [(users[0], False)])
    looks = [(random.choice(users), False) for _ in range(polls)]
    rows.append({"phase": f"polls, line of {buyers}", "figures": await _phase(sides, looks)})
    for side in sides:
        await side.redis.set(side.keys[0], 0)
        await side.redis.hset(side.keys[2], "held", 0)
    rows.append({"phase": "polls, sold out", "figures": await _phase(sides, looks)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, required=True, help="the other checkout (its lua/queue.lua)")
    parser.add_argument("--buyers", type=int, default=50_000)
    parser.add_argument("--polls", type=int, default=20_000)
    parser.add_argument("--factor", default="1.0")
    args = parser.parse_args()
    sides = [Side(args.against, args.factor), Side(Path(__file__).resolve().parent.parent, args.factor)]
    try:
        time.sleep(0.5)
        rows = asyncio.run(measure(sides, args.buyers, args.polls))
    finally:
        for side in sides:
            side.server.terminate()
            side.server.wait(timeout=10)
    for row in rows:
        other, this = row["figures"]  # type: ignore[misc]
        ratio = this["cpu_us"] / other["cpu_us"]
        print(json.dumps({"phase": row["phase"], "against": other, "this": this, "cpu_ratio": round(ratio, 2)}))


if __name__ == "__main__":
    main()
