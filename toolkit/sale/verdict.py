"""The report's ``crowd`` section: what each wave cost the Locust crowd and the server per
request, how late the crowd sent what was due, and the verdict on the main wave (the purchase
wave or the crowd): was the run bound by the server or by the client? (docs/OPERATIONS.md,
"Rehearse a sale".)

A worker process runs on one core (gevent: one thread). The client was the limit when its
workers were busy most of their time (:data:`CLIENT_BUSY`), or when their event loops woke
late (p99 oversleep) by at least :data:`LATE_MS` and by at least :data:`LATE_SHARE` of the
answers' own p99 latency: then the numbers are the crowd's ceiling, not the service's, and more
workers or hosts raise them. Otherwise the service was the limit. The lag from due to sent is
reported beside them but not weighed: beyond the event loop it is the wait for one of a crowd's
connections, all of them busy waiting for the server. A box whose load average exceeds its cores
starves both sides, and the line says so.
"""

from __future__ import annotations

import os
from typing import Any

from toolkit.sale.facts import WaveLoad
from toolkit.sale.timeline import percentile

CLIENT_BUSY = 0.8
"""Share of its time a worker process spent on the CPU from which the crowd counts as the limit."""
LATE_MS = 50.0
"""p99 event-loop lag (ms) from which the crowd may count as the limit."""
LATE_SHARE = 0.25
"""...and only when that lag is at least this share of the answers' p99 latency (a crowd that
sends 100 ms late to a server answering in 5 s is not what holds the buyers up)."""
MAIN_WAVES = ("purchase", "crowd")


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    if not ordered:
        return {"p50": 0.0, "p99": 0.0, "max": 0.0}
    return {name: round(percentile(ordered, q) * 1000, 1) for name, q in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))}


def _per_request_us(seconds: float | None, requests: int) -> float | None:
    return None if seconds is None or not requests else round(seconds / requests * 1e6, 1)


def wave_figures(load: WaveLoad, cores: int) -> dict[str, Any]:
    """One wave's costs: CPU per request (µs) of the client and the server, the workers' busy
    share, the lags (ms), each side's share of this box (when the server's CPU is known) and the
    trail's completeness."""
    busy = load.client_cpu / load.client_busy if load.client_busy else 0.0
    box = load.seconds * cores
    return {
        "requests": load.requests,
        "seconds": round(load.seconds, 2),
        "answers_per_second": round(load.requests / load.seconds, 1) if load.seconds else None,
        "workers": load.workers,
        "hosts": load.hosts,
        "client_cpu_us_per_request": _per_request_us(load.client_cpu, load.requests),
        "server_cpu_us_per_request": _per_request_us(load.server_cpu, load.requests),
        "client_busy_share": round(busy, 3),
        "lag_due_to_sent_ms": _ms(load.lags),
        "event_loop_lag_ms": _ms(load.loop_lags),
        "box_cpu_share": None
        if load.server_cpu is None or not box
        else {"client": round(load.client_cpu / box, 3), "server": round(load.server_cpu / box, 3)},
        "latency_p99_ms": round(load.latency_p99 * 1000, 1),
        "load_average": round(load.load_average, 2),
        "trail": {"duplicates": load.duplicates, "missing": load.missing},
    }


def verdict(figures: dict[str, Any], cores: int) -> dict[str, Any]:
    """``bound`` (``client``/``server``) and the ``line`` that says it, from a wave's figures."""
    busy, lag = figures["client_busy_share"], figures["lag_due_to_sent_ms"]["p99"]
    loop = figures["event_loop_lag_ms"]["p99"]
    client = busy >= CLIENT_BUSY or (loop >= LATE_MS and loop >= LATE_SHARE * figures["latency_p99_ms"])
    shape = f"busy {busy:.0%} of their time, lag p99 {lag:.0f} ms due to sent, event loop p99 {loop:.0f} ms"
    if client:
        line = (
            f"client-bound: the crowd's {figures['workers']} worker processes were the limit ({shape});"
            " these numbers are the crowd's ceiling, not the service's: add --crowd-workers or hosts"
            " (flashsale sale-worker)"
        )
    else:
        line = (
            f"server-bound: the crowd kept up ({shape}, answers p99 {figures['latency_p99_ms']:.0f} ms);"
            " these numbers are the service's"
        )
    share = figures["box_cpu_share"]
    if share is not None and figures["hosts"] and len(figures["hosts"]) == 1:
        line += (
            f". The crowd shared this {cores}-core box with the service: it took {share['client']:.0%} of"
            f" the box's CPU, the service {share['server']:.0%}; workers on other hosts give it back"
        )
    if figures["load_average"] > cores:
        line += (
            f". Load average {figures['load_average']:.1f} on {cores} cores at the wave's end: other processes"
            " took CPU from the crowd and the service alike; measure on a quiet box"
        )
    return {"bound": "client" if client else "server", "line": line}


def crowd_section(loads: tuple[WaveLoad, ...]) -> dict[str, Any] | None:
    """The report's ``crowd`` section: every wave's figures and the main wave's verdict (None
    when no wave ran)."""
    if not loads:
        return None
    cores = os.cpu_count() or 1
    waves = {load.label: wave_figures(load, cores) for load in loads}
    main = next((name for name in MAIN_WAVES if name in waves), loads[0].label)
    return {"cores": cores, "main_wave": main, **verdict(waves[main], cores), "waves": waves}
