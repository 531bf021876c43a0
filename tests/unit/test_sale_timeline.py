"""The sale report's timeline (toolkit/sale/timeline.py, drawn by toolkit/sale/charts.py) on a made
sale: a fast no-op wave, a purchase wave that sells out, payments, a resale after a pause, and
the queue sampled until the end. The no-op wave does not set the purchase panel's scale, the
order rows and the accepted orders run to the end of the run, the legends sit beside the
panels; the report's tables speak words, not Python."""

from __future__ import annotations

import re

import pytest

from toolkit.sale import charts
from toolkit.sale.facts import LifecycleRun, Measured
from toolkit.sale.plan import ACCEPTED, Answer, Wave
from toolkit.sale.render import human
from toolkit.sale.timeline import Series, build_timeline

T0 = 1000.0  # perf_counter seconds of the no-op wave's first request


def _wave(start: float, seconds: float, answers: int, accepted: int = 0, code: str = "sold_out") -> Wave:
    """``answers`` evenly over ``seconds`` from ``start`` (20 ms each); the first ``accepted`` are 202s."""
    outcomes = [
        Answer(
            202 if n < accepted else 409,
            ACCEPTED if n < accepted else code,
            f"FS{start}-{n}" if n < accepted else None,
            None,
            0.02,
            start + 0.02 + seconds * n / answers,
        )
        for n in range(answers)
    ]
    return Wave([], outcomes, seconds)


NOOP = _wave(T0, 0.5, 2000, code="ok")  # 4,000/s: far above the purchase wave
PURCHASE = _wave(T0 + 1, 5.0, 1000, accepted=100)  # 200/s, the first 100 accepted
PAYMENTS = _wave(T0 + 8, 0.5, 40, code="paid")
RESALE = _wave(T0 + 12, 0.2, 200, accepted=20)  # a burst: 1,000/s
FINAL_ROWS = 120


def _samples() -> tuple[tuple[float, int, int], ...]:
    """Every 0.1 s from the no-op wave to 3 s after the resale: the rows follow the 202s 0.3 s
    late; nothing is ever ready in the broker (the consumer holds its prefetch)."""
    accepted = sorted(a.finished for wave in (PURCHASE, RESALE) for a in wave.outcomes if a.code == ACCEPTED)
    samples = []
    for tick in range(160):
        at = T0 + tick * 0.1
        samples.append((at, sum(done <= at - 0.3 for done in accepted), 0))
    return tuple(samples)


def _measured() -> Measured:
    lifecycle = LifecycleRun(
        pay_share=0.5,
        window_seconds=2,
        starts=_wave(T0 + 7.5, 0.2, 40, code="ok"),
        payments=PAYMENTS,
        paid_at_channel=[],
        abandoned=0,
        notifications={"sent": 40, "dropped": 2},
        unpaid=60,
        wait_seconds=2.0,
        swept=60,
        returned=60,
        on_sale=60,
        resale=RESALE,
        drain_seconds=0.4,
        channel_payments=[],
        reconciled_clean=True,
        mismatches={},
    )
    return Measured(PURCHASE, NOOP, None, lifecycle, 0.1, 0.5, None, None, _samples())  # type: ignore[arg-type]


def _so_far(series: Series, at: float) -> float:
    return max((y for x, y in zip(series.xs, series.ys, strict=True) if x <= at), default=0.0)


def test_the_timeline_leaves_the_noop_out_and_runs_to_the_end():
    timeline = build_timeline(_measured())
    assert set(timeline.phases) == {"purchase", "drain", "payments", "resale"}
    assert timeline.phases["purchase"][0] == 0.0  # the axis starts at the purchase wave's first request
    assert not any("no-op" in series.label for series in timeline.requests)
    # the order rows run to the last sample, after the resale, and reach the final count
    rows = timeline.rows
    assert rows.ys[-1] == FINAL_ROWS and rows.xs[-1] == pytest.approx(15.9 - 1.0)
    assert rows.xs[-1] > timeline.phases["resale"][1] and timeline.end == rows.xs[-1]
    # the orders accepted, to the end too: ahead of the rows while they lag, level at the end
    accepted = timeline.accepted
    assert accepted.ys[-1] == FINAL_ROWS and accepted.xs[-1] == timeline.end
    assert _so_far(accepted, 0.4) > _so_far(rows, 0.4) > 0
    assert set(timeline.ready.ys) == {0.0}
    labels = [series.label for series in timeline.requests]
    assert labels == [
        "purchase: answers/s",
        "purchase: accepted/s",
        "payments: answers/s",
        "resale: answers/s",
        "resale: accepted/s",
    ]
    assert [series.label for series in timeline.latency] == [
        "purchase: p50",
        "purchase: p99",
        "resale: p50",
        "resale: p99",
    ]
    assert {round(y) for series in timeline.latency for y in series.ys} == {20}


def test_the_panels_are_scaled_by_their_own_data_and_the_legends_sit_beside_them():
    pytest.importorskip("matplotlib", reason="the charts extra")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timeline = build_timeline(_measured())
    figure = charts.timeline_figure(timeline)
    try:
        rate, latency, queue, ready = figure.axes
        purchase = max(max(series.ys) for series in timeline.requests if series.label.startswith("purchase"))
        assert rate.get_ylim() == pytest.approx((0, purchase * 1.1))  # set by the purchase wave alone:
        assert purchase < 300  # neither the no-op wave's 4,000/s (not drawn) nor the resale's burst
        resale = max(max(series.ys) for series in timeline.requests if series.label.startswith("resale"))
        assert resale > 3 * purchase
        notes = [text.get_text() for text in rate.texts]
        assert f"resale: answers/s up to {resale:,.0f}" in notes  # the clipped peak, said
        assert latency.get_ylim()[1] == pytest.approx(22, abs=1)
        assert queue.get_ylim() == pytest.approx((0, FINAL_ROWS * 1.1))
        assert ready.get_ylim() == (0, 1)  # nothing was ever ready: an axis of 0 and 1, said in its label
        assert queue.get_xlim() == pytest.approx((0, timeline.end))
        drawn_accepted, drawn_rows = queue.get_lines()
        assert drawn_rows.get_xdata()[-1] == timeline.end and drawn_rows.get_ydata()[-1] == FINAL_ROWS
        assert drawn_accepted.get_xdata()[-1] == timeline.end and drawn_accepted.get_ydata()[-1] == FINAL_ROWS
        assert ready.get_lines()[0].get_label() == "messages ready in the broker (0 throughout)"
        figure.canvas.draw()
        for axes in (rate, latency, queue):
            legend = axes.get_legend()
            assert legend is not None
            assert legend.get_window_extent().x0 >= ready.get_window_extent().x1  # beside, not over, the data
    finally:
        plt.close(figure)


def test_report_values_are_words():
    assert [human(v) for v in (True, False, None, {}, {"in_flight": 0, "sent": 3}, [1, 2], 0.5)] == [
        "yes",
        "no",
        "-",
        "none",
        "in flight 0, sent 3",
        "1, 2",
        "0.5",
    ]


def test_the_report_page_has_no_python_in_its_tables(tmp_path, monkeypatch):
    monkeypatch.setattr(charts, "charts_available", lambda: False)
    report = {
        "run": {"run_id": "sale_x", "requests": 2, "users": 2, "stock": 1, "product_id": 7, "isolated": True},
        "ok": True,
        "invariants": {"sold_within_stock": {"ok": True, "drained": True, "notifications": {"sent": 1}}},
        "performance": {"requests": 2, "latency_ms": {"p50": 1.0}},
        "ceiling": {},
        "orders_by_status": {},
        "realignment": {"dry_run": False, "drift": 0},
        "lifecycle": {"sweep": "one pass", "reconciliation": {"clean": True, "mismatches": {}}},
        "fairness": {
            "waiting_room": True,
            "scripted_share_of_units": 0.21,
            "admissions_by_behaviour": None,
            "turn_order": {"after_opening": {"kendall_tau_distance": 0.0063}},
        },
        "crowd": {
            "main_wave": "purchase",
            "bound": "server",
            "line": "server-bound: the crowd kept up",
            "waves": {"purchase": {"box_cpu_share": None, "hosts": {"vm (127.0.0.1)": 2}}},
        },
    }
    page = charts.write_report(tmp_path, report, _measured()).read_text(encoding="utf-8")
    assert '<p id="bound">purchase wave: server-bound: the crowd kept up</p>' in page
    tables = " ".join(re.findall(r"<table.*?</table>", page, re.S))
    assert not re.search(r"\bTrue\b|\bFalse\b|\bNone\b|\{|service\.", tables), tables
    assert "drained: yes" in tables and "<td>latency ms: p50</td><td>1.0</td>" in tables
    assert "<td>reconciliation: mismatches</td><td>none</td>" in tables
    title = r'<h2>fairness \(through the waiting room\)</h2><table id="fairness">(.*?)</table>'
    fairness = re.search(title, page, re.S)
    assert fairness is not None
    assert "<td>turn order: after opening: kendall tau distance</td><td>0.0063</td>" in fairness[1]
