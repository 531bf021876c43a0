"""The phases of ``flashsale sale`` after start-up: open the sale (API ready, product created,
no-op route probed), the first waves (no-op ceiling and purchase load), drain, and the order
lifecycle (pay, let the window lapse, sweep, resell, drain again).

Framework ceiling (``--noop-requests N``, 0 = off). Before the purchase load, ``POST
/api/v1/bench/noop`` (``FLASHSALE_BENCH_ROUTES=true``: JWT auth and body decoding, nothing else)
gets N requests built like the purchases (same JWTs, bodies, mix, concurrency and clients, one
code path: :func:`service.sale.load.send_wave`). The report puts its throughput and latency next
to the purchase load's, with the ratios. When the route answers 404 (an API started without the
bench routes, ``--url``) the wave is skipped and the report says so.

Order lifecycle (``--pay-share S``, isolated runs only). The API and the consumers get
``FLASHSALE_PAYMENT__WINDOW_SECONDS`` = ``--payment-window``. After the first drain a share S of
the orders pending payment (chosen at random, seeded by the run id) get a signed ``paid``
notification, as a payment channel sends it (:func:`notification`), a bounded number at a time;
the others are left until every one of them is older than the window in MySQL's clock, then the
payment-timeout sweep runs once, in this process (:meth:`service.sale.stores.Stores.sweep`: the
same code ``flashsale sweep`` runs, counted exactly). Then a resale wave: new buyers send
:data:`RESALE_FACTOR` times as many requests as units are on sale again (at least
:data:`RESALE_MIN_REQUESTS`), the queue drains a second time, and the realignment follows.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import httpx
import msgspec
from rich.console import Console

from service.api.auth import issue_token
from service.domain.payments import Notification, signed
from service.domain.realign import RealignReport
from service.sale.errors import SetupError, stderr
from service.sale.facts import LifecycleRun, UnpaidOrder
from service.sale.isolation import Sale
from service.sale.load import REQUEST_TIMEOUT, build_requests, send_wave
from service.sale.plan import ACCEPTED, Job, Kind, Shot, Wave, build_plan
from service.sale.processes import Processes, wait_ready
from service.sale.stores import CONNECT_TIMEOUT, Stores

PRICE = 9900  # minor currency units
READY_TIMEOUT = 60.0  # seconds for a started API to answer /health/ready (--url: CONNECT_TIMEOUT)
DRAIN_TIMEOUT = 180.0  # seconds for the queue to drain after the last answer
DRAIN_POLL = 0.2  # seconds between drain polls
DRAINED_POLLS = 3  # consecutive polls that must see the queue drained
PAY_CONCURRENCY = 32  # notifications in flight at most (each row-locks an order in one API transaction)
WINDOW_MARGIN = 0.2  # seconds slept past the moment MySQL's clock puts the last unpaid order beyond the window
RESALE_FACTOR = 3  # resale requests per unit on sale again, so demand exceeds supply
RESALE_MIN_REQUESTS = 50

ORDERS_PATH = "/api/v1/orders"
NOOP_PATH = "/api/v1/bench/noop"
NOTIFY_PATH = "/api/v1/payments/notify"


@dataclass(frozen=True, slots=True)
class Load:
    """The traffic asked for: ``requests`` purchases from ``users`` buyers, ``noop_requests``
    no-op requests before them (0 = none), over ``concurrency`` connections; ``pay_share`` of
    the orders pending payment after the first drain get paid (0 = no lifecycle phases)."""

    requests: int
    users: int
    concurrency: int
    noop_requests: int
    pay_share: float


async def _send(
    sale: Sale, console: Console, label: str, requests: list[httpx.Request], jobs: list[Job], concurrency: int
) -> Wave:
    """:func:`service.sale.load.send_wave` for ``sale``: proxy variables honoured only with ``--url``."""
    return await send_wave(console, label, requests, jobs, concurrency, trust_env=not sale.isolated)


async def create_product(client: httpx.AsyncClient, sale: Sale) -> None:
    """``PUT /api/v1/admin/products/{id}`` (admin JWT): the product, its stock and per-user limit.

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
    }
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
        return f"{NOOP_PATH} answered 404: not mounted (the API needs FLASHSALE_BENCH_ROUTES=true)"
    return None


def mint_tokens(sale: Sale, *plans: list[Job]) -> dict[str, str]:
    """``Authorization`` header value (``Bearer <JWT>``) per user of ``plans``."""
    auth = sale.settings.auth
    users = {shot.user for jobs in plans for job in jobs for shot in job.shots}
    return {user: f"Bearer {issue_token(auth.jwt_secret, user, ttl_seconds=auth.token_ttl_seconds)}" for user in users}


def notification(sale: Sale, order: UnpaidOrder) -> httpx.Request:
    """A ``paid`` notification for ``order`` as the first configured channel sends it: the
    order's amount in the shop's currency, transaction id ``<run id>-<order_no>``, signed with
    ``X-Signature`` = hex HMAC-SHA256 of the raw body (:func:`service.domain.payments.signed`)."""
    payment = sale.settings.payment
    channel, secret = next(iter(payment.channel_secrets.items()))
    note = Notification(
        channel=channel,
        channel_txn_id=f"{sale.run_id}-{order.order_no}",
        order_no=order.order_no,
        amount=order.amount,
        currency=payment.currency,
        event="paid",
    )
    body, headers = signed(secret, note)
    return httpx.Request("POST", f"{sale.url}{NOTIFY_PATH}", content=body, headers=headers)


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
            ready = await stores.queue_depth(sale.settings.amqp.queue)
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


async def first_waves(sale: Sale, console: Console, load: Load, noop_requests: int) -> tuple[Wave | None, Wave, float]:
    """Plan, mint the JWTs (timed apart), send ``noop_requests`` no-op requests (0: no no-op
    wave), then the purchase wave, both with the same JWTs, bodies, mix and concurrency; returns
    the no-op wave (None when not sent), the purchase wave, and the seconds spent minting."""
    purchase_jobs = build_plan(load.requests, load.users, sale.per_user_limit, random.Random(sale.run_id))
    noop_jobs = build_plan(noop_requests, load.users, sale.per_user_limit, random.Random(f"{sale.run_id}:noop"))
    with console.status("minting JWTs"):
        started = time.perf_counter()
        tokens = mint_tokens(sale, purchase_jobs, noop_jobs)
        token_seconds = time.perf_counter() - started
    ceiling = None
    if noop_jobs:
        requests = build_requests(f"{sale.url}{NOOP_PATH}", noop_jobs, sale.product_id, tokens)
        ceiling = await _send(sale, console, "no-op", requests, noop_jobs, load.concurrency)
    requests = build_requests(f"{sale.url}{ORDERS_PATH}", purchase_jobs, sale.product_id, tokens)
    purchase = await _send(sale, console, "purchase", requests, purchase_jobs, load.concurrency)
    return ceiling, purchase, token_seconds


async def _pay(stores: Stores, sale: Sale, console: Console, load: Load) -> tuple[Wave, list[str], int]:
    """Send a ``paid`` notification (:func:`notification`) for a ``load.pay_share`` share of the
    orders pending payment, chosen at random, at most :data:`PAY_CONCURRENCY` at once; returns
    the wave, the order numbers notified (``[shot.index]``) and how many orders were left unpaid."""
    unpaid = await stores.unpaid_orders(sale.product_id)
    chosen = random.Random(f"{sale.run_id}:pay").sample(unpaid, round(load.pay_share * len(unpaid)))
    jobs = [Job(Kind.PAY, (Shot(index, order.user_id, order.quantity, None),)) for index, order in enumerate(chosen)]
    requests = [notification(sale, order) for order in chosen]
    wave = await _send(sale, console, "payments", requests, jobs, min(load.concurrency, PAY_CONCURRENCY))
    return wave, [order.order_no for order in chosen], len(unpaid) - len(chosen)


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


async def _resale(sale: Sale, console: Console, concurrency: int, on_sale: int) -> Wave:
    """New buyers (``resale-<n>``, one per job, never seen before) send :data:`RESALE_FACTOR`
    requests per unit on sale (at least :data:`RESALE_MIN_REQUESTS`), mixed as the purchase load."""
    requests_ = max(RESALE_FACTOR * on_sale, RESALE_MIN_REQUESTS)
    jobs = build_plan(requests_, requests_, sale.per_user_limit, random.Random(f"{sale.run_id}:resale"), "resale")
    requests = build_requests(f"{sale.url}{ORDERS_PATH}", jobs, sale.product_id, mint_tokens(sale, jobs))
    return await _send(sale, console, "resale", requests, jobs, concurrency)


async def run_lifecycle(
    stores: Stores, sale: Sale, processes: Processes, console: Console, load: Load, orders_so_far: int
) -> LifecycleRun:
    """After the first drain (``orders_so_far`` order rows): pay a share, let the rest lapse,
    sweep once, resell the returned units to new buyers, drain again."""
    payments, notified, unpaid = await _pay(stores, sale, console, load)
    wait_seconds = await _let_window_lapse(stores, sale, console)
    stock_before = await stores.mysql_stock(sale.product_id)
    swept = await stores.sweep(sale.product_id)
    on_sale = await stores.mysql_stock(sale.product_id)
    console.print(f"paid {len(notified)} orders; swept {swept} unpaid ones; {on_sale} units on sale again")
    resale = await _resale(sale, console, load.concurrency, on_sale)
    drain_seconds = await drain(stores, sale, orders_so_far + accepted_orders(resale), processes, console)
    return LifecycleRun(
        pay_share=load.pay_share,
        window_seconds=sale.settings.payment.window_seconds,
        payments=payments,
        notified=notified,
        unpaid=unpaid,
        wait_seconds=wait_seconds,
        swept=swept,
        returned=on_sale - stock_before,
        on_sale=on_sale,
        resale=resale,
        drain_seconds=drain_seconds,
    )
