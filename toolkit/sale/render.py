"""The report of ``flashsale sale`` as one JSON-ready document (:func:`build_report`, printed as
is with ``--json``) and as rich tables (:func:`render`).
"""

from __future__ import annotations

from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

from consumers.realign import print_reports
from service.domain.stock.realign_report import RealignReport
from toolkit.sale.facts import Measured
from toolkit.sale.fairness import fairness
from toolkit.sale.invariants import INVARIANT_TITLES, check_all
from toolkit.sale.report import sections, summarize_run
from toolkit.sale.room_checks import check_room
from toolkit.sale.verdict import crowd_section


def build_report(
    run: dict[str, Any], measured: Measured, wall_seconds: float, exit_codes: dict[str, int]
) -> dict[str, Any]:
    """The whole report as one JSON-ready dict.

    ``run`` describes the sale (``run_id``, ``product_id``, ``stock``, ``per_user_limit``,
    ``requests``, ``users``, ``pay_share``, ...); ``wall_seconds`` from start to report;
    ``exit_codes`` per subprocess. ``responses``, ``replays`` and ``performance`` are the
    purchase wave's; ``ceiling`` the no-op wave's; ``lifecycle``
    None without payments. ``crowd``: what each wave cost the Locust crowd and the server, and
    whether the run was server- or client-bound (:mod:`toolkit.sale.verdict`). ``fairness`` (a
    crowd sale only, else None): the figures of
    :func:`toolkit.sale.fairness.fairness`. The invariants span every wave, with the seven of the
    waiting room when the crowd went through it. ``ok`` is True when every invariant holds;
    ``logs`` is filled in by the caller.
    """
    summaries = summarize_run(measured)
    invariants = check_all(summaries, measured, run["stock"], run["per_user_limit"])
    crowd = measured.crowd
    figures = None if crowd is None else fairness(crowd)
    if crowd is not None and crowd.room:
        invariants |= check_room(crowd, figures)
    return {
        "run": run,
        **sections(measured, summaries, wall_seconds),
        "fairness": figures,
        "crowd": crowd_section(measured.loads),
        "realignment": msgspec.structs.asdict(measured.realignment),
        "processes": exit_codes,
        "invariants": {name: check.as_dict() for name, check in invariants.items()},
        "ok": all(check.ok for check in invariants.values()),
        "logs": None,
    }


def label(name: str) -> str:
    """A report key in words: ``drain_seconds`` -> ``drain seconds``."""
    return name.replace("_", " ")


def human(value: Any) -> str:
    """A report value in words: None ``-``, booleans ``yes`` / ``no``, a dict ``key value, ...``
    and a list ``a, b`` (``none`` when empty), anything else as printed."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ", ".join(f"{label(str(key))} {human(item)}" for key, item in value.items()) or "none"
    if isinstance(value, list | tuple):
        return ", ".join(human(item) for item in value) or "none"
    return str(value)


def _table(title: str, rows: list[tuple[Any, ...]], columns: tuple[str, ...] = ("", "value")) -> Table:
    """A table of ``rows`` (one value per column; None shows as ``-``), values right-aligned."""
    table = Table(title=title, title_justify="left")
    table.add_column(columns[0])
    for column in columns[1:]:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*(human(value) for value in row))
    return table


def _performance_table(perf: dict[str, Any], ceiling: dict[str, Any]) -> Table:
    """The purchase wave next to the no-op ceiling (``-`` where there is no such number)."""
    noop_latency, ratios = ceiling.get("latency_ms", {}), ceiling.get("purchase_over_noop", {})
    latency = [
        (f"latency {point} (ms)", value, noop_latency.get(point), ratios.get(f"latency_{point}"))
        for point, value in perf["latency_ms"].items()
    ]
    return _table(
        "performance",
        [
            ("requests", perf["requests"], ceiling.get("requests"), None),
            ("load phase (s)", perf["load_seconds"], ceiling.get("load_seconds"), None),
            (
                "throughput (requests/s)",
                perf["throughput_rps"],
                ceiling.get("throughput_rps"),
                ratios.get("throughput"),
            ),
            *latency,
            ("token minting (s)", perf["token_seconds"], None, None),
            ("drain time (s)", perf["drain_seconds"], None, None),
            ("wall clock (s)", perf["wall_seconds"], None, None),
        ],
        ("", "purchase", "no-op (ceiling)", "purchase / no-op"),
    )


def rows(section: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``section`` as (label, value) rows; a nested dict's keys are prefixed with its own label
    (an empty one is one row, ``none``)."""
    found: list[tuple[str, Any]] = []
    for key, value in section.items():
        if isinstance(value, dict) and value:
            found += rows(value, f"{prefix}{label(key)}: ")
        else:
            found.append((f"{prefix}{label(key)}", value))
    return found


def _print_crowd(crowd: dict[str, Any], console: Console) -> None:
    """Each wave's cost to the crowd and the server side by side, then the verdict line."""
    waves = crowd["waves"]
    names = list(waves)
    keys = [key for key in waves[names[0]] if key not in ("hosts", "trail")]
    table = Table(title="the crowd (Locust) and the server, per wave", title_justify="left")
    table.add_column("")
    for name in names:
        table.add_column(name, justify="right")
    for key in keys:
        table.add_row(label(key), *(human(waves[name][key]) for name in names))
    table.add_row("hosts", *(human(waves[name]["hosts"]) for name in names))
    console.print(table)
    colour = "yellow" if crowd["bound"] == "client" else "green"
    console.print(f"[bold {colour}]{crowd['main_wave']} wave: {crowd['line']}[/]", soft_wrap=True)


def _invariants_table(invariants: dict[str, dict[str, Any]]) -> Table:
    table = Table(title="invariants", title_justify="left", show_lines=True)
    table.add_column("invariant")
    table.add_column("result", justify="center")
    table.add_column("numbers")
    for name, check in invariants.items():
        result = "[bold green]PASS[/]" if check["ok"] else "[bold red]FAIL[/]"
        numbers = "\n".join(f"{label(key)}: {human(value)}" for key, value in check.items() if key != "ok")
        table.add_row(INVARIANT_TITLES[name], result, numbers)
    return table


def _headline(run: dict[str, Any], ceiling: dict[str, Any]) -> str:
    """One line of what ran; the no-op requests are named only when that wave was sent."""
    noop = "no-op ceiling skipped" if "skipped" in ceiling else f"{run['noop_requests']} no-op requests"
    workers = f"{run['workers']} API workers ({run['publish_mode']} publish)"
    where = workers if run["isolated"] else f"API at {run['url']}"
    lifecycle = f", pay share {run['pay_share']} (window {run['payment_window_seconds']}s)" if run["pay_share"] else ""
    partitions = run.get("partitions", 1)
    buckets = (
        f" in {run['buckets']} stock buckets (a dry bucket's buyer may be answered unavailable)"
        if run.get("buckets", 1) > 1
        else ""
    )
    consumers = f"{run['consumers']} consumers"
    if partitions > 1:
        shares = " / ".join(",".join(map(str, taken)) for taken in run["consumer_partitions"])
        consumers += f" on {partitions} queue partitions (theirs: {shares}; the product's: {run['product_partition']})"
    return (
        f"[bold]flash sale {run['run_id']}[/]: product {run['product_id']}, stock {run['stock']}{buckets}, "
        f"limit {run['per_user_limit']}/user, {run['requests']} requests from {run['users']} users, "
        f"concurrency {run['concurrency']}, {where}, {consumers}, "
        f"{noop}{lifecycle}"
    )


def render(report: dict[str, Any], console: Console) -> None:
    """Print ``report`` (from :func:`build_report`) as rich tables."""
    responses, ceiling = report["responses"], report["ceiling"]
    console.print(_headline(report["run"], ceiling))
    console.print(
        _table(
            "responses",
            [
                ("sent", responses["sent"]),
                ("accepted (202)", responses["accepted_responses"]),
                ("accepted orders (distinct)", responses["accepted_orders"]),
                ("accepted units", responses["accepted_units"]),
                *((f"rejected: {code}", n) for code, n in responses["rejected_by_code"].items()),
            ],
        )
    )
    console.print(_table("replays, limit probes, requests without key", rows(report["replays"])))
    console.print(
        _table(
            "orders in MySQL",
            [(label(k), v) for k, v in sorted(report["orders_by_status"].items())],
            ("status", "rows"),
        )
    )
    console.print(_performance_table(report["performance"], ceiling))
    if "skipped" in ceiling:
        console.print(f"no-op ceiling skipped: {ceiling['skipped']}")
    elif set(ceiling["by_status"]) != {"202"}:
        console.print(f"[yellow]no-op answers by status:[/] {ceiling['by_status']}")
    if report["lifecycle"] is not None:
        console.print(_table("order lifecycle: payments, payment timeout, resale", rows(report["lifecycle"])))
    elif report["run"]["pay_share"]:
        console.print("[yellow]order lifecycle not run: the queue did not drain after the purchase wave[/]")
    if report["fairness"] is not None:
        room = "through the waiting room" if report["fairness"]["waiting_room"] else "without the waiting room"
        console.print(_table(f"fairness ({room})", rows(report["fairness"])))
    if report["crowd"] is not None:
        _print_crowd(report["crowd"], console)
    print_reports([RealignReport(**report["realignment"])], False, console)
    console.print(_invariants_table(report["invariants"]))
    codes = ", ".join(f"{name} {code}" for name, code in report["processes"].items())
    console.print(f"process exit codes: {codes}")
    failed = [name for name, check in report["invariants"].items() if not check["ok"]]
    if failed:
        console.print(f"[bold red]{len(failed)} invariant(s) FAILED:[/] {', '.join(failed)}")
    else:
        console.print("[bold green]all invariants hold[/]")
    if report["logs"]:
        console.print(f"process logs: {report['logs']}")
