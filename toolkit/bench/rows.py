"""What ``flashsale bench`` measures: the rows, their references and the targets (docs/BENCHMARKS.md).

A row is identified by a key. HTTP rows (:data:`HTTP_ROWS`) name the server they run on
(:data:`SERVERS`); adding a row is adding a spec. ``accept async`` runs the same accept load on an
API in publish mode ``async`` (202 once reserved; published in the background). The ``db_*`` rows
run the accept and sold-out loads on products in stock mode ``database`` (one MySQL transaction per
purchase), each against the ``redis``-mode row (Redis pre-decrement and the queue) as reference, so
one run shows what each stock mode costs (docs/BENCHMARKS.md). The ``*_metrics_off`` rows run the
no-op and sold-out loads on an API with ``FLASHSALE_METRICS__ENABLED=false`` (no ``/metrics``, no
request observations), each at the same time as a ``*_paired`` row, the same load on a metrics-on
API, one wrk per server (:func:`round_groups`): whatever else runs on the machine hits both sides
alike, and the two servers share the CPU, so the cost of observing the hot path is one ratio:
metrics on / off. The metrics-on twin is a server of its own, started with the metrics-off one and
serving nothing else, so the twins differ by the setting alone (not by the history of the ``api``
server, which creates the products and serves every other row); an A/A pair (both twins with
metrics on) still reads 0.89-1.09 per CPU-second on a shared 2-core box (docs/BENCHMARKS.md). The pairs are
rows of their own: the ``product_noop`` and ``sold_out`` rows, which the other targets divide by,
run alone as every other row does (a row measured beside its twin gets about half the CPU, which
once halved the no-op's rate in the targets).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """An HTTP server: ``bare`` (the bare app) or ``api`` (``flashsale serve``) plus extra
    environment (e.g. a publish mode), on ``workers`` granian workers (None: ``--workers``);
    servers start when a row needs them, one at a time."""

    name: str
    kind: str  # "bare" | "api"
    env: dict[str, str] = field(default_factory=dict)
    workers: int | None = None


@dataclass(frozen=True, slots=True)
class HttpRow:
    """``POST`` to a target (``bare_noop``, ``noop``, ``sold_out``, ``accept``, ``db_sold_out``,
    ``db_accept``) on ``server``;
    only ``expect`` counts as success; ``reference`` is the row the rate is divided by."""

    key: str
    label: str
    server: str
    target: str
    expect: int
    reference: str | None


SERVERS = [
    ServerSpec("bare", "bare"),
    ServerSpec("api", "api"),
    ServerSpec("api-async", "api", {"FLASHSALE_ORDERS__PUBLISH_MODE": "async"}),
    ServerSpec("api-metrics-on", "api", {"FLASHSALE_METRICS__ENABLED": "true"}),
    ServerSpec("api-metrics-off", "api", {"FLASHSALE_METRICS__ENABLED": "false"}),
    ServerSpec("api-2w", "api", workers=2),
]
HTTP_ROWS = [
    HttpRow("bare_noop", "bare no-op", "bare", "bare_noop", 202, None),
    HttpRow("product_noop", "product no-op", "api", "noop", 202, "bare_noop"),
    HttpRow("product_noop_paired", "product no-op, paired", "api-metrics-on", "noop", 202, None),
    HttpRow(
        "product_noop_metrics_off", "product no-op, metrics off", "api-metrics-off", "noop", 202, "product_noop_paired"
    ),
    HttpRow("sold_out", "sold out", "api", "sold_out", 409, "product_noop"),
    HttpRow("sold_out_paired", "sold out, paired", "api-metrics-on", "sold_out", 409, None),
    HttpRow("sold_out_metrics_off", "sold out, metrics off", "api-metrics-off", "sold_out", 409, "sold_out_paired"),
    HttpRow("accept", "accept", "api", "accept", 202, "product_noop"),
    HttpRow("accept_async", "accept async", "api-async", "accept", 202, "product_noop"),
    HttpRow("accept_2w", "accept, 2 workers", "api-2w", "accept", 202, "accept"),
    HttpRow("db_accept", "accept, database mode", "api", "db_accept", 201, "accept"),
    HttpRow("db_sold_out", "sold out, database mode", "api", "db_sold_out", 409, "sold_out"),
]
METRICS_PAIRS = {"product_noop_paired": "product_noop_metrics_off", "sold_out_paired": "sold_out_metrics_off"}
"""Metrics-on row -> its metrics-off twin, measured at the same time in every round."""
DRAIN_ROWS = [
    ("reserve", "reserve only", None),
    ("publish", "publish only", None),
    ("consumer", "consumer drain", "raw_one"),
    ("raw_one", "raw 1/tx", None),
    ("raw_batch", "raw batched", "raw_one"),
]


@dataclass(frozen=True, slots=True)
class PipelineSpec:
    """A pipeline row: an ``api`` server and the consumers, both with ``env`` added."""

    key: str
    label: str
    env: dict[str, str] = field(default_factory=dict)


PIPELINE_ROWS = [
    PipelineSpec("pipeline", "pipeline, groups"),
    PipelineSpec("pipeline_single", "pipeline, GROUP_MAX=1", {"FLASHSALE_AMQP__GROUP_MAX": "1"}),
]
"""Measured one after the other in every round (their order alternating by round). The groups
row runs on the default settings (group publishing on); its twin keeps one order per message."""
FLOOR_HOPS = {
    "bare_noop": {"server": "server"},
    "reserve": {"server": "server", "redis": "redis"},
    "publish": {"server": "server", "rabbitmq": "rabbitmq"},
    "raw_batch": {"client": "consumers", "mysql": "mysql"},
}
"""The floor row's hops: each hop row's CPU groups (per success) and the pipeline column each
is added to (the process that does that work in the pipeline)."""
PIPELINE_GROUPS = ("server", "consumers", "rabbitmq", "redis", "mysql", "client")
"""The CPU groups of a pipeline row (``server``: the API's processes), in the report's order."""

DESCRIPTIONS = {
    "bare_noop": "minimal Litestar app on the same granian settings: msgspec body decode, no auth, no I/O (202)",
    "product_noop": "POST /api/v1/bench/noop of the real app: JWT auth + body decode (202)",
    "sold_out": "POST /api/v1/orders, product sold out, no Idempotency-Key: answered by the process's "
    "sold-out flag after the first Redis answer (409 sold_out)",
    "product_noop_paired": "the product no-op again, on a metrics-on API of its own, at the same time as its "
    "metrics-off twin (one wrk each, "
    "the two servers share the CPU: each row's others include its twin; rates half the lone row's)",
    "product_noop_metrics_off": "the product no-op on an API with FLASHSALE_METRICS__ENABLED=false (no request "
    "observations, no /metrics), measured at the same time as product no-op, paired; the per server CPU-s ratio "
    "(on / off in the targets) is what observing costs a request",
    "sold_out_paired": "the sold-out load again, on the metrics-on twin, at the same time as its metrics-off twin",
    "sold_out_metrics_off": "the sold-out load on the API with metrics off, at the same time as sold out, paired",
    "accept": "POST /api/v1/orders with stock for the whole run: reserve + publish + confirm (202)",
    "accept_2w": "the accept load on an API of 2 granian workers (as `make sale` serves), the rest as accept: "
    "on 2 cores the workers share the CPU with wrk and the stores; ratio against accept (1 worker)",
    "accept_async": "the accept load on an API in publish mode async: 202 once reserved, published in the background",
    "db_accept": "the accept load on a product in stock mode database: one MySQL transaction per purchase, "
    "all on one inventory row (201); ratio against accept (redis mode)",
    "db_sold_out": "the sold-out load on a product in stock mode database: each request a MySQL transaction "
    "that locks the row and rolls back (409 sold_out); ratio against sold out (redis mode)",
    "reserve": "the API's Reservations.reserve alone (the reserve script, one Redis round trip each, "
    "batched as the API batches them) in the bench process, --connections in flight: the reserve hop's cost",
    "publish": "the API's Publisher alone (no HTTP, no Redis) publishing the drain rows' backlog, confirmed, "
    "--connections in flight, on the run's settings (in groups when group publishing is on): the publish hop's "
    "cost per order",
    "consumer": "--consumers `flashsale consume` processes draining the published backlog into MySQL together",
    "raw_one": "raw asyncmy writer, 8 connections, one order per transaction (the consumer's statements)",
    "raw_batch": "raw asyncmy writer, 8 connections, --batch orders per transaction (multi-row INSERTs)",
    "pipeline": "wrk on the accept path (new buyers) with --consumers `flashsale consume` running, timed from "
    "the first request until the last accepted order is committed in MySQL; default settings (groups on)",
    "pipeline_single": "the same pipeline with FLASHSALE_AMQP__GROUP_MAX=1 (one order per message), same wrk "
    "connections and duration (a closed loop: the same offered concurrency, each row's own rate)",
    "floor": "the sum of the hops alone, per order: bare no-op (server), reserve only (bench process + Redis), "
    "publish only (bench process + RabbitMQ; grouped when group publishing is on), raw batched (writer + MySQL)",
}


@dataclass(slots=True)
class Row:
    """One measured row. ``rate`` in req/s or orders/s (successes only); latencies in ms (None
    where not measured); ``cpu`` in cores per group (``client``, ``server``, stores) plus
    ``machine`` (share of all CPUs busy, 0-1); ``statuses`` counts every HTTP answer; ``buyers``:
    the distinct buyers whose tokens the load sent (every round's new ones); ``cpu_per_order``
    (pipeline and floor rows): CPU-seconds per durable order by group, plus ``machine`` (every
    CPU of the box) and ``service`` (the API, consumers and stores: no load client)."""

    key: str
    label: str
    unit: str
    rate: float
    count: int
    seconds: float
    reference: str | None = None
    ratio: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    statuses: dict[str, int] = field(default_factory=dict)
    unexpected: int = 0
    socket_errors: int = 0
    cpu: dict[str, float] = field(default_factory=dict)
    note: str = ""
    rounds: list[float] = field(default_factory=list)
    per_server_cpu: float | None = None
    cpu_ratio: float | None = None
    buyers: int = 0
    cpu_per_order: dict[str, float] = field(default_factory=dict)


def merge_rounds(rounds: list[Row]) -> Row:
    """One row from its rounds: rate = all successes / all seconds; p50/p99 = the median of the
    rounds'; CPU = the mean weighted by each round's seconds (so cores x seconds is every
    round's CPU-seconds, and CPU per success the total over the total); status counts added up;
    ``rounds`` = each round's rate."""
    first = rounds[0]

    def median(values: list[float | None]) -> float | None:
        known = sorted(v for v in values if v is not None)
        return known[len(known) // 2] if known else None

    statuses: dict[str, int] = {}
    for r in rounds:
        for code, n in r.statuses.items():
            statuses[code] = statuses.get(code, 0) + n
    count, seconds = sum(r.count for r in rounds), sum(r.seconds for r in rounds)
    return Row(
        key=first.key,
        label=first.label,
        unit=first.unit,
        rate=round(count / seconds, 1) if seconds else 0.0,
        count=count,
        seconds=round(seconds, 3),
        reference=first.reference,
        p50_ms=median([r.p50_ms for r in rounds]),
        p99_ms=median([r.p99_ms for r in rounds]),
        statuses=statuses,
        unexpected=sum(r.unexpected for r in rounds),
        socket_errors=sum(r.socket_errors for r in rounds),
        cpu={k: round(sum(r.cpu.get(k, 0.0) * r.seconds for r in rounds) / seconds, 3) for k in first.cpu}
        if seconds
        else first.cpu,
        note=first.note,
        rounds=[r.rate for r in rounds],
        buyers=sum(r.buyers for r in rounds),
    )


@dataclass(frozen=True, slots=True)
class Target:
    """``row``'s ``metric`` divided by ``reference``'s (its ``reference_metric`` when given): at
    least ``minimum`` or at most ``maximum``; without a ``reference``, ``row``'s metric times
    ``scale`` itself. Metrics: ``rate``, ``p99_ms``, ``per_server_cpu`` (successes per CPU second of
    the server, the cost of a request) or ``per_order:<group>`` (CPU-seconds per durable order of
    that group, :attr:`Row.cpu_per_order`)."""

    label: str
    row: str
    reference: str | None
    metric: str = "rate"
    minimum: float | None = None
    maximum: float | None = None
    reference_metric: str | None = None
    scale: float = 1.0

    def value(self, row: Row, metric: str | None = None) -> float | None:
        """``row``'s measured :attr:`metric` (or ``metric``)."""
        metric = metric or self.metric
        if metric.startswith("per_order:"):
            return row.cpu_per_order.get(metric.partition(":")[2])
        return {"rate": row.rate, "p99_ms": row.p99_ms, "per_server_cpu": row.per_server_cpu}[metric]


TARGETS = [
    Target("product no-op >= 0.65 x bare no-op (many buyers)", "product_noop", "bare_noop", minimum=0.65),
    Target("sold-out >= 0.6 x bare no-op (many buyers)", "sold_out", "bare_noop", minimum=0.6),
    Target("sold-out >= 0.85 x product no-op", "sold_out", "product_noop", minimum=0.85),
    Target("accept >= 0.45 x product no-op", "accept", "product_noop", minimum=0.45),
    Target("accept per CPU-s >= 0.45 x product no-op", "accept", "product_noop", "per_server_cpu", minimum=0.45),
    Target("consumer >= 3 x raw 1 order/tx", "consumer", "raw_one", minimum=3.0),
    Target("consumer >= 0.4 x raw batched", "consumer", "raw_batch", minimum=0.4),
    Target("sold-out p99 <= 2 x product no-op p99", "sold_out", "product_noop", "p99_ms", maximum=2.0),
    Target(
        "pipeline machine CPU-s per order, groups <= 0.67 x GROUP_MAX=1",
        "pipeline",
        "pipeline_single",
        "per_order:machine",
        maximum=0.67,
    ),
    Target(
        "pipeline RabbitMQ CPU per order, groups <= 0.2 x GROUP_MAX=1",
        "pipeline",
        "pipeline_single",
        "per_order:rabbitmq",
        maximum=0.2,
    ),
    Target("pipeline accept p99, groups <= 1.2 x GROUP_MAX=1", "pipeline", "pipeline_single", "p99_ms", maximum=1.2),
    Target(
        "pipeline machine CPU-ms per durable order, groups <= 0.6",
        "pipeline",
        None,
        "per_order:machine",
        maximum=0.6,
        scale=1000,
    ),
    Target(
        "pipeline machine CPU per durable order, groups <= 3 x the floor",
        "pipeline",
        "floor",
        "per_order:machine",
        maximum=3.0,
        reference_metric="per_order:service",
    ),
    # What observing costs a request, in server CPU (requests per CPU second, on / off); the rate
    # ratio of the pair, measured at the same time, is in the throughput table.
    Target(
        "product no-op per CPU-s, metrics on >= 0.95 x off",
        "product_noop_paired",
        "product_noop_metrics_off",
        "per_server_cpu",
        minimum=0.95,
    ),
    Target(
        "sold out per CPU-s, metrics on >= 0.95 x off",
        "sold_out_paired",
        "sold_out_metrics_off",
        "per_server_cpu",
        0.95,
    ),
]


def fill_cpu_per_order(row: Row, cpus: int) -> None:
    """Set ``row.cpu_per_order`` from its cores and rate: CPU-seconds per order of each group in
    :data:`PIPELINE_GROUPS`, ``machine`` (busy share x ``cpus``) and ``service`` (all but the client)."""
    if row.rate <= 0:
        return
    per = {g: round(row.cpu[g] / row.rate, 7) for g in PIPELINE_GROUPS if g in row.cpu}
    per["machine"] = round(row.cpu.get("machine", 0.0) * cpus / row.rate, 7)
    per["service"] = round(sum(v for g, v in per.items() if g not in ("client", "machine")), 7)
    row.cpu_per_order = per


def floor_row(rows: list[Row]) -> Row | None:
    """The floor: the hops of :data:`FLOOR_HOPS` alone, their CPU-seconds per success added up
    by the pipeline column each belongs to (``rate``: orders per CPU-second of that sum); None
    unless every hop row was measured."""
    by_key = {r.key: r for r in rows}
    if not all(key in by_key and by_key[key].rate > 0 for key in FLOOR_HOPS):
        return None
    per: dict[str, float] = {}
    for key, columns in FLOOR_HOPS.items():
        hop = by_key[key]
        for group, column in columns.items():
            per[column] = per.get(column, 0.0) + hop.cpu.get(group, 0.0) / hop.rate
    per = {g: round(v, 7) for g, v in per.items()}
    per["service"] = round(sum(per.values()), 7)
    rate = round(1 / per["service"], 1) if per["service"] > 0 else 0.0
    return Row("floor", "floor: the hops alone", "orders/CPU-s", rate, 0, 0.0, cpu_per_order=per)


def round_groups(rows: list[HttpRow]) -> list[list[HttpRow]]:
    """``rows`` as the groups one round measures one after another: each row alone, except a
    metrics pair (:data:`METRICS_PAIRS`, both rows present), measured together at the place of
    its metrics-on row."""
    keys = {row.key for row in rows}
    twins = {off for on, off in METRICS_PAIRS.items() if on in keys and off in keys}
    by_key = {row.key: row for row in rows}
    groups: list[list[HttpRow]] = []
    for row in rows:
        if row.key in twins:
            continue
        twin = METRICS_PAIRS.get(row.key)
        groups.append([row, by_key[twin]] if twin in twins else [row])
    return groups


def all_row_keys() -> list[str]:
    """Every measured row key, HTTP rows first (the order of the report)."""
    return [row.key for row in HTTP_ROWS] + [key for key, _, _ in DRAIN_ROWS] + [p.key for p in PIPELINE_ROWS]


Verdict = TypedDict("Verdict", {"target": str, "ratio": float | None, "pass": bool | None})
"""A target's label, the measured ratio and whether it passed (None: a row was not measured)."""


def fill_ratios(rows: list[Row]) -> None:
    """Set each row's ``ratio`` = rate / its reference's rate (when both were measured), its
    ``per_server_cpu`` = successes per CPU second of the server (or consumer) processes, and
    ``cpu_ratio`` = that / the reference's: the cost per request, which holds steadier than
    the rate when other jobs take CPU from the server."""
    by_key = {r.key: r for r in rows}
    for row in rows:
        server = row.cpu.get("server", 0.0)
        row.per_server_cpu = round(row.rate / server, 1) if server > 0 else None
    for row in rows:
        ref = by_key.get(row.reference or "")
        if ref is not None and ref.rate > 0:
            row.ratio = round(row.rate / ref.rate, 3)
        if ref is not None and row.per_server_cpu and ref.per_server_cpu:
            row.cpu_ratio = round(row.per_server_cpu / ref.per_server_cpu, 3)


def accept_ceiling(rows: list[Row]) -> float | None:
    """The highest accept / product no-op ratio one worker could reach if an accept cost no more
    than a no-op plus the publish hop alone (row ``publish``; its Redis calls and logic free):
    P / (P + N), with P and N the publishes and no-ops per CPU second. None when not measured."""
    by_key = {r.key: r for r in rows}
    publish, noop = by_key.get("publish"), by_key.get("product_noop")
    if publish is None or noop is None or not publish.per_server_cpu or not noop.per_server_cpu:
        return None
    return round(publish.per_server_cpu / (publish.per_server_cpu + noop.per_server_cpu), 3)


def judge(rows: list[Row]) -> list[Verdict]:
    """Every target with its measured ratio and ``pass`` (None when a row is missing)."""
    by_key = {r.key: r for r in rows}
    verdicts: list[Verdict] = []
    for target in TARGETS:
        row = by_key.get(target.row)
        value: float | None = None
        ratio: float | None = None
        if target.reference is None:
            value = target.value(row) if row is not None else None
            ratio = round(value * target.scale, 3) if value is not None else None
        elif row is not None and (ref := by_key.get(target.reference)) is not None:
            value, ref_value = target.value(row), target.value(ref, target.reference_metric)
            ratio = round(value / ref_value, 3) if value is not None and ref_value else None
        passed = None
        if ratio is not None:
            passed = (target.minimum is None or ratio >= target.minimum) and (
                target.maximum is None or ratio <= target.maximum
            )
        verdicts.append(Verdict({"target": target.label, "ratio": ratio, "pass": passed}))
    return verdicts
