"""``flashsale sale``: a whole flash sale end to end on the real services, every invariant checked.

Phases: isolate, start the API and the consumers, create the product, measure the framework
ceiling (the no-op wave), send the purchase load, wait for the queue to drain, with
``--pay-share`` run the order lifecycle, realign, read the stores, check the invariants
(:mod:`toolkit.sale.invariants`), report (:mod:`toolkit.sale.render`), stop the processes and
clean up. The phases themselves, the no-op ceiling and the order lifecycle are described in
:mod:`toolkit.sale.phases`.

Package layout; imports flow one way, each module imports only modules left of it:
``plan`` (plan and answer types) -> ``crowd`` (the crowd's buyers and what they saw) -> ``facts``
(what the stores hold) -> ``report`` (summary numbers) -> ``invariants`` (checks 1-8) ->
``fairness`` (the crowd's fairness figures) -> ``room_checks`` (checks 9-12) -> ``verdict`` (server-
or client-bound) -> ``render`` (JSON document, tables); ``errors``, ``isolation`` (run ids,
settings, child environment), ``processes`` (subprocesses), ``stores`` (connections, set-up and
tear-down) -> ``sampler`` (the queue over time), ``swarm`` (one wave on the Locust crowd) ->
``waves`` (errands, what a wave cost) -> ``phases`` -> ``crowd_wave`` -> ``job`` (this module, the
entry :func:`run_sale`). The crowd itself runs in Locust's processes, not here:
``swarm_plan`` (what goes out to it and comes back) <- ``swarm_users`` (the user classes) <-
``locustfile`` (the master's and workers' messages).

Isolation (default). The run gets an id ``sale_<8 hex>`` and settings of its own derived from
the given ones: database ``<run id>`` on the same MySQL server (created by
``db.migrate.upgrade``), Redis key prefix ``<run id>``, AMQP exchange, queue and dead-letter
names ``<run id>.orders...`` (``<run id>.orders.p<i>`` per partition with ``--partitions``)
and a random JWT secret. The API (``flashsale serve`` on a free port) and the consumers
(``flashsale consume``, each with its share of the partitions) get these through
``FLASHSALE_*`` environment variables. At the end, success or failure, the processes are stopped (SIGTERM, then SIGKILL
after a timeout) and the database, the Redis keys under the prefix and the queues and exchanges
are removed. Nothing outside the run is touched.

``--url``. The API is already running, so its database, Redis prefix and queues are whatever it
uses; the settings as given must be the same (the admin token is signed with
``settings.auth.jwt_secret``). The sale creates a product with a random id in [10^9, 2*10^9)
through the admin route and still starts ``consumers`` consumer processes with those settings:
competing with consumers already attached to the queue is safe (the unique request id makes
every order exactly-once) and guarantees the queue drains. Only that product's rows and keys and
the dead letters added during the run are checked; nothing is cleaned up (the product and its
orders stay, as any sale's would).

Exit status: 0 when every invariant holds, 1 when one fails, 2 when the sale could not be set up
(a service unreachable, the API not ready, the product not created), 130 when interrupted
(SIGINT or SIGTERM; the clean-up still runs). Subprocess logs go to a temporary directory,
removed after a clean run and printed otherwise.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path

import aio_pika
import httpx
import msgspec
from rich.console import Console

from service.adapters.broker_topology import declare_topology
from service.api.tokens import issue_token
from service.log_setup import configure_logging
from service.settings import Settings
from toolkit.sale.crowd_wave import crowd_wave
from toolkit.sale.errors import SetupError, stderr
from toolkit.sale.facts import Measured
from toolkit.sale.isolation import Sale, child_env, consumer_partitions, free_port, new_sale, simulator_url
from toolkit.sale.phases import (
    PRICE,
    Load,
    accepted_orders,
    drain,
    first_waves,
    open_sale,
    run_lifecycle,
)
from toolkit.sale.processes import Processes
from toolkit.sale.render import build_report, render
from toolkit.sale.sampler import sampling_queue
from toolkit.sale.stores import Stores, isolate
from toolkit.sale.swarm import CrowdHosts
from toolkit.sale.waves import Sender


def api_argv(host: str, port: str, workers: int) -> list[str]:
    """The sale's API: the product as ``flashsale serve`` starts it, plus the no-op route of the
    framework ceiling (``toolkit.bench.product_app``, served by ``toolkit.bench.server --api``).
    Named by module, not imported: the bench builds on the sale's isolation, not the reverse."""
    target = "toolkit.bench.product_app:create_app"
    argv = [sys.executable, "-m", "toolkit.bench.server", target, "--host", host, "--port", port]
    return [*argv, "--workers", str(workers), "--api"]


async def _start(
    stack: AsyncExitStack, sale: Sale, processes: Processes, workers: int, consumers: int, with_channels: bool
) -> Stores:
    """Isolate (unless ``--url``), connect, start the processes (the channel simulator too with
    ``with_channels``); stopped and removed by ``stack``.

    Returns the sale's connections; raises SetupError when something cannot be set up.
    """
    if sale.isolated:
        await isolate(stack, sale)
    stores = await Stores.open(stack, sale.settings)
    amqp = sale.settings.amqp
    if sale.isolated:
        await declare_topology(stores.channel, amqp)
    stack.push_async_callback(processes.stop)
    if sale.isolated:
        api = httpx.URL(sale.url)
        await processes.start_argv("api", api_argv(api.host, str(api.port), workers))
        if with_channels:
            channel_port = str(httpx.URL(simulator_url(sale.settings)).port)
            await processes.start("channel", "channel", "serve", "--host", api.host, "--port", channel_port)
    for number, partitions in enumerate(consumer_partitions(consumers, amqp.partitions), start=1):
        chosen = ["--partitions", ",".join(map(str, partitions))] if amqp.partitions > 1 else []
        await processes.start(f"consumer-{number}", "consume", *chosen)
    return stores


async def _measure(
    sale: Sale, processes: Processes, console: Console, load: Load, hosts: CrowdHosts, workers: int, consumers: int
) -> Measured:
    """Every phase from set-up to the stores' final state; stops and cleans up on the way out."""
    async with AsyncExitStack() as stack:
        stores = await _start(stack, sale, processes, workers, consumers, bool(load.pay_share))
        try:
            dead_letters_before = await stores.queue_depth(sale.settings.amqp.dead_letter_queue)
        except aio_pika.exceptions.AMQPError as exc:
            raise SetupError(f"dead-letter queue {sale.settings.amqp.dead_letter_queue!r} not found: {exc!r}") from exc
        noop_skip = await open_sale(sale, processes, console, load.noop_requests)
        _where_to_watch(sale, hosts, console)
        noop_requests = 0 if noop_skip else load.noop_requests
        send = Sender(sale, hosts, processes, console, load.concurrency)
        crowd = None
        async with sampling_queue(sale.settings, sale.product_id) as timeline:  # until the last drain
            if load.crowd_seed is None:
                noop, purchase, token_seconds = await first_waves(send, load, noop_requests)
            else:
                noop, token_seconds = None, 0.0
                admission = sale.settings.waiting_room.admission_ttl_seconds
                room = sale.settings.waiting_room
                depart = (room.depart_after_polls, room.poll_max_ms, room.depart_grace_ms, room.opening_draw_ms)
                purchase, crowd = await crowd_wave(send, load.users, load.crowd_seed, admission, depart)
            orders = accepted_orders(purchase)
            drain_seconds = await drain(stores, sale, orders, processes, console)
            lifecycle = None
            if load.pay_share and drain_seconds is not None:
                lifecycle = await run_lifecycle(stores, send, load, orders)
        realignment = await stores.realign(sale.product_id)
        facts = await stores.facts(sale.product_id, dead_letters_before)
    return Measured(
        purchase,
        noop,
        noop_skip,
        lifecycle,
        token_seconds,
        drain_seconds,
        realignment,
        facts,
        tuple(timeline),
        crowd,
        tuple(send.loads),
    )


def _where_to_watch(sale: Sale, hosts: CrowdHosts, console: Console) -> None:
    """The API, an admin token for its ops page, Locust's web UI (``--web``) and, when workers
    are expected from other hosts, the command for them."""
    ttl = ADMIN_TOKEN_SECONDS
    admin = issue_token(sale.settings.auth.jwt_secret, "sale-admin", admin=True, ttl_seconds=ttl)
    console.print(f"API: {sale.url}", soft_wrap=True)
    console.print(f"admin token (valid {ttl // 60} min): {admin}", soft_wrap=True)
    console.print(f"ops page: {sale.url}/ops#token={admin}", soft_wrap=True)
    ui = f"http://{hosts.bind}:{hosts.web_port}" if hosts.web else "off (headless; --web opens it)"
    workers = f"{hosts.workers} local worker{'' if hosts.workers == 1 else 's'}"
    console.print(f"Locust: master {hosts.bind}:{hosts.master_port}, {workers}, web UI {ui}")
    if hosts.remote:
        console.print(f"waiting for {hosts.remote} workers from other hosts; on each run: {hosts.worker_command()}")


ADMIN_TOKEN_SECONDS = 3600
"""The printed admin token's lifetime: long enough to watch a whole rehearsal on the ops page."""


CROWD_ADMISSION_SECONDS = 15
"""The admissions' lifetime in a sale through the waiting room: short, so an impatient buyer's
lapsed turn passes on within the run, yet well above the longest poll interval (5 s) plus the
seconds a request can wait in a crowd that shares a loaded box (with 5 s and the earlier
in-process client, honest buyers who polled as told lost a fifth of their turns to it)."""


def _quiet_logs() -> None:
    """This process logs warnings and up to (on stderr): stdout is the report's."""
    configure_logging("WARNING")


def _failed(sale: Sale, processes: Processes, message: str, status: int, as_json: bool) -> int:
    """Say why the sale ended without a report (stderr; with ``as_json`` also one JSON document
    ``{"ok": false, "run_id", "error", "logs"}`` on stdout) and return ``status``."""
    stderr.print(f"[bold red]{message}[/]\nprocess logs: {processes.log_dir}")
    if as_json:
        failure = {"ok": False, "run_id": sale.run_id, "error": message, "logs": str(processes.log_dir)}
        print(msgspec.json.encode(failure).decode())
    return status


async def run_sale(
    settings: Settings,
    *,
    stock: int,
    requests_: int,
    users: int,
    concurrency: int,
    per_user_limit: int,
    workers: int,
    consumers: int,
    buckets: int,
    url: str | None,
    partitions: int | None = None,
    as_json: bool,
    noop_requests: int,
    pay_share: float,
    payment_window: int,
    publish_mode: str | None = None,
    report_dir: Path | None = None,
    waiting_room: bool = False,
    crowd: bool = False,
    seed: str | None = None,
    crowd_workers: int = 1,
    remote_workers: int = 0,
    bind: str = "127.0.0.1",
    master_port: int | None = None,
    web: bool = False,
    web_port: int = 8089,
) -> int:
    """``flashsale sale`` (see the module docstring); returns the exit status: 0 every invariant
    holds, 1 one failed, 2 set-up failed, 130 interrupted. Prints the report to stdout (rich tables, or exactly one
    JSON document with ``as_json``); progress and errors go to stderr. ``pay_share`` > 0 needs
    ``url`` None (the sweep cancels every unpaid order of the database past the window);
    ``payment_window`` in seconds applies only then. ``publish_mode`` (``confirm``/``async``)
    overrides the setting for the API processes the sale starts (not for a ``url``);
    ``partitions`` (``FLASHSALE_AMQP__PARTITIONS`` when None) the order-queue partitions of every
    process of the run, each consumer taking its share (:func:`consumer_partitions`; with ``url``
    it must be the running API's). With
    ``report_dir`` an HTML report with charts is written there too (:mod:`toolkit.sale.charts`).
    ``waiting_room``: the product gets the waiting room and the purchase wave is a crowd going
    through it; ``crowd``: the same crowd straight at the purchase route (the comparison); both
    draw the crowd of ``users`` buyers from ``seed`` (the run id when None), take no no-op wave
    and no ``pay_share``. An isolated run with the room gives admissions
    :data:`CROWD_ADMISSION_SECONDS`. The crowd: ``crowd_workers`` local Locust worker processes
    and ``remote_workers`` more from other hosts, its master on ``bind`` at ``master_port`` (a
    free port when None); the API the sale starts listens on ``bind`` too; ``web`` keeps
    Locust's web UI open on ``web_port`` during every wave."""
    began = time.perf_counter()
    _quiet_logs()
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)  # clean up as on Ctrl-C
    console = Console(stderr=True, quiet=as_json)
    window = payment_window if pay_share else None
    if partitions is not None:
        settings = settings.model_copy(update={"amqp": settings.amqp.model_copy(update={"partitions": partitions})})
    if publish_mode is not None:
        settings = settings.model_copy(
            update={"orders": settings.orders.model_copy(update={"publish_mode": publish_mode})}
        )
    crowd = crowd or waiting_room
    noop_requests = 0 if crowd else noop_requests
    if waiting_room and url is None:
        room = settings.waiting_room.model_copy(update={"admission_ttl_seconds": CROWD_ADMISSION_SECONDS})
        settings = settings.model_copy(update={"waiting_room": room})
    sale = replace(new_sale(settings, url, stock, per_user_limit, window, buckets, bind), waiting_room=waiting_room)
    port = master_port or free_port(bind)
    hosts = CrowdHosts(crowd_workers, remote_workers, bind, port, web, web_port)
    processes = Processes(child_env(sale.settings), Path(tempfile.mkdtemp(prefix=f"flashsale-{sale.run_id}-")))
    try:
        load = Load(requests_, users, concurrency, noop_requests, pay_share, (seed or sale.run_id) if crowd else None)
        measured = await _measure(sale, processes, console, load, hosts, workers, consumers)
    except SetupError as exc:
        return _failed(sale, processes, f"set-up failed: {exc}", 2, as_json)
    except asyncio.CancelledError:
        cleaned = ", run data removed" if sale.isolated else ""
        return _failed(sale, processes, f"interrupted; processes stopped{cleaned}", 130, as_json)

    run = {
        "run_id": sale.run_id,
        "isolated": sale.isolated,
        "url": sale.url,
        "product_id": sale.product_id,
        "stock": stock,
        "per_user_limit": per_user_limit,
        "price": PRICE,
        "requests": requests_,
        "users": users,
        "concurrency": concurrency,
        "workers": workers if sale.isolated else None,
        "consumers": consumers,
        "buckets": buckets,
        "partitions": sale.settings.amqp.partitions,
        "consumer_partitions": consumer_partitions(consumers, sale.settings.amqp.partitions),
        "product_partition": sale.settings.amqp.partition_of(sale.product_id),
        "noop_requests": noop_requests,
        "pay_share": pay_share,
        "payment_window_seconds": window,
        "publish_mode": sale.settings.orders.publish_mode if sale.isolated else None,
        "waiting_room": waiting_room,
        "crowd_seed": load.crowd_seed,
        "admission_seconds": sale.settings.waiting_room.admission_ttl_seconds if waiting_room else None,
        "crowd_workers": crowd_workers,
        "remote_workers": remote_workers,
    }
    if crowd:
        run["requests"] = len(measured.purchase.outcomes)
    report = build_report(run, measured, time.perf_counter() - began, processes.exit_codes)
    if report["ok"] and not any(processes.exit_codes.values()):
        shutil.rmtree(processes.log_dir, ignore_errors=True)
    else:
        report["logs"] = str(processes.log_dir)
    if report_dir is not None:
        from toolkit.sale.charts import CHARTS_SKIPPED, charts_available, write_report

        if not charts_available():
            stderr.print(CHARTS_SKIPPED, soft_wrap=True, markup=False)  # one line, --json or not
        console.print(f"report: {write_report(report_dir, report, measured)}")
    if as_json:
        print(msgspec.json.encode(report).decode())
    else:
        render(report, Console(width=None if sys.stdout.isatty() else 120))
    return 0 if report["ok"] else 1
