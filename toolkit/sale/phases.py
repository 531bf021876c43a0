"""The phases of ``flashsale sale`` after start-up: open the sale (API ready, product created,
no-op route probed), the first waves (no-op ceiling and purchase load), drain, and the order
lifecycle (pay, let the window lapse, sweep, resell, drain again).

Framework ceiling (``--noop-requests N``, 0 = off). Before the purchase load, ``POST
/api/v1/bench/noop`` (:mod:`toolkit.bench.product_app`: JWT auth and body decoding, nothing else)
gets N requests built like the purchases (same JWTs, bodies, mix, concurrency and Locust crowd,
one code path: :class:`toolkit.sale.waves.Sender`). The report puts its throughput and latency next
to the purchase load's, with the ratios. When the route answers 404 (an API without the
no-op route: ``--url``) the wave is skipped and the report says so.

Order lifecycle (``--pay-share S``, isolated runs only). The API and the consumers get
``FLASHSALE_PAYMENT__WINDOW_SECONDS`` = ``--payment-window``, and the sale starts the payment
channel simulator (``flashsale channel serve``) as a subprocess of its own, the API's channel
URLs pointing at it. After the first drain a share S of the orders pending payment (chosen at
random, seeded by the run id) are paid the way a buyer pays: ``POST /orders/{order_no}/pay`` at a
random channel, then the buyer pays at the simulator, whose signed notifications reach the API
with :data:`FAULTS` (some dropped for good, some duplicated); half of the others start a payment
and never pay. Once the simulator has no notification in flight, the rest are left until every
one of them is older than the window in MySQL's clock, then the payment-timeout sweep runs once,
in this process (:meth:`toolkit.sale.stores.Stores.sweep`: the same code ``flashsale sweep``
runs, asking the channels first, counted exactly): a dropped notification's order is found paid
at its channel and paid, a started payment is closed at its channel before its order is
cancelled. Then a resale wave: new buyers send :data:`RESALE_FACTOR` times as many requests as
units are on sale again (at least :data:`RESALE_MIN_REQUESTS`), the queue drains a second time,
the channels' bills are reconciled, and the realignment follows.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
import msgspec
from rich.console import Console

from service.api.tokens import issue_token
from service.domain.stock.realign_report import RealignReport
from toolkit.sale.errors import SetupError, stderr
from toolkit.sale.facts import LifecycleRun
from toolkit.sale.isolation import Sale, simulator_url
from toolkit.sale.plan import ACCEPTED, Job, Kind, Shot, Wave, build_plan
from toolkit.sale.processes import Processes, wait_ready
from toolkit.sale.stores import CONNECT_TIMEOUT, Stores
from toolkit.sale.swarm_plan import Call, Errand
from toolkit.sale.waves import Sender, errands_of

PRICE = 9900  # minor currency units
REQUEST_TIMEOUT = 30.0  # seconds per set-up request (the admin's, the channel's)
READY_TIMEOUT = 60.0  # seconds for a started API to answer /health/ready (--url: CONNECT_TIMEOUT)
DRAIN_TIMEOUT = 180.0  # seconds for the queue to drain after the last answer
DRAIN_POLL = 0.2  # seconds between drain polls
DRAINED_POLLS = 3  # consecutive polls that must see the queue drained
PAY_CONCURRENCY = 32  # payment starts / buyer payments in flight at most (each row-locks an order in the API)
ABANDON_SHARE = 0.5  # of the orders left unpaid, those that start a payment at a channel and never pay
FAULTS = {"drop": 0.1, "duplicate": 0.2}  # the simulator's notification faults during the sale
NOTIFY_SETTLE_TIMEOUT = 60.0  # seconds to wait for the simulator's notifications in flight
WINDOW_MARGIN = 0.2  # seconds slept past the moment MySQL's clock puts the last unpaid order beyond the window
RESALE_FACTOR = 3  # resale requests per unit on sale again, so demand exceeds supply
RESALE_MIN_REQUESTS = 50

ORDERS_PATH = "/api/v1/orders"
NOOP_PATH = "/api/v1/bench/noop"


@dataclass(frozen=True, slots=True)
class Load:
    """The traffic asked for: ``requests`` purchases from ``users`` buyers, ``noop_requests``
    no-op requests before them (0 = none), over ``concurrency`` connections; ``pay_share`` of
    the orders pending payment after the first drain get paid (0 = no lifecycle phases). With a
    ``crowd_seed`` the purchase wave is instead a crowd of ``users`` buyers drawn from that seed
    (:mod:`toolkit.sale.crowd_wave`)."""

    requests: int
    users: int
    concurrency: int
    noop_requests: int
    pay_share: float
    crowd_seed: str | None = None


async def create_product(client: httpx.AsyncClient, sale: Sale, opens_at: int | None = None) -> None:
    """``PUT /api/v1/admin/products/{id}`` (admin JWT): the product, its stock and per-user limit,
    its waiting room when the sale has one, its sale opening at ``opens_at`` (Unix seconds) when
    given (else open now).

    Raises:
        SetupError: the API refused, or Redis stock is not the stock asked for.
    """
    admin = issue_token(sale.settings.auth.jwt_secret, "sale-admin", admin=True)
    body = {
        "stock": sale.stock,
        "price": PRICE,
        "per_user_limit": sale.per_user_limit,
        "name": f"flash sale {sale.run_id}",
        "stock_mode": "redis",
        "buckets": sale.buckets,
    }
    if sale.waiting_room:
        body["waiting_room"] = True
    if opens_at is not None:
        body["sale_starts_at"] = datetime.fromtimestamp(opens_at, UTC).isoformat()
    try:
        response = await client.put(
            f"/api/v1/admin/products/{sale.product_id}", json=body, headers={"Authorization": f"Bearer {admin}"}
        )
    except httpx.HTTPError as exc:
        raise SetupError(f"creating product {sale.product_id} failed: {exc!r}") from exc
    if response.status_code != 200:
        raise SetupError(f"creating product {sale.product_id} failed: {response.status_code} {response.text[:300]}")
    loaded = msgspec.json.decode(response.content, type=RealignReport)
    if loaded.redis_stock_after != sale.stock:
        raise SetupError(f"product {sale.product_id}: Redis stock {loaded.redis_stock_after}, expected {sale.stock}")


async def noop_skipped(client: httpx.AsyncClient, sale: Sale, noop_requests: int) -> str | None:
    """Why the no-op wave does not run (None: it runs): disabled, or ``POST`` :data:`NOOP_PATH`
    answers 404 to one request with a buyer's JWT (the route is not mounted).

    Raises:
        SetupError: the API did not answer.
    """
    if noop_requests == 0:
        return "disabled (--noop-requests 0)"
    token = issue_token(sale.settings.auth.jwt_secret, "sale-probe")
    body = {"product_id": sale.product_id, "quantity": 1}
    try:
        response = await client.post(NOOP_PATH, json=body, headers={"Authorization": f"Bearer {token}"})
    except httpx.HTTPError as exc:
        raise SetupError(f"probing {NOOP_PATH} failed: {exc!r}") from exc
    if response.status_code == 404:
        return f"{NOOP_PATH} answered 404: not mounted (only the sale's own API, toolkit.bench.product_app, has it)"
    return None


def mint_tokens(sale: Sale, *plans: list[Job]) -> dict[str, str]:
    """``Authorization`` header value (``Bearer <JWT>``) per user of ``plans``."""
    return bearer_tokens(sale, {shot.user for jobs in plans for job in jobs for shot in job.shots})


def bearer_tokens(sale: Sale, users: set[str]) -> dict[str, str]:
    """``Authorization`` header value (``Bearer <JWT>``) per user of ``users``."""
    auth = sale.settings.auth
    return {user: f"Bearer {issue_token(auth.jwt_secret, user, ttl_seconds=auth.token_ttl_seconds)}" for user in users}


async def drain(
    stores: Stores, sale: Sale, expected_orders: int, processes: Processes, console: Console
) -> float | None:
    """Wait until MySQL holds ``expected_orders`` order rows for the product and the order queue
    has no ready message, on :data:`DRAINED_POLLS` polls in a row.

    Returns seconds from the call to the first of those polls, or None when that did not happen
    within :data:`DRAIN_TIMEOUT` or a subprocess exited.
    """
    started = time.perf_counter()
    streak, settled_at = 0, started
    with console.status("draining") as status:
        while time.perf_counter() - started < DRAIN_TIMEOUT and not processes.exited():
            now = time.perf_counter()
            rows = await stores.count_orders(sale.product_id)
            ready = await stores.order_queue_depth()
            if rows >= expected_orders and ready == 0:
                settled_at = now if streak == 0 else settled_at
                streak += 1
                if streak == DRAINED_POLLS:
                    return settled_at - started
            else:
                streak = 0
            status.update(f"draining: {rows}/{expected_orders} orders in MySQL, {ready} messages queued")
            await asyncio.sleep(DRAIN_POLL)
    if dead := processes.exited():
        stderr.print(f"[red]error:[/] {', '.join(dead)} exited while draining")
    else:
        stderr.print(f"[red]error:[/] the queue did not drain within {DRAIN_TIMEOUT:.0f}s")
    return None


async def open_sale(sale: Sale, processes: Processes, console: Console, noop_requests: int) -> str | None:
    """Wait for the API, put the product on sale, probe the no-op route; returns why the no-op
    wave is skipped (None: it runs). Raises SetupError."""
    async with httpx.AsyncClient(base_url=sale.url, timeout=REQUEST_TIMEOUT, trust_env=not sale.isolated) as client:
        with console.status(f"waiting for the API at {sale.url}"):
            await wait_ready(client, processes, READY_TIMEOUT if sale.isolated else CONNECT_TIMEOUT)
        await create_product(client, sale)
        skipped = await noop_skipped(client, sale, noop_requests)
    console.print(f"{sale.run_id}: product {sale.product_id} on sale, {sale.stock} units")
    console.print(f"process logs (kept only if something fails): {processes.log_dir}", soft_wrap=True)
    if skipped:
        console.print(f"no-op ceiling skipped: {skipped}")
    return skipped


def accepted_orders(wave: Wave) -> int:
    """Distinct order numbers answered with 202 in ``wave``."""
    return len({o.order_no for o in wave.outcomes if o.code == ACCEPTED})


async def first_waves(send: Sender, load: Load, noop_requests: int) -> tuple[Wave | None, Wave, float]:
    """Plan, mint the JWTs (timed apart), send ``noop_requests`` no-op requests (0: no no-op
    wave), then the purchase wave, both with the same JWTs, bodies, mix and concurrency; returns
    the no-op wave (None when not sent), the purchase wave, and the seconds spent minting."""
    sale = send.sale
    purchase_jobs = build_plan(load.requests, load.users, sale.per_user_limit, random.Random(sale.run_id))
    noop_jobs = build_plan(noop_requests, load.users, sale.per_user_limit, random.Random(f"{sale.run_id}:noop"))
    with send.console.status("minting JWTs"):
        started = time.perf_counter()
        tokens = mint_tokens(sale, purchase_jobs, noop_jobs)
        token_seconds = time.perf_counter() - started
    ceiling = None
    if noop_jobs:
        errands = errands_of(f"{sale.url}{NOOP_PATH}", "POST /bench/noop", noop_jobs, sale.product_id, tokens)
        ceiling = await send.wave("no-op", errands, noop_jobs)
    errands = errands_of(f"{sale.url}{ORDERS_PATH}", "POST /orders", purchase_jobs, sale.product_id, tokens)
    purchase = await send.wave("purchase", errands, purchase_jobs)
    return ceiling, purchase, token_seconds


@dataclass(frozen=True, slots=True)
class _Paid:
    starts: Wave
    payments: Wave
    paid_at_channel: list[str]
    abandoned: int
    unpaid: int


async def _pay(stores: Stores, send: Sender, load: Load, channel: httpx.AsyncClient) -> _Paid:
    """A ``load.pay_share`` share of the orders pending payment, chosen at random, are paid by
    payers of the crowd: each starts the payment (``POST /orders/{order_no}/pay``, a random
    channel) and pays at the simulator; :data:`ABANDON_SHARE` of the others start a payment and
    never pay. The simulator drops and duplicates notifications meanwhile (:data:`FAULTS`). At
    most :data:`PAY_CONCURRENCY` payers at once."""
    sale = send.sale
    unpaid = await stores.unpaid_orders(sale.product_id)
    rng = random.Random(f"{sale.run_id}:pay")
    chosen = rng.sample(unpaid, round(load.pay_share * len(unpaid)))
    left = [order for order in unpaid if order not in chosen]
    abandoned = rng.sample(left, round(ABANDON_SHARE * len(left)))
    names = sorted(sale.settings.payment.channel_urls)
    at = {order.order_no: rng.choice(names) for order in chosen + abandoned}
    assert (await channel.put("/faults", json=FAULTS)).status_code == 200
    starting = chosen + abandoned
    start_jobs = [Job(Kind.PAY, (Shot(i, o.user_id, o.quantity, None),)) for i, o in enumerate(starting)]
    tokens = mint_tokens(sale, start_jobs)
    urls = sale.settings.payment.channel_urls
    errands = []
    for number, order in enumerate(starting):
        body = msgspec.json.encode({"channel": at[order.order_no]})
        headers = {"Authorization": tokens[order.user_id], "Content-Type": "application/json"}
        start_url = f"{sale.url}{ORDERS_PATH}/{order.order_no}/pay"
        calls = [Call(number, "POST", start_url, "POST /orders/{no}/pay", headers, body)]
        if number < len(chosen):
            pay_url = f"{urls[at[order.order_no]]}/payments/{order.order_no}/pay"
            calls.append(Call(len(starting) + number, "POST", pay_url, "POST channel pay", {}))
        errands.append(Errand(calls))
    connections = min(send.connections, PAY_CONCURRENCY)
    answers = await send.errands("payers", errands, "Payer", connections)
    seconds = send.loads[-1].seconds
    starts = Wave(start_jobs, answers[: len(starting)], seconds)
    payments = Wave(start_jobs[: len(chosen)], answers[len(starting) :], seconds)
    return _Paid(starts, payments, [o.order_no for o in chosen], len(abandoned), len(left))


async def _notifications_settled(channel: httpx.AsyncClient, console: Console) -> dict[str, int]:
    """Wait until the simulator has no notification in flight (delivered, dropped or given up;
    at most :data:`NOTIFY_SETTLE_TIMEOUT` seconds); its counters."""
    started = time.perf_counter()
    with console.status("waiting for the channels' notifications"):
        while True:
            view = (await channel.get("/faults")).json()
            if view["in_flight"] == 0 or time.perf_counter() - started > NOTIFY_SETTLE_TIMEOUT:
                return {**view["stats"], "in_flight": view["in_flight"]}
            await asyncio.sleep(DRAIN_POLL)


async def _channel_ready(channel: httpx.AsyncClient, processes: Processes) -> None:
    """Poll the simulator's ``/health`` until 200. Raises SetupError (not ready in time, or a
    subprocess exited)."""
    deadline = time.perf_counter() + READY_TIMEOUT
    while True:
        if dead := processes.exited():
            raise SetupError(f"{', '.join(dead)} exited during start-up")
        try:
            if (await channel.get("/health")).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.perf_counter() > deadline:
            raise SetupError(f"channel simulator at {channel.base_url} not ready after {READY_TIMEOUT:.0f}s")
        await asyncio.sleep(0.25)


async def _let_window_lapse(stores: Stores, sale: Sale, console: Console) -> float:
    """Wait until every order of the product still pending payment is older than the payment
    window in MySQL's clock (``created_at`` and ``NOW()`` have whole seconds, so the sweep's
    ``created_at < NOW() - window`` holds from an age of window + 1 s); returns seconds waited."""
    window = sale.settings.payment.window_seconds
    started = time.perf_counter()
    with console.status(f"letting the {window}s payment window lapse"):
        while (age := await stores.youngest_unpaid_age(sale.product_id)) is not None and age <= window:
            await asyncio.sleep(window + 1 - age + WINDOW_MARGIN)
    return time.perf_counter() - started


async def _resale(send: Sender, on_sale: int) -> Wave:
    """New buyers (``resale-<n>``, one per job, never seen before) send :data:`RESALE_FACTOR`
    requests per unit on sale (at least :data:`RESALE_MIN_REQUESTS`), mixed as the purchase load."""
    sale = send.sale
    requests_ = max(RESALE_FACTOR * on_sale, RESALE_MIN_REQUESTS)
    jobs = build_plan(requests_, requests_, sale.per_user_limit, random.Random(f"{sale.run_id}:resale"), "resale")
    errands = errands_of(f"{sale.url}{ORDERS_PATH}", "POST /orders", jobs, sale.product_id, mint_tokens(sale, jobs))
    return await send.wave("resale", errands, jobs)


async def run_lifecycle(stores: Stores, send: Sender, load: Load, orders_so_far: int) -> LifecycleRun:
    """After the first drain (``orders_so_far`` order rows): pay a share through the channel
    simulator, let the rest lapse, sweep once (asking the channels), resell the returned units to
    new buyers, drain again, reconcile."""
    sale, processes, console = send.sale, send.processes, send.console
    async with httpx.AsyncClient(base_url=simulator_url(sale.settings), timeout=REQUEST_TIMEOUT) as channel:
        await _channel_ready(channel, processes)
        paid = await _pay(stores, send, load, channel)
        notifications = await _notifications_settled(channel, console)
    wait_seconds = await _let_window_lapse(stores, sale, console)
    stock_before = await stores.mysql_stock(sale.product_id)
    swept = await stores.sweep(sale.product_id)
    on_sale = await stores.mysql_stock(sale.product_id)
    console.print(
        f"paid {len(paid.paid_at_channel)} orders at the channels ({notifications.get('dropped', 0)} notifications"
        f" dropped, {notifications.get('duplicated', 0)} duplicated); swept {swept} unpaid ones;"
        f" {on_sale} units on sale again"
    )
    resale = await _resale(send, on_sale)
    drain_seconds = await drain(stores, sale, orders_so_far + accepted_orders(resale), processes, console)
    reconciliation, billed = await stores.reconcile()
    mismatches = Counter(m.kind for c in reconciliation.channels for m in c.mismatches)
    mismatches.update("bill_unavailable" for c in reconciliation.channels if c.error)
    return LifecycleRun(
        pay_share=load.pay_share,
        window_seconds=sale.settings.payment.window_seconds,
        starts=paid.starts,
        payments=paid.payments,
        paid_at_channel=paid.paid_at_channel,
        abandoned=paid.abandoned,
        notifications=notifications,
        unpaid=paid.unpaid,
        wait_seconds=wait_seconds,
        swept=swept,
        returned=on_sale - stock_before,
        on_sale=on_sale,
        resale=resale,
        drain_seconds=drain_seconds,
        channel_payments=billed,
        reconciled_clean=reconciliation.clean,
        mismatches=dict(mismatches),
    )
