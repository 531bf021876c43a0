"""``flashsale bench``: the servers it compares run on granian as ``flashsale serve`` does, and its
pieces agree (ratios, targets, the wrk script, profile summaries)."""

from __future__ import annotations

import json
from pathlib import Path

import jwt
import pytest
from click.testing import CliRunner
from rich.console import Console

from service.api.token_verifier import TokenVerifier
from service.cli.main import main
from service.settings import get_settings
from toolkit.bench import server
from toolkit.bench.buyers import TOKEN_TTL_SECONDS, buyers_reached, mint_tokens
from toolkit.bench.context import Options
from toolkit.bench.procstat import CpuSample, machine_info
from toolkit.bench.profile import (
    FRAMEWORK,
    LAYERS,
    OTHER_OURS,
    RUNTIME,
    SECOND_EXCEPTION_LAYER,
    layer_of,
    summarize,
)
from toolkit.bench.report import Report, render
from toolkit.bench.rows import (
    DRAIN_ROWS,
    HTTP_ROWS,
    PIPELINE_ROWS,
    SERVERS,
    TARGETS,
    Row,
    accept_ceiling,
    fill_cpu_per_order,
    fill_ratios,
    floor_row,
    judge,
    merge_rounds,
)
from toolkit.bench.run import bench_settings
from toolkit.bench.wrk import write_script
from toolkit.sale.isolation import free_port


def test_the_bench_servers_run_on_the_granian_options_of_flashsale_serve(monkeypatch):
    """``flashsale serve`` and the bench's server entry point (the bare app) build granian alike:
    only the app, address, port and workers differ."""
    calls: list[dict[str, object]] = []

    class Recorder:
        def __init__(self, target: str, **kwargs: object) -> None:
            calls.append(dict(kwargs, target=target))

        def serve(self) -> None:
            pass

    async def stores_answer(settings: object) -> list[str]:  # unit tests run without the stores
        return []

    product_port, bare_port = free_port(), free_port()  # probed as free first: no fixed port (8100 is the channel's)
    monkeypatch.setattr("granian.Granian", Recorder)
    monkeypatch.setattr("service.startup.report_dependencies", stores_answer)
    monkeypatch.setenv("FLASHSALE_ENV", "development")
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(main, ["serve", "--port", str(product_port), "--workers", "3"])
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    server.main(["toolkit.bench.bare_app:create_app", "--port", str(bare_port), "--workers", "2"])
    product, bare = calls
    differ = ("target", "port", "workers")
    assert [product.pop(k) for k in differ] == ["service.api.app:create_app", product_port, 3]
    assert [bare.pop(k) for k in differ] == ["toolkit.bench.bare_app:create_app", bare_port, 2]
    assert product == bare
    assert product["factory"] is True and str(getattr(product["interface"], "value", "")) == "asgi"


def test_ratios_and_targets_follow_the_references():
    rows = [
        Row("bare_noop", "bare", "req/s", 1000.0, 1, 1.0, p99_ms=10.0, cpu={"server": 1.0}),
        Row("product_noop", "noop", "req/s", 800.0, 1, 1.0, "bare_noop", p99_ms=10.0, cpu={"server": 0.5}),
        Row("sold_out", "sold", "req/s", 400.0, 1, 1.0, "product_noop", p99_ms=30.0),
    ]
    fill_ratios(rows)
    assert [r.ratio for r in rows] == [None, 0.8, 0.5]
    assert (rows[1].per_server_cpu, rows[1].cpu_ratio) == (1600.0, 1.6)  # requests per server CPU second
    verdicts = {v["target"]: v for v in judge(rows)}
    assert len(verdicts) == len(TARGETS)
    assert verdicts["product no-op >= 0.65 x bare no-op (many buyers)"]["pass"] is True
    assert verdicts["sold-out >= 0.85 x product no-op"]["pass"] is False
    assert verdicts["sold-out p99 <= 2 x product no-op p99"] == {
        "target": "sold-out p99 <= 2 x product no-op p99",
        "ratio": 3.0,
        "pass": False,
    }
    assert verdicts["accept >= 0.45 x product no-op"]["pass"] is None  # not measured


def test_the_wrk_script_sends_each_buyer_a_few_times_and_reports_json(tmp_path):
    body = b'{"product_id":1,"quantity":1}'
    script = write_script(tmp_path / "s.lua", body, ["a.b.c", "d.e.f"], repeats=3, threads=2).read_text()
    assert '"Bearer a.b.c", "Bearer d.e.f"' in script
    assert "local repeats = 3" in script and "math.floor(ntokens / 2)" in script
    assert "function request()" in script and "function done(" in script
    assert 'wrk.body = "{\\"product_id\\":1,\\"quantity\\":1}"' in script


def test_the_buyers_tokens_are_what_the_api_verifies():
    secret = "a-bench-secret-of-at-least-32-characters"
    tokens = mint_tokens(secret, "bench-x", 50)
    assert len(set(tokens)) == 50
    verifier = TokenVerifier(secret, leeway=0, required=["exp", "sub", "iat"], max_length=4096)
    for n, token in enumerate(tokens):
        claims = jwt.decode(token, secret, algorithms=["HS256"])
        assert claims["sub"] == f"bench-x-{n}" and claims["exp"] - claims["iat"] == TOKEN_TTL_SECONDS
        assert verifier.verify(token) == claims
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(tokens[0], "another-secret-that-is-32-chars-long!", algorithms=["HS256"])
    assert buyers_reached(7, 100) == 3 and buyers_reached(10_000, 100) == 100 and buyers_reached(0, 5) == 0


def test_profile_summary_drops_the_process_trunk(tmp_path):
    stacks = tmp_path / "p.txt"
    stacks.write_text(
        "serve (granian/server/mp.py:10);handler (app/x.py:3);decode (jwt/api.py:9) 3\n"
        "serve (granian/server/mp.py:10);handler (app/x.py:4) 1\n"
        "serve (granian/server/mp.py:10) 4\n"
    )
    summary = summarize(stacks)
    assert summary["samples"] == 8
    assert summary["own"][0] == {"frame": RUNTIME, "share": 0.5}
    assert {"frame": "handler (app/x.py)", "share": 0.5} in summary["inclusive"]


def test_each_sample_goes_to_the_innermost_layer_on_its_stack():
    app = ["serve (granian/server/mp.py:1)", "Litestar.__call__ (litestar/app.py:2)"]
    outer = "ExceptionHandlerMiddleware.__call__ (litestar/middleware/_internal/exceptions/middleware.py:3)"
    send = "ExceptionHandlerMiddleware.__call__.<locals>.capture_response_started (litestar/x/middleware.py:4)"
    auth = "Authenticator.authenticate (service/api/auth.py:5)"
    observe = "ObserveRequests.__call__.<locals>.send_observed (service/api/request_telemetry.py:6)"
    route = "HTTPRoute.handle (litestar/routes/http.py:7)"
    telemetry, authentication = LAYERS[1][0], LAYERS[0][0]
    assert layer_of([*app, outer, auth, "Headers.from_scope (litestar/datastructures/headers.py:8)"]) == authentication
    stream = "Request.stream (litestar/connection/request.py:9)"
    assert layer_of([*app, outer, route, stream]) == FRAMEWORK
    assert layer_of([*app, outer, auth, observe, route, stream]) == FRAMEWORK  # the route's own work
    assert layer_of([*app, outer, route, "noop (toolkit/bench/product_app.py:1)", stream]) == OTHER_OURS
    assert layer_of([*app, outer, outer]) == SECOND_EXCEPTION_LAYER  # the inner one's own time
    # the send chain: the route's wrapper calls the telemetry's, which calls the app's (granian's send)
    assert layer_of([*app, outer, outer, route, send]) == SECOND_EXCEPTION_LAYER
    assert layer_of([*app, outer, outer, route, send, observe]) == telemetry
    assert layer_of([*app, outer, outer, route, send, observe, send]) == FRAMEWORK
    assert layer_of(app[:1]) == RUNTIME


def test_the_accept_ceiling_is_what_the_publish_hop_leaves_of_a_no_op():
    # per server CPU-s: 8,000 no-ops and 2,000 publishes -> 125 + 500 us; a no-op's share 0.2
    rows = [
        Row("product_noop", "product no-op", "req/s", 8000.0, 1, 1.0, cpu={"server": 1.0}),
        Row("publish", "publish only", "msgs/s", 1000.0, 1, 1.0, cpu={"server": 0.5}),
    ]
    assert accept_ceiling(rows) is None  # ratios not filled yet
    fill_ratios(rows)
    assert accept_ceiling(rows) == 0.2
    assert accept_ceiling(rows[:1]) is None


def test_the_report_renders_and_serializes(tmp_path):
    rows = [
        Row("bare_noop", "bare no-op", "req/s", 1000.0, 1, 1.0, p99_ms=10.0, cpu={"server": 1.0, "machine": 0.5}),
        Row("product_noop", "product no-op", "req/s", 800.0, 1, 1.0, "bare_noop", statuses={"202": 1}, rounds=[800.0]),
    ]
    fill_ratios(rows)
    summary = {
        "samples": 1,
        "own": [{"frame": RUNTIME, "share": 1.0}],
        "inclusive": [],
        "layers": [{"frame": RUNTIME, "share": 1.0}],
    }
    report = Report(
        "bench_x",
        "2026-11-30T00:00:00+00:00",
        machine_info(),
        Options(profile_dir=tmp_path),
        rows,
        judge(rows),
        accept_ceiling(rows),
        {"product_noop": summary},
        None,
    )
    console = Console(record=True, width=200)
    render(report, console)
    text = console.export_text()
    assert "product no-op" in text and "0.80" in text and "top by own time" in text
    assert "20,000 new buyers' tokens, each sent 3 times in a row" in text
    loaded = json.loads(json.dumps(report.as_json()))
    assert loaded["options"]["profile_dir"] == str(tmp_path) and Path(loaded["options"]["profile_dir"]).is_dir()
    assert [r["key"] for r in loaded["rows"]] == ["bare_noop", "product_noop"] and loaded["rows"][1]["ratio"] == 0.8
    assert loaded["targets"] == report.targets and loaded["profiles"]["product_noop"] == summary


def test_the_metrics_pairs_are_measured_together():
    from toolkit.bench.rows import METRICS_PAIRS, round_groups

    keys = [row.key for row in HTTP_ROWS]
    for on, off in METRICS_PAIRS.items():
        row = next(r for r in HTTP_ROWS if r.key == off)
        assert row.reference == on and row.server == "api-metrics-off"
        # the metrics-on twin is a server of its own, not the api server that creates the products
        assert next(r for r in HTTP_ROWS if r.key == on).server == "api-metrics-on"
    groups = [[row.key for row in group] for group in round_groups(HTTP_ROWS)]
    assert ["product_noop_paired", "product_noop_metrics_off"] in groups
    assert ["sold_out_paired", "sold_out_metrics_off"] in groups
    # the rows other targets divide by run alone, as every row they are compared with
    assert ["product_noop"] in groups and ["sold_out"] in groups and ["bare_noop"] in groups
    assert sorted(key for group in groups for key in group) == sorted(keys)
    assert all(len(group) == 1 for group in groups if group[0] not in METRICS_PAIRS)
    alone = [row for row in HTTP_ROWS if row.key != "sold_out_paired"]  # a twin without its pair runs alone
    assert ["sold_out_metrics_off"] in [[row.key for row in group] for group in round_groups(alone)]


def test_only_names_known_rows(monkeypatch):
    seen: list[Options] = []

    async def fake_run(settings, options, as_json):  # type: ignore[no-untyped-def]
        seen.append(options)
        return 0

    monkeypatch.setattr("toolkit.bench.run.run_bench", fake_run)
    monkeypatch.setenv("FLASHSALE_ENV", "development")
    get_settings.cache_clear()
    try:
        ok = CliRunner().invoke(main, ["bench", "--only", "product_noop, product_noop_metrics_off"])
        bad = CliRunner().invoke(main, ["bench", "--only", "product_noop,nope"])
    finally:
        get_settings.cache_clear()
    assert ok.exit_code == 0, ok.output
    assert seen[0].only == ("product_noop", "product_noop_metrics_off")
    assert seen[0].wants("product_noop") and not seen[0].wants("accept")
    assert Options().wants("accept")
    assert bad.exit_code == 2 and "unknown row nope" in bad.output


def test_the_metrics_targets_compare_the_cpu_a_request_takes_not_the_rate():
    rows = [
        # metrics on: fewer req/s (outside load took the CPU), the same CPU per request
        Row("product_noop_paired", "on", "req/s", 900.0, 1, 1.0, cpu={"server": 0.9}),
        Row("product_noop_metrics_off", "off", "req/s", 1000.0, 1, 1.0, "product_noop_paired", cpu={"server": 1.0}),
        Row("sold_out_paired", "on", "req/s", 1000.0, 1, 1.0, cpu={"server": 1.0}),
        Row("sold_out_metrics_off", "off", "req/s", 1000.0, 1, 1.0, "sold_out_paired", cpu={"server": 0.9}),
    ]
    fill_ratios(rows)
    verdicts = {v["target"]: v for v in judge(rows)}
    assert verdicts["product no-op per CPU-s, metrics on >= 0.95 x off"] == {
        "target": "product no-op per CPU-s, metrics on >= 0.95 x off",
        "ratio": 1.0,
        "pass": True,
    }
    assert verdicts["sold out per CPU-s, metrics on >= 0.95 x off"]["ratio"] == 0.9  # 10 % more CPU per request
    assert verdicts["sold out per CPU-s, metrics on >= 0.95 x off"]["pass"] is False


def test_the_bench_servers_run_no_self_healing_pass_over_the_accept_rows_journal(monkeypatch):
    monkeypatch.setenv("FLASHSALE_ENV", "development")
    settings = bench_settings(get_settings(), "bench_test")
    # no consumer runs during the accept rows: their reservations stay unresolved for the whole run,
    # and a pass over them would be billed to the next row on the api server alone
    assert settings.realign.auto_seconds == 0
    assert (settings.rate_limit.user_per_second, settings.rate_limit.address_per_second) == (0.0, 0.0)


async def test_the_no_op_route_is_the_benchs_not_the_products(monkeypatch):
    """The product API mounts no benchmark route; the bench's app is the product plus
    ``POST /api/v1/bench/noop``, behind the purchase route's JWT auth and strict body decoding."""
    import httpx

    from service.api.app import create_app
    from service.api.tokens import issue_token
    from toolkit.bench.product_app import create_app as create_bench_app

    monkeypatch.setenv("FLASHSALE_ENV", "development")
    get_settings.cache_clear()
    try:
        settings = get_settings()
        product = {route.path for route in create_app(settings).routes}
        bench_app = create_bench_app(settings)
    finally:
        get_settings.cache_clear()
    assert "/api/v1/orders" in product and not any("/bench" in path for path in product)
    assert {route.path for route in bench_app.routes} == product | {"/api/v1/bench/noop"}
    buyer = {"Authorization": f"Bearer {issue_token(settings.auth.jwt_secret, 'bench-user')}"}
    transport = httpx.ASGITransport(app=bench_app)  # no lifespan: the route needs no store
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        ok = await client.post("/api/v1/bench/noop", json={"product_id": 1, "quantity": 1}, headers=buyer)
        anonymous = await client.post("/api/v1/bench/noop", json={"product_id": 1, "quantity": 1})
        bad = await client.post("/api/v1/bench/noop", json={"product_id": "x", "quantity": 1}, headers=buyer)
    assert (ok.status_code, ok.json()) == (202, {"status": "noop"})
    assert (anonymous.status_code, bad.status_code) == (401, 400)


def _pipeline_rows() -> list[Row]:
    # groups: 1,000 orders/s on 0.5 API + 0.3 consumers + 0.05 RabbitMQ cores, the machine 40 % of 2 CPUs
    groups = {"server": 0.5, "consumers": 0.3, "rabbitmq": 0.05, "redis": 0.1, "mysql": 0.05, "client": 0.1}
    single = {"server": 0.6, "consumers": 0.4, "rabbitmq": 0.3, "redis": 0.1, "mysql": 0.1, "client": 0.1}
    return [
        Row(
            "pipeline",
            "groups",
            "orders/s",
            1000.0,
            1,
            1.0,
            "pipeline_single",
            p99_ms=11.0,
            cpu=groups | {"machine": 0.4},
        ),
        Row("pipeline_single", "single", "orders/s", 500.0, 1, 1.0, p99_ms=10.0, cpu=single | {"machine": 0.8}),
    ]


def test_the_pipeline_rows_cost_cpu_seconds_per_durable_order():
    rows = _pipeline_rows()
    for row in rows:
        fill_cpu_per_order(row, cpus=2)
    fill_ratios(rows)
    groups, single = rows
    assert groups.cpu_per_order["server"] == 0.0005 and groups.cpu_per_order["rabbitmq"] == 0.00005
    assert groups.cpu_per_order["machine"] == 0.0008  # 0.4 x 2 CPUs / 1,000 orders/s
    assert groups.cpu_per_order["service"] == 0.001  # API, consumers and stores: the client is not the service
    assert single.cpu_per_order["machine"] == 0.0032 and single.cpu_per_order["rabbitmq"] == 0.0006
    assert groups.ratio == 2.0  # durable orders per second, groups / GROUP_MAX=1
    verdicts = {v["target"]: v for v in judge(rows)}
    assert verdicts["pipeline machine CPU-s per order, groups <= 0.67 x GROUP_MAX=1"]["ratio"] == 0.25
    assert verdicts["pipeline RabbitMQ CPU per order, groups <= 0.2 x GROUP_MAX=1"]["ratio"] == 0.083
    assert verdicts["pipeline accept p99, groups <= 1.2 x GROUP_MAX=1"] == {
        "target": "pipeline accept p99, groups <= 1.2 x GROUP_MAX=1",
        "ratio": 1.1,
        "pass": True,
    }
    absolute, against_floor = (
        "pipeline machine CPU-ms per durable order, groups <= 0.6",
        "pipeline machine CPU per durable order, groups <= 3 x the floor",
    )
    assert verdicts[absolute] == {"target": absolute, "ratio": 0.8, "pass": False}  # in ms, no reference
    assert verdicts[against_floor]["pass"] is None  # no floor measured
    assert all(verdicts[label]["pass"] for label in verdicts if label.startswith("pipeline") and "x GROUP" in label)
    floor = Row("floor", "floor: the hops alone", "orders/CPU-s", 2500.0, 0, 0.0, cpu_per_order={"service": 0.0004})
    verdicts = {v["target"]: v for v in judge([*rows, floor])}
    assert verdicts[against_floor] == {"target": against_floor, "ratio": 2.0, "pass": True}  # machine / floor's service


def test_the_floor_adds_the_hops_by_the_process_that_does_them_in_the_pipeline():
    rows = [
        Row("bare_noop", "bare no-op", "req/s", 10_000.0, 1, 1.0, cpu={"server": 1.0, "redis": 0.3}),
        Row("reserve", "reserve only", "res/s", 20_000.0, 1, 1.0, cpu={"server": 1.0, "redis": 0.5}),
        Row("publish", "publish only", "msgs/s", 5_000.0, 1, 1.0, cpu={"server": 0.5, "rabbitmq": 0.25}),
        Row("raw_batch", "raw 100/tx", "orders/s", 25_000.0, 1, 1.0, cpu={"client": 0.5, "mysql": 1.0}),
    ]
    assert floor_row(rows[1:]) is None  # a hop missing
    floor = floor_row(rows)
    assert floor is not None and floor.key == "floor"
    # us per order: server 100 + 50 + 100, redis 25 (the bare no-op's Redis is no hop's), RabbitMQ 50,
    # consumers (the writer) 20, MySQL 40
    assert floor.cpu_per_order == {
        "server": 0.00025,
        "redis": 0.000025,
        "rabbitmq": 0.00005,
        "consumers": 0.00002,
        "mysql": 0.00004,
        "service": 0.000385,
    }
    assert floor.rate == round(1 / 0.000385, 1)


def test_the_pipeline_table_sets_the_service_against_the_floor(tmp_path):
    rows = _pipeline_rows()
    for row in rows:
        fill_cpu_per_order(row, cpus=2)
    floor = Row("floor", "floor: the hops alone", "orders/CPU-s", 2000.0, 0, 0.0, cpu_per_order={"service": 0.0005})
    rows.append(floor)
    fill_ratios(rows)
    report = Report("bench_x", "now", machine_info(), Options(), rows, judge(rows), None, {}, None)
    console = Console(record=True, width=250)
    render(report, console)
    text = console.export_text()
    assert "CPU-ms per durable order" in text
    groups_line = next(line for line in text.splitlines() if "groups" in line and "1.000" in line)
    assert "2.00" in groups_line  # service 1.0 ms / floor 0.5 ms
    throughput = text.split("CPU (cores")[0]
    assert "floor" not in throughput  # the floor is no measured rate


def test_a_process_that_exits_between_two_readings_takes_no_cpu_away():
    before = CpuSample((100, 200), {"rabbitmq": {1: 5.0, 2: 50.0}})
    after = CpuSample((150, 400), {"rabbitmq": {1: 6.0}})  # pid 2 exited
    assert before.shares(after, 2.0) == {"rabbitmq": 0.5, "machine": 0.25}


def test_rounds_merge_into_cpu_seconds_per_order_over_all_rounds():
    # 100 orders in 1 s on 1 core, then 900 in 3 s on 0.5: 2.5 CPU-s for 1,000 orders
    rounds = [
        Row("pipeline", "groups", "orders/s", 100.0, 100, 1.0, cpu={"server": 1.0, "machine": 0.6}),
        Row("pipeline", "groups", "orders/s", 300.0, 900, 3.0, cpu={"server": 0.5, "machine": 0.2}),
    ]
    merged = merge_rounds(rounds)
    assert (merged.rate, merged.rounds) == (250.0, [100.0, 300.0])
    assert merged.cpu == {"server": 0.625, "machine": 0.3}
    fill_cpu_per_order(merged, cpus=2)
    assert merged.cpu_per_order["server"] == 0.0025 and merged.cpu_per_order["machine"] == 0.0024  # 0.3 x 2 CPUs x 4 s


def test_every_target_reads_a_metric_rows_have():
    row = Row(
        "x",
        "x",
        "orders/s",
        1.0,
        1,
        1.0,
        p99_ms=1.0,
        per_server_cpu=1.0,
        cpu_per_order=dict.fromkeys(
            ("server", "consumers", "rabbitmq", "redis", "mysql", "client", "machine", "service"), 1.0
        ),
    )
    known = {r.key for r in HTTP_ROWS} | {key for key, _, _ in DRAIN_ROWS} | {p.key for p in PIPELINE_ROWS}
    for target in TARGETS:
        assert target.value(row, target.reference_metric) == 1.0, target
        assert {target.row, target.reference} <= known | {"floor", None}, target


def test_the_two_worker_row_is_the_accept_load_on_a_server_of_two_workers():
    row = next(r for r in HTTP_ROWS if r.key == "accept_2w")
    spec = next(s for s in SERVERS if s.name == row.server)
    assert (row.target, row.expect, row.reference) == ("accept", 202, "accept")
    assert (spec.kind, spec.workers, spec.env) == ("api", 2, {})
