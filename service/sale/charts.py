"""``flashsale sale --report DIR``: the sale's report as one self-contained HTML page with charts.

Writes ``DIR/report.html`` (every chart embedded as a PNG data URI, no external asset) and the
charts beside it as PNG files (``timeline.png``, ``latency.png``, ``outcomes.png``):

- timeline: answers per second of each wave (the no-op ceiling, the purchase load, and with
  ``--pay-share`` the payments and the resale) on one time axis, each phase shaded where it ran
  (drain included), and below it the order queue's ready messages and MySQL's order rows from
  the first wave until the queue drained;
- latency: the distribution of the purchase wave's latencies (the no-op wave's beside it), p50,
  p95 and p99 marked;
- outcomes: the purchase wave's answers by code.

Then the invariant table and the report's numbers. matplotlib draws off screen (Agg); only the
sale's process imports it, after the sale is over. It is an optional extra (``flashsale[charts]``,
which ``make sale`` and the test extra install): without it the page is written without charts,
and :data:`CHARTS_SKIPPED` says why in one line.
"""

from __future__ import annotations

import base64
import html
import importlib.util
import math
from collections import Counter
from pathlib import Path
from typing import Any

from service.sale.facts import Measured
from service.sale.invariants import INVARIANT_TITLES
from service.sale.plan import Wave

_PHASE_COLOURS = {
    "no-op": "#9e9e9e",
    "purchase": "#1f77b4",
    "drain": "#ff7f0e",
    "payments": "#2ca02c",
    "resale": "#9467bd",
}


CHARTS_SKIPPED = (
    "charts skipped: matplotlib is not installed (pip install 'flashsale[charts]', or make sale in a checkout)"
)


def charts_available() -> bool:
    """True when matplotlib can be imported (the ``charts`` extra is installed)."""
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except ImportError:  # a parent package that does not import
        return False


def _waves(measured: Measured) -> dict[str, Wave]:
    waves = {"no-op": measured.noop, "purchase": measured.purchase}
    if measured.lifecycle is not None:
        waves |= {"payments": measured.lifecycle.payments, "resale": measured.lifecycle.resale}
    return {name: wave for name, wave in waves.items() if wave is not None and wave.outcomes}


def _span(wave: Wave) -> tuple[float, float]:
    """From the first request sent to the last answer (``time.perf_counter()`` seconds)."""
    return min(a.finished - a.latency for a in wave.outcomes), max(a.finished for a in wave.outcomes)


def _percentile(ordered: list[float], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


def _timeline(measured: Measured, path: Path) -> None:
    import matplotlib.pyplot as plt

    waves = _waves(measured)
    spans = {name: _span(wave) for name, wave in waves.items()}
    drain = measured.drain_timeline
    if drain and measured.drain_seconds is not None:
        spans["drain"] = (spans["purchase"][1], spans["purchase"][1] + measured.drain_seconds)
    origin = min(start for start, _ in spans.values())
    figure, (rate, queue) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True, height_ratios=(3, 2))
    for name, wave in waves.items():
        start, end = spans[name]
        width = max(0.05, (end - start) / 60)  # about 60 points per wave
        bins = Counter(int((answer.finished - start) / width) for answer in wave.outcomes)
        xs = [start - origin + (index + 0.5) * width for index in range(max(bins) + 1)]
        rate.plot(xs, [bins.get(index, 0) / width for index in range(len(xs))], label=name, color=_PHASE_COLOURS[name])
    for axes in (rate, queue):
        for name, (start, end) in spans.items():
            axes.axvspan(start - origin, end - origin, color=_PHASE_COLOURS[name], alpha=0.08)
    for name, (start, _) in spans.items():
        rate.annotate(name, (start - origin, 1.0), xycoords=("data", "axes fraction"), va="top", fontsize=8)
    rate.set_ylabel("answers / s")
    rate.set_title("throughput by phase")
    rate.legend(loc="upper right")
    if drain:
        xs = [at - origin for at, _, _ in drain]
        queue.plot(xs, [ready for _, _, ready in drain], color=_PHASE_COLOURS["drain"], label="messages ready")
        queue.set_ylim(0, max(1, *(ready for _, _, ready in drain)) * 1.1)
        rows = queue.twinx()
        rows.plot(xs, [count for _, count, _ in drain], color="#333333", linestyle="--", label="order rows")
        rows.set_ylabel("order rows in MySQL")
        rows.legend(loc="center right")
        queue.legend(loc="upper right")
    queue.set_ylabel("order queue")
    queue.set_xlabel("seconds since the first request")
    queue.set_title("order queue: messages ready and order rows written")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _marks(measured: Measured) -> dict[str, float]:
    """p50, p95 and p99 of the purchase wave's latencies, in ms."""
    latencies = sorted(answer.latency * 1000 for answer in measured.purchase.outcomes)
    return {f"p{round(q * 100)}": _percentile(latencies, q) for q in (0.5, 0.95, 0.99)}


def _latency(measured: Measured, path: Path) -> None:
    import matplotlib.pyplot as plt

    latencies = sorted(answer.latency * 1000 for answer in measured.purchase.outcomes)
    marks = _marks(measured)
    figure, axes = plt.subplots(figsize=(10, 4))
    low, high = max(min(latencies), 0.01), max(latencies)
    edges = [low * (high / low) ** (i / 60) for i in range(61)] if high > low else 30
    if measured.noop is not None and measured.noop.outcomes:
        noop = [answer.latency * 1000 for answer in measured.noop.outcomes]
        axes.hist(noop, bins=edges, alpha=0.4, color=_PHASE_COLOURS["no-op"], label="no-op")
    axes.hist(latencies, bins=edges, alpha=0.7, color=_PHASE_COLOURS["purchase"], label="purchase")
    for (name, value), style in zip(marks.items(), (":", "--", "-"), strict=True):
        axes.axvline(value, color="#d62728", linestyle=style, label=f"{name} {value:.1f} ms")
    if high > low:
        axes.set_xscale("log")
    axes.set_xlabel("latency (ms)")
    axes.set_ylabel("requests")
    axes.set_title("purchase latency")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _outcomes(measured: Measured, path: Path) -> None:
    import matplotlib.pyplot as plt

    counts = Counter(answer.code for answer in measured.purchase.outcomes).most_common()
    figure, axes = plt.subplots(figsize=(10, 0.5 * len(counts) + 1.5))
    bars = axes.barh([code for code, _ in counts][::-1], [n for _, n in counts][::-1], color=_PHASE_COLOURS["purchase"])
    axes.bar_label(bars, padding=3)
    axes.set_xlabel("answers")
    axes.set_title("purchase answers by code")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _table(rows: list[tuple[Any, ...]], header: tuple[str, ...]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape('-' if v is None else str(v))}</td>" for v in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _invariants(invariants: dict[str, dict[str, Any]]) -> str:
    rows = []
    for name, check in invariants.items():
        numbers = "; ".join(f"{key.replace('_', ' ')}: {value}" for key, value in check.items() if key != "ok")
        rows.append(
            f'<tr class="{"pass" if check["ok"] else "fail"}"><td>{html.escape(INVARIANT_TITLES[name])}</td>'
            f"<td>{'PASS' if check['ok'] else 'FAIL'}</td><td>{html.escape(numbers)}</td></tr>"
        )
    return (
        '<table id="invariants"><thead><tr><th>invariant</th><th>result</th><th>numbers</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _section(title: str, values: dict[str, Any] | None) -> str:
    if not values:
        return ""
    rows = [(key.replace("_", " "), value) for key, value in values.items() if not isinstance(value, dict | list)]
    return f"<h2>{html.escape(title)}</h2>" + _table(rows, ("", "value"))


_STYLE = """
body { font-family: sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
tr.pass td:nth-child(2) { color: #1a7f37; font-weight: bold; }
tr.fail td:nth-child(2) { color: #cf222e; font-weight: bold; }
img { max-width: 100%; }
"""


def _charts(directory: Path, measured: Measured) -> str:
    """Draw the PNG charts into ``directory``; their HTML, each embedded as a data URI."""
    import matplotlib

    matplotlib.use("Agg")
    charts = {name: directory / f"{name}.png" for name in ("timeline", "latency", "outcomes")}
    _timeline(measured, charts["timeline"])
    _latency(measured, charts["latency"])
    _outcomes(measured, charts["outcomes"])
    return "".join(
        f'<h2>{name}</h2><img id="{name}" alt="{name}" src="data:image/png;base64,'
        f'{base64.b64encode(path.read_bytes()).decode()}">'
        for name, path in charts.items()
    )


def write_report(directory: Path, report: dict[str, Any], measured: Measured) -> Path:
    """Write ``report.html`` and its PNG charts to ``directory`` (created if missing); returns the
    HTML file's path. ``report`` is :func:`service.sale.render.build_report`'s document. Without
    matplotlib (:func:`charts_available`) the page has :data:`CHARTS_SKIPPED` in their place."""
    directory.mkdir(parents=True, exist_ok=True)
    marks = _marks(measured)
    images = _charts(directory, measured) if charts_available() else f"<p>{html.escape(CHARTS_SKIPPED)}</p>"
    run = report["run"]
    verdict = "every invariant holds" if report["ok"] else "an invariant FAILED"
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>flashsale sale {html.escape(run["run_id"])}</title>
<style>{_STYLE}</style></head><body>
<h1>flashsale sale {html.escape(run["run_id"])}: {verdict}</h1>
<p>{run["requests"]} requests from {run["users"]} users for {run["stock"]} units of product {run["product_id"]};
purchase latency p50 {marks["p50"]:.1f} ms, p95 {marks["p95"]:.1f} ms, p99 {marks["p99"]:.1f} ms.</p>
<h2>invariants</h2>{_invariants(report["invariants"])}
{images}
{_section("run", run)}{_section("performance", report["performance"])}{_section("ceiling", report["ceiling"])}
{_section("orders by status", report["orders_by_status"])}{_section("realignment", report["realignment"])}
{_section("lifecycle", report["lifecycle"])}
</body></html>
"""
    target = directory / "report.html"
    target.write_text(page, encoding="utf-8")
    return target
