"""The ``flashsale bench`` report as rich tables (``--json`` prints the same dict as JSON).

Throughput: rate (successes per second), ratio to the row's reference, latency p50/p99 (ms; per
transaction for the raw writers), answers that were not the expected status. CPU, in cores over
the measured window: client = wrk (this process for the raw writers), server = the server's
processes (the consumer for its row, this process for the reserve and publish rows), consumers
= the consumer processes of the pipeline rows, the three stores (their whole processes: other users'
queries included), others = every other process on the machine, and the machine's busy share
(all CPUs, this run's processes included); per server CPU-s = successes per CPU second of the
server (the consumer for its row) and its ratio to the reference's: the cost per request, steadier
than the rate when other jobs take CPU away. The pipeline table gives the pipeline rows and the
floor (the hops alone) in CPU-milliseconds per durable order, by process, ``machine`` being every
CPU of the box (the load client and other jobs included) and ``service`` the API, the consumers
and the stores.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from toolkit.bench import profile
from toolkit.bench.buyers import BUYERS, REQUESTS_PER_BUYER
from toolkit.bench.context import Options
from toolkit.bench.procstat import MachineInfo
from toolkit.bench.profile import ProfileSummary
from toolkit.bench.rows import DESCRIPTIONS, DRAIN_ROWS, PIPELINE_GROUPS, Row, Verdict


@dataclass(frozen=True, slots=True)
class Report:
    """One run: its id and start (ISO 8601, UTC), the machine, the options, the measured rows
    (ratios filled), the targets' verdicts, the profile summaries by row (``--profile``) and the
    directory of the subprocess logs when they were kept (something unexpected happened)."""

    run_id: str
    started_at: str
    machine: MachineInfo
    options: Options
    rows: list[Row]
    targets: list[Verdict]
    accept_ceiling: float | None
    profiles: dict[str, ProfileSummary]
    logs: str | None

    def as_json(self) -> dict[str, object]:
        """The report as plain JSON values (``--json``): dataclasses as objects, paths as strings."""
        options = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self.options).items()}
        return {
            "run_id": self.run_id,
            "started_at": self.started_at,
            "machine": self.machine,
            "options": options,
            "rows": [asdict(r) for r in self.rows],
            "targets": self.targets,
            "accept_ceiling": self.accept_ceiling,
            "profiles": self.profiles,
            "logs": self.logs,
        }


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _cores(cpu: dict[str, float], key: str) -> str:
    return "-" if key not in cpu else f"{cpu[key]:.2f}"


def _header(report: Report, console: Console) -> None:
    m = report.machine
    console.print(f"[bold]flashsale bench[/] {report.run_id} at {report.started_at}", soft_wrap=True)
    console.print(
        f"machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB RAM, Linux {m['kernel']}, "
        f"Python {m['python']}, load average at start {' '.join(str(x) for x in m['load_average'])}",
        soft_wrap=True,
    )
    console.print(", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items()), soft_wrap=True)
    o = report.options
    drained = any(o.wants(key) for key, _, _ in DRAIN_ROWS)
    drain = f"backlog {o.backlog} orders drained by {o.consumers} consumers; batch {o.batch}; " if drained else ""
    console.print(
        f"wrk -t{o.threads} -c{o.connections} -d{o.duration:g}s after a 1 s warm-up; granian workers "
        f"{o.workers}; {drain}rounds {o.rounds} (interleaved)" + (f"; rows {', '.join(o.only)}" if o.only else ""),
        soft_wrap=True,
    )
    console.print(
        f"many buyers: every HTTP and pipeline row and round (and its warm-up) with {BUYERS:,} new buyers' "
        f"tokens, each sent {REQUESTS_PER_BUYER} times in a row",
        soft_wrap=True,
    )


def _pipeline(report: Report, console: Console) -> None:
    """The pipeline rows and the floor: CPU-milliseconds per durable order, by process, and the
    service's total against the floor's."""
    rows = [row for row in report.rows if row.cpu_per_order]
    if not rows:
        return
    table = Table(title="pipeline, HTTP to MySQL: CPU-ms per durable order (server = the API)")
    columns = (*PIPELINE_GROUPS, "service", "machine")
    for name in ("row", "orders/s", *columns, "service / floor"):
        table.add_column(name, justify="left" if name == "row" else "right")
    floor = next((row.cpu_per_order.get("service") for row in rows if row.key == "floor"), None)
    for row in rows:
        per = row.cpu_per_order
        service = per.get("service")
        table.add_row(
            row.label,
            "-" if row.key == "floor" else _num(row.rate),
            *("-" if name not in per else f"{per[name] * 1000:.3f}" for name in columns),
            _num(service / floor, 2) if service and floor and row.key != "floor" else "-",
        )
    console.print(table)


def render(report: Report, console: Console) -> None:
    """Print the machine, the rows (throughput, then CPU), the targets and any profile summaries."""
    _header(report, console)
    by_key = {row.key: row for row in report.rows}
    rounds = report.options.rounds
    rates = Table(title="throughput (requests or orders per second; successes only)")
    columns = ["row", "per s", "ratio", "of", "p50 ms", "p99 ms", "unexpected"]
    if rounds > 1:
        columns.insert(2, "rounds min-max")
    for name in columns:
        rates.add_column(name, justify="left" if name in ("row", "of") else "right")
    cpu_table = Table(title="CPU (cores over the measured window)")
    cpu_columns = ("row", "client", "server", "consumers", "redis", "mysql", "rabbitmq", "others", "machine busy")
    for name in (*cpu_columns, "per server CPU-s", "ratio"):
        cpu_table.add_column(name, justify="left" if name == "row" else "right")
    measured = [row for row in report.rows if row.key != "floor"]
    for row in measured:
        ref = by_key.get(row.reference or "")
        unexpected = row.unexpected + row.socket_errors
        cells = [
            row.label,
            _num(row.rate),
            _num(row.ratio, 2),
            "" if ref is None else ref.label,
            _num(row.p50_ms, 2),
            _num(row.p99_ms, 2),
            "0" if not unexpected else f"{unexpected} {row.statuses}",
        ]
        if rounds > 1:
            cells.insert(2, f"{_num(min(row.rounds), 0)}-{_num(max(row.rounds), 0)}")
        rates.add_row(*cells)
        cpu = row.cpu
        ours = ("client", "server", "consumers", "redis", "mysql", "rabbitmq")
        others = cpu.get("machine", 0) * report.machine["cpus_online"] - sum(cpu.get(k, 0) for k in ours)
        cpu_table.add_row(
            row.label,
            *(_cores(cpu, k) for k in ours),
            f"{max(others, 0):.2f}",
            f"{cpu.get('machine', 0):.0%}",
            _num(row.per_server_cpu, 0),
            _num(row.cpu_ratio, 2),
        )
    console.print(rates)
    console.print(cpu_table)
    _pipeline(report, console)
    for row in report.rows:
        buyers = f"{row.buyers:,} distinct buyers, {REQUESTS_PER_BUYER} requests each" if row.buyers else ""
        note = f" ({'; '.join(n for n in (buyers, row.note) if n)})" if buyers or row.note else ""
        console.print(f"  {row.label}: {DESCRIPTIONS.get(row.key, '')}{note}", highlight=False, soft_wrap=True)
    targets = Table(title="performance targets (docs/BENCHMARKS.md; reported, not enforced)")
    targets.add_column("target")
    targets.add_column("measured", justify="right")
    targets.add_column("verdict")
    for t in report.targets:
        verdict = "n/a" if t["pass"] is None else ("[green]PASS[/]" if t["pass"] else "[red]FAIL[/]")
        targets.add_row(t["target"], _num(t["ratio"], 2), verdict)
    console.print(targets)
    if report.accept_ceiling is not None:
        console.print(
            f"accept / product no-op could reach at most {report.accept_ceiling:.2f} on one worker if the accept path "
            "cost a no-op plus the publish hop alone (P / (P + N) from the rows' per server CPU-s)",
            soft_wrap=True,
        )
    if report.logs:
        console.print(f"subprocess logs kept (something unexpected happened): {report.logs}", soft_wrap=True)
    for name, summary in report.profiles.items():
        console.print(profile.render(name, summary), highlight=False, soft_wrap=True)
