"""The commands that try the whole service on the real servers: ``sale`` (a flash sale end to
end, every invariant checked) and ``bench`` (each hop measured side by side)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from service.cli.common import load_settings, run


def _broker_nodes(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    """``--rabbitmq-cluster``: comma-separated ``amqp://``/``amqps://`` URLs, at least one."""
    if value is None:
        return None
    urls = [url.strip() for url in value.split(",") if url.strip()]
    wrong = [url for url in urls if not url.startswith(("amqp://", "amqps://"))]
    if not urls or wrong:
        raise click.BadParameter("give the nodes' amqp:// URLs, separated by commas")
    return urls


SALE_USERS = 20_000
# A crowd's scripted fifth polls every 100 ms: 2,000 buyers ask about 4,000 requests a second,
# what one two-core box running both the crowd and the service keeps up with; bigger crowds
# (--users 20000) want more crowd workers or hosts.
CROWD_USERS = 2_000


@click.command()
@click.option("--stock", default=1000, show_default=True, type=click.IntRange(1), help="Units on sale.")
@click.option(
    "--requests", "requests_", default=50_000, show_default=True, type=click.IntRange(1), help="Purchase requests."
)
@click.option(
    "--users",
    default=None,
    type=click.IntRange(1),
    help=f"Distinct buyers (JWTs). [default: {SALE_USERS:,}; {CROWD_USERS:,} with --waiting-room or --crowd]",
)
@click.option(
    "--concurrency", default=256, show_default=True, type=click.IntRange(1), help="Requests in flight at once."
)
@click.option("--limit", "per_user_limit", default=2, show_default=True, type=click.IntRange(1), help="Per-user limit.")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1), help="API workers to start.")
@click.option("--consumers", default=2, show_default=True, type=click.IntRange(1), help="Consumer processes to start.")
@click.option(
    "--buckets",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Redis stock buckets of the sale's product (a product hotter than one Redis Cluster slot).",
)
@click.option(
    "--partitions",
    default=None,
    type=click.IntRange(1, 64),
    help="Order-queue partitions of the run (default FLASHSALE_AMQP__PARTITIONS; with --url, the running API's); "
    "consumer i takes partitions j with j mod consumers = i (with more consumers than partitions, partition "
    "i mod N), so every partition has a consumer.",
)
@click.option("--url", default=None, help="Target a running API instead of starting one (admin token from settings).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--noop-requests",
    default=10_000,
    show_default=True,
    type=click.IntRange(0),
    help="Requests to the no-op route before the load: the ceiling of the sale's own client (0: none).",
)
@click.option(
    "--pay-share",
    default=0.0,
    show_default=True,
    type=click.FloatRange(0, 1),
    help="Share of the orders to pay after the drain; the rest time out, are swept and resold (0: off).",
)
@click.option(
    "--payment-window",
    default=5,
    show_default=True,
    type=click.IntRange(1),
    metavar="SECONDS",
    help="Payment window of the run's API and sweep, with --pay-share.",
)
@click.option(
    "--publish-mode",
    type=click.Choice(["confirm", "async"]),
    default=None,
    help="FLASHSALE_ORDERS__PUBLISH_MODE of the API processes it starts (default: from settings).",
)
@click.option(
    "--report",
    "report_dir",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="Also write an HTML report with charts (report.html and PNGs) to DIR.",
)
@click.option(
    "--redis-cluster",
    "cluster_node",
    default=None,
    metavar="URL",
    help="Run on the running Redis Cluster that has this node (redis://HOST:PORT): "
    "FLASHSALE_REDIS__URL=URL and FLASHSALE_REDIS__CLUSTER=true for every process of the sale.",
)
@click.option(
    "--rabbitmq-cluster",
    "broker_nodes",
    default=None,
    callback=_broker_nodes,
    metavar="URL,URL,...",
    help="Run on the running RabbitMQ cluster with these nodes (amqp://..., comma-separated): "
    "FLASHSALE_AMQP__URL=the first and FLASHSALE_AMQP__FAILOVER_URLS=the others for every process of the sale.",
)
@click.option(
    "--waiting-room",
    is_flag=True,
    help="The product has the waiting room: a crowd of --users buyers (some before the opening, some impatient, "
    "some scripted) goes through it; the report adds fairness and the room's invariants.",
)
@click.option(
    "--crowd",
    is_flag=True,
    help="The same crowd as --waiting-room, straight at the purchase route: the fairness figures without the room.",
)
@click.option("--seed", default=None, help="Draw the crowd from this seed (default: the run id), to compare runs.")
@click.option(
    "--crowd-workers",
    default=None,
    type=click.IntRange(1),
    help="Local Locust worker processes sending the crowd's requests. [default: one per core]",
)
@click.option(
    "--remote-workers",
    default=0,
    show_default=True,
    type=click.IntRange(0),
    help="Locust workers to wait for from other hosts (flashsale sale-worker --master BIND:PORT on each).",
)
@click.option(
    "--bind",
    default="127.0.0.1",
    show_default=True,
    help="Address the API, the channel simulator, the Locust master and its web UI listen on "
    "(one that other hosts reach, with --remote-workers).",
)
@click.option(
    "--master-port", default=None, type=click.IntRange(1, 65535), help="The Locust master's port. [default: a free one]"
)
@click.option("--web", is_flag=True, help="Keep Locust's web UI open during every wave (headless by default).")
@click.option(
    "--web-port", default=8089, show_default=True, type=click.IntRange(1, 65535), help="Locust's web UI port."
)
def sale(cluster_node: str | None, broker_nodes: list[str] | None, **options: Any) -> None:
    """Run a whole flash sale end to end on the real services and check every invariant."""
    from toolkit.sale.job import run_sale

    if (options["waiting_room"] or options["crowd"]) and options["pay_share"]:
        raise click.UsageError("--pay-share does not combine with --waiting-room or --crowd")
    if options["users"] is None:
        options["users"] = CROWD_USERS if options["waiting_room"] or options["crowd"] else SALE_USERS
    if options["crowd_workers"] is None:
        options["crowd_workers"] = os.cpu_count() or 1
    settings = load_settings()
    if cluster_node is not None:
        redis = settings.redis.model_copy(update={"url": cluster_node, "cluster": True})
        settings = settings.model_copy(update={"redis": redis})
    if broker_nodes:
        amqp = settings.amqp.model_copy(update={"url": broker_nodes[0], "failover_urls": broker_nodes[1:]})
        settings = settings.model_copy(update={"amqp": amqp})
    sys.exit(run(run_sale(settings, **options)))


def _master_address(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, int]:
    """``--master HOST:PORT``."""
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise click.BadParameter("give the master as HOST:PORT (flashsale sale prints it)")
    return host, int(port)


@click.command("sale-worker")
@click.option(
    "--master", "master", required=True, callback=_master_address, metavar="HOST:PORT", help="The sale's Locust master."
)
@click.option(
    "--processes",
    default=None,
    type=click.IntRange(1),
    help="Worker processes on this host. [default: one per core]",
)
def sale_worker(master: tuple[str, int], processes: int | None) -> None:
    """Send part of a flashsale sale's crowd from this host: Locust workers with the shipped
    locustfile, joining the master of every wave of the sale in turn. Ends when no master has
    come for five minutes (or on Ctrl-C)."""
    import subprocess

    from toolkit.sale.swarm import locust_argv

    host, port = master
    argv = locust_argv("--worker", "--master-host", host, "--master-port", str(port))
    if (count := processes or os.cpu_count() or 1) > 1:
        argv += ["--processes", str(count)]
    while subprocess.run(argv, check=False).returncode == 0:  # a wave ended; join the next one
        pass


def _bench_rows(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
    """``--only``: comma-separated row keys of ``flashsale bench``, each a known one."""
    from toolkit.bench.rows import all_row_keys

    keys = tuple(key.strip() for key in value.split(",") if key.strip())
    unknown = [key for key in keys if key not in all_row_keys()]
    if unknown:
        raise click.BadParameter(f"unknown row {', '.join(unknown)}; rows: {', '.join(all_row_keys())}")
    return keys


@click.command()
@click.option(
    "--duration",
    default=8,
    show_default=True,
    type=click.IntRange(1, 600),
    metavar="SECONDS",
    help="Measured load per HTTP row and round (whole seconds).",
)
@click.option("--connections", default=64, show_default=True, type=click.IntRange(1, 10_000), help="wrk connections.")
@click.option("--threads", default=1, show_default=True, type=click.IntRange(1, 64), help="wrk threads.")
@click.option(
    "--workers", default=1, show_default=True, type=click.IntRange(1, 64), help="granian workers of every server."
)
@click.option(
    "--backlog",
    default=20_000,
    show_default=True,
    type=click.IntRange(1, 1_000_000),
    help="Orders for the consumer and raw-writer rows.",
)
@click.option(
    "--consumers",
    default=2,
    show_default=True,
    type=click.IntRange(1, 16),
    help="flashsale consume processes draining the backlog together (and running in the pipeline rows).",
)
@click.option(
    "--batch",
    default=100,
    show_default=True,
    type=click.IntRange(2, 1000),
    help="Orders per transaction of the batched raw writer.",
)
@click.option(
    "--rounds",
    default=1,
    show_default=True,
    type=click.IntRange(1, 20),
    help="Measure every row this many times, interleaved.",
)
@click.option(
    "--profile",
    "profile_dir",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="Run py-spy on the server under each HTTP row and on the consumers draining the backlog (first round); "
    "stacks and summaries in DIR.",
)
@click.option(
    "--only",
    default="",
    metavar="ROWS",
    callback=_bench_rows,
    help="Measure only these rows (comma-separated keys, e.g. product_noop_paired,product_noop_metrics_off; "
    "the drain rows run together when one is named). Default: every row.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def bench(as_json: bool, **options) -> None:  # type: ignore[no-untyped-def]
    """Measure each hop (bare framework, no-op, sold out, accept, reserve, publish, consumer,
    raw MySQL writers) and the whole pipeline, HTTP to MySQL, with groups and with GROUP_MAX=1,
    side by side in one isolated run, with wrk and many buyers as the load. Exit 0 when every row was
    measured (targets are reported, not enforced), 2 when it could not run."""
    from toolkit.bench.context import Options
    from toolkit.bench.run import run_bench

    sys.exit(run(run_bench(load_settings(), Options(**options), as_json)))
