"""The sale over time, as the series the report's timeline chart draws (:mod:`toolkit.sale.charts`):
seconds on one axis from the purchase wave's first request to the end of the run.

- requests: answers per second of each wave that ran after it (purchase, buyers paying at the
  channel, resale) and, for the waves that buy, accepted orders per second;
- latency: p50 and p99 of each buying wave's answers, per time bin (ms);
- queue: the orders accepted (202s received by the sale's client) and the order rows in MySQL,
  both until the end of the run: the gap between the two is the orders queued or in a
  consumer's hands (the client receives a 202 a little after the broker confirmed it, so the
  rows may run ahead by that much); and the messages ready in the broker, which stay near 0
  while the consumers keep up, each taking up to its prefetch of deliveries at once.

The no-op wave is left out: it measures the sale's own client before the sale, at several times
the purchase rate, and would set the scale; the performance table sets the two side by side.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from toolkit.sale.facts import Measured
from toolkit.sale.plan import ACCEPTED, Answer, Wave

BINS_PER_WAVE = 60
"""About this many points over the purchase wave for the rates and latencies (the other waves
are binned alike)."""
MIN_BIN_SECONDS = 0.05


@dataclass(frozen=True, slots=True)
class Series:
    """One line: ``label``, ``xs`` (seconds since the purchase wave's first request), ``ys``."""

    label: str
    xs: tuple[float, ...]
    ys: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Timeline:
    """What the timeline chart draws. ``phases``: each wave's and the first drain's (start, end);
    ``requests`` (per second), ``latency`` (ms), ``accepted`` and ``rows`` (orders so far),
    ``ready`` (messages) as :class:`Series`; ``end``: the last sample or answer."""

    phases: dict[str, tuple[float, float]]
    requests: list[Series]
    latency: list[Series]
    accepted: Series
    rows: Series
    ready: Series
    end: float


def _span(wave: Wave) -> tuple[float, float]:
    """From the first request sent to the last answer (epoch seconds)."""
    return min(a.finished - a.latency for a in wave.outcomes), max(a.finished for a in wave.outcomes)


def percentile(ordered: list[float], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


def waves(measured: Measured) -> dict[str, Wave]:
    """The waves drawn, by phase name, in the order they ran (those with answers only)."""
    drawn = {"purchase": measured.purchase}
    if measured.lifecycle is not None:
        drawn |= {"payments": measured.lifecycle.payments, "resale": measured.lifecycle.resale}
    return {name: wave for name, wave in drawn.items() if wave.outcomes}


def _wave_series(name: str, wave: Wave, origin: float, width: float) -> tuple[list[Series], list[Series]]:
    """``name``'s answers/s (and accepted/s for a buying wave), and its p50/p99 latency, in bins
    of ``width`` seconds."""
    start, _ = _span(wave)
    bins: dict[int, list[Answer]] = defaultdict(list)
    for answer in wave.outcomes:
        bins[int((answer.finished - start) / width)].append(answer)
    indices = range(max(bins) + 1)
    xs = tuple(start - origin + (index + 0.5) * width for index in indices)
    rates = [Series(f"{name}: answers/s", xs, tuple(len(bins.get(i, ())) / width for i in indices))]
    latency: list[Series] = []
    if any(answer.code == ACCEPTED for answer in wave.outcomes):
        accepted = tuple(sum(a.code == ACCEPTED for a in bins.get(i, ())) / width for i in indices)
        rates.append(Series(f"{name}: accepted/s", xs, accepted))
        filled = [i for i in indices if bins.get(i)]
        for point in (0.5, 0.99):
            ys = tuple(percentile(sorted(a.latency * 1000 for a in bins[i]), point) for i in filled)
            latency.append(Series(f"{name}: p{round(point * 100)}", tuple(xs[i] for i in filled), ys))
    return rates, latency


def _accepted_at(measured: Measured, origin: float) -> list[float]:
    """When each distinct accepted order's first 202 arrived, ascending (seconds since origin)."""
    first: dict[str, float] = {}
    for name, wave in waves(measured).items():
        if name != "payments":
            for answer in wave.outcomes:
                if answer.code == ACCEPTED and answer.order_no is not None:
                    first[answer.order_no] = min(first.get(answer.order_no, math.inf), answer.finished - origin)
    return sorted(first.values())


def build_timeline(measured: Measured) -> Timeline:
    """The series of ``measured`` on one time axis (see the module docstring)."""
    origin, purchase_end = _span(measured.purchase)
    width = max(MIN_BIN_SECONDS, (purchase_end - origin) / BINS_PER_WAVE)  # one for every wave: rates compare
    phases: dict[str, tuple[float, float]] = {}
    requests: list[Series] = []
    latency: list[Series] = []
    for name, wave in waves(measured).items():
        start, end = _span(wave)
        phases[name] = (start - origin, end - origin)
        rates, latencies = _wave_series(name, wave, origin, width)
        requests += rates
        latency += latencies
    if measured.drain_seconds is not None:
        phases["drain"] = (purchase_end - origin, purchase_end - origin + measured.drain_seconds)
    samples = [(at - origin, rows, ready) for at, rows, ready in measured.queue_timeline if at >= origin]
    xs = tuple(at for at, _, _ in samples)
    end = max([*(last for _, last in phases.values()), *xs])
    accepted = _accepted_at(measured, origin)
    so_far = (0.0, *map(float, range(1, len(accepted) + 1)), float(len(accepted)))
    return Timeline(
        phases=phases,
        requests=requests,
        latency=latency,
        accepted=Series("orders accepted (202s as the client got them)", (0.0, *accepted, end), so_far),
        rows=Series("order rows in MySQL", xs, tuple(float(rows) for _, rows, _ in samples)),
        ready=Series("messages ready in the broker", xs, tuple(float(ready) for _, _, ready in samples)),
        end=end,
    )
