"""``flashsale sale --report DIR``: the sale's report as one self-contained HTML page with charts.

Writes ``DIR/report.html`` (every chart embedded as a PNG data URI, no external asset) and the
charts beside it as PNG files (``timeline.png``, ``latency.png``, ``outcomes.png``; the series
of the timeline in ``timeline.json``):

- timeline (:func:`timeline_figure`): from the purchase wave to the end of the run, answers and
  accepted orders per second of each wave (purchase, and with ``--pay-share`` the payments and
  the resale), their latency, and the order queue with the order rows written, each phase
  shaded where it ran (drain included); the no-op ceiling is left out (its rate would set the
  scale: the performance table compares it);
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
import dataclasses
import html
import importlib.util
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from toolkit.sale.facts import Measured
from toolkit.sale.invariants import INVARIANT_TITLES
from toolkit.sale.render import human, label, rows
from toolkit.sale.timeline import Series, Timeline, build_timeline, percentile

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

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


def timeline_figure(timeline: Timeline) -> Figure:
    """The timeline chart: requests and accepted orders per second, latency, and the order queue
    with the rows written, one panel each on one time axis (:mod:`toolkit.sale.timeline`); each
    phase shaded and named above the first panel, each legend beside its panel (never over the
    data), each panel scaled by its own series."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, (rate, latency, queue) = plt.subplots(
        3, 1, figsize=(12, 9), sharex=True, height_ratios=(3, 2, 2), layout="constrained"
    )
    _phase_lines(rate, timeline.requests, dotted="accepted/s", scale="purchase")
    rate.set_ylabel("per second")
    rate.set_title("requests answered and orders accepted per second (no-op ceiling: see performance)", pad=16)
    _phase_lines(latency, timeline.latency, dotted="p99", scale="purchase")
    latency.set_ylabel("latency (ms)")
    latency.set_title("purchase latency, p50 and p99 of the answers in each interval")
    queue.step(
        timeline.accepted.xs,
        timeline.accepted.ys,
        where="post",
        color=_PHASE_COLOURS["purchase"],
        label=timeline.accepted.label,
    )
    queue.plot(timeline.rows.xs, timeline.rows.ys, "--", color="#333333", label=timeline.rows.label)
    queue.set_ylim(0, _top([timeline.accepted, timeline.rows]))
    queue.set_ylabel("orders so far")
    ready = queue.twinx()
    quiet = " (0 throughout)" if not any(timeline.ready.ys) else ""
    ready.plot(timeline.ready.xs, timeline.ready.ys, color=_PHASE_COLOURS["drain"], label=timeline.ready.label + quiet)
    ready.set_ylim(0, _top([timeline.ready]))
    ready.yaxis.set_major_locator(MaxNLocator(integer=True))
    ready.set_ylabel("messages ready")
    queue.set_title("orders accepted and written (the gap: in the queue or a consumer's hands), until the end")
    queue.set_xlabel("seconds since the purchase wave's first request")
    queue.set_xlim(0, timeline.end)
    for axes in (rate, latency, queue):
        for name, (start, end) in timeline.phases.items():
            axes.axvspan(start, end, color=_PHASE_COLOURS[name], alpha=0.08)
    for name, (start, _) in timeline.phases.items():
        rate.annotate(name, (start, 1.0), xycoords=("data", "axes fraction"), va="bottom", fontsize=8)
    handles, labels = queue.get_legend_handles_labels()
    more_handles, more_labels = ready.get_legend_handles_labels()
    queue.legend(handles + more_handles, labels + more_labels, loc="upper left", bbox_to_anchor=(1.08, 1))
    for axes in (rate, latency):
        axes.legend(loc="upper left", bbox_to_anchor=(1.08, 1))
    return figure


def _phase_lines(axes: Axes, series: list[Series], dotted: str, scale: str) -> None:
    """Each of ``series`` (labelled ``<phase>: ...``) in its phase's colour, dotted when its label
    ends with ``dotted``; the axes scaled by the ``scale`` phase's series, and another phase's
    peak above them written at the top, where it leaves the panel."""
    top = _top([line for line in series if line.label.startswith(f"{scale}:")])
    for line in series:
        phase = line.label.split(":")[0]
        axes.plot(
            line.xs, line.ys, ":" if line.label.endswith(dotted) else "-", color=_PHASE_COLOURS[phase], label=line.label
        )
        if line.ys and max(line.ys) > top:
            peak = max(line.ys)
            at = line.xs[line.ys.index(peak)]
            axes.annotate(
                f"{line.label} up to {peak:,.0f}",
                (at, top),
                va="top",
                ha="right",
                fontsize=8,
                color=_PHASE_COLOURS[phase],
            )
    axes.set_ylim(0, top)


def _top(series: list[Series]) -> float:
    """The upper y limit for ``series``: a tenth above their highest value (1 when all are 0)."""
    return max((max(s.ys) for s in series if s.ys), default=0.0) * 1.1 or 1.0


def _timeline(measured: Measured, path: Path) -> None:
    """The timeline chart at ``path``, and the series it draws beside it (``timeline.json``)."""
    import matplotlib.pyplot as plt

    timeline = build_timeline(measured)
    path.with_suffix(".json").write_bytes(msgspec.json.encode(dataclasses.asdict(timeline)))
    figure = timeline_figure(timeline)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _marks(measured: Measured) -> dict[str, float]:
    """p50, p95 and p99 of the purchase wave's latencies, in ms."""
    latencies = sorted(answer.latency * 1000 for answer in measured.purchase.outcomes)
    return {f"p{round(q * 100)}": percentile(latencies, q) for q in (0.5, 0.95, 0.99)}


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
    body = "".join("<tr>" + "".join(f"<td>{html.escape(human(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _invariants(invariants: dict[str, dict[str, Any]]) -> str:
    rows = []
    for name, check in invariants.items():
        numbers = "; ".join(f"{label(key)}: {human(value)}" for key, value in check.items() if key != "ok")
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
    return f"<h2>{html.escape(title)}</h2>" + _table(rows(values), ("", "value"))


def _fairness(figures: dict[str, Any] | None) -> str:
    """The crowd sale's fairness figures (None: not a crowd sale), titled as the terminal table."""
    if figures is None:
        return ""
    room = "through the waiting room" if figures["waiting_room"] else "without the waiting room"
    return _section(f"fairness ({room})", figures).replace("<table>", '<table id="fairness">', 1)


def _bound(crowd: dict[str, Any] | None) -> str:
    """The verdict line: server- or client-bound (nothing when no wave ran)."""
    return (
        ""
        if crowd is None
        else f'<p id="bound">{html.escape(crowd["main_wave"])} wave: {html.escape(crowd["line"])}</p>'
    )


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
    HTML file's path. ``report`` is :func:`toolkit.sale.render.build_report`'s document. Without
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
{_bound(report["crowd"])}
<h2>invariants</h2>{_invariants(report["invariants"])}
{images}
{_section("run", run)}{_section("performance", report["performance"])}{_section("ceiling", report["ceiling"])}
{_section("orders by status", report["orders_by_status"])}{_section("realignment", report["realignment"])}
{_section("lifecycle", report["lifecycle"])}{_fairness(report["fairness"])}
{_section("the crowd (Locust) and the server", report["crowd"])}
</body></html>
"""
    target = directory / "report.html"
    target.write_text(page, encoding="utf-8")
    return target
