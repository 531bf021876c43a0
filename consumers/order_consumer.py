"""``flashsale consume``: the authoritative write of each queued order into MySQL.

Per message, one transaction: INSERT the order (``pending_payment``) under ``UNIQUE(request_id)``,
then ``UPDATE inventory SET stock = stock - q, sold = sold + q WHERE product_id = p AND stock >= q``.
A duplicate (1062 on the insert) whose order number is already written means the message was
applied before: roll back and ack, no second decrement. (A taken request id with a new order number
is a key reused after its replay record expired: the order is written under a reissued request id.) An UPDATE that matches no row means MySQL has no stock: the order is
recorded ``rejected`` (reason ``sold_out``) so the buyer sees a final answer. Deadlocks (1213) and
lock wait timeouts (1205) retry the whole transaction with backoff. The message is acked only
after the commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import signal
from enum import Enum

import aio_pika
import msgspec
import structlog
from aio_pika.abc import AbstractIncomingMessage
from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy import text
from sqlalchemy.engine import CursorResult
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from db.engine import DuplicateKeyError, as_duplicate_key, is_retryable
from db.models import MAX_AMOUNT, OrderStatus
from service.broker import OrderMessage, declare_topology, decode_order
from service.keys import ProductKeys
from service.lifecycle import transition
from service.order_no import is_valid_order_no
from service.request_id import USER_ID, reissued_request_id
from service.scripts import Scripts
from service.settings import Settings

log = structlog.get_logger(__name__)

MAX_TRANSACTION_ATTEMPTS = 6
RETRY_BACKOFF_SECONDS = 1.0  # unit of the requeue backoff
_REQUEST_ID = re.compile(r"[0-9a-f]{32}")

_INSERT_ORDER = text(
    "INSERT INTO orders (order_no, request_id, user_id, product_id, quantity, amount, status)"
    " SELECT :order_no, :request_id, :user_id, p.id, :quantity, :amount, :status"
    " FROM products p WHERE p.id = :product_id"
)
_TAKE_STOCK = text(
    "UPDATE inventory SET stock = stock - :quantity, sold = sold + :quantity, version = version + 1"
    " WHERE product_id = :product_id AND stock >= :quantity"
)
_LOG_STATUS = text(
    "INSERT INTO order_status_log (order_id, from_status, to_status, reason)"
    " VALUES (:order_id, :from_status, :to_status, :reason)"
)


class Outcome(Enum):
    """What one message did to MySQL."""

    APPLIED = "applied"  # order pending_payment, stock taken
    REJECTED = "rejected"  # order rejected/sold_out, no stock taken
    DUPLICATE = "duplicate"  # already applied before; nothing written
    UNKNOWN_PRODUCT = "unknown_product"  # nothing written


class InvalidOrder(ValueError):
    """A message that is not a well-formed order; it is dead-lettered at once."""


class _Rollback(Exception):
    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome


def parse_order(body: bytes) -> OrderMessage:
    """Decode and check a message body.

    Raises:
        InvalidOrder: not JSON of the order shape, or a field out of its domain.
    """
    try:
        order = decode_order(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InvalidOrder(str(exc)) from exc
    if not (
        _REQUEST_ID.fullmatch(order.request_id)
        and is_valid_order_no(order.order_no)
        and USER_ID.fullmatch(order.user_id)
        and order.product_id > 0
        and order.quantity > 0
        and 0 <= order.amount <= MAX_AMOUNT
    ):
        raise InvalidOrder("field out of domain")
    return order


async def apply_order(engine: AsyncEngine, order: OrderMessage, replay_window_seconds: int = 86_400) -> Outcome:
    """Write one order in one transaction (see the module docstring); retried on 1213/1205.

    ``replay_window_seconds`` is how long the API keeps replay records
    (``FLASHSALE_ORDERS__REPLAY_TTL_SECONDS``): a request id taken by an order younger than that,
    arriving with a new order number, is a retry the API could not recognise (its replay
    record was lost with Redis data) and is recorded ``rejected``/``duplicate_request``.

    Raises:
        sqlalchemy.exc.DBAPIError: a non-retryable database error, or retries exhausted.
        db.engine.DuplicateKeyError: the order number exists under another request id (a real
            collision, which the shard lease should make impossible; the UNIQUE index stops it).
    """
    for attempt in range(1, MAX_TRANSACTION_ATTEMPTS + 1):
        try:
            return await _apply_once(engine, order, replay_window_seconds)
        except DBAPIError as exc:
            if not is_retryable(exc) or attempt == MAX_TRANSACTION_ATTEMPTS:
                raise
            delay = min(0.02 * 2**attempt, 1.0) * (0.5 + random.random())
            log.info("transaction_retry", request_id=order.request_id, attempt=attempt, delay=round(delay, 3))
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")


async def _apply_once(engine: AsyncEngine, order: OrderMessage, replay_window_seconds: int) -> Outcome:
    try:
        async with engine.begin() as conn:
            inserted = await _insert(conn, order, order.request_id)
            if inserted is None:
                stored = await _request_id_of(conn, order.order_no)
                if stored in (order.request_id, reissued_request_id(order.request_id, order.order_no)):
                    raise _Rollback(Outcome.DUPLICATE)
                if stored is not None:
                    # Another request holds this order number: the UNIQUE index stops a collision
                    # the shard lease should make impossible.
                    raise DuplicateKeyError("uq_orders_order_no", f"order number {order.order_no} is taken")
                # The request id is taken but this order number is new: the API took the request
                # for a new one because its replay record was gone. Every 202 gets its row, under a
                # reissued request id; whether it is a purchase depends on why the record was gone.
                retry_of_live_order = await _taken_within(conn, order.request_id, replay_window_seconds)
                inserted = await _insert(conn, order, reissued_request_id(order.request_id, order.order_no))
                if inserted is None:
                    raise DuplicateKeyError(None, f"request {order.request_id} cannot be written")
                if retry_of_live_order and inserted.rowcount == 1:
                    # The record should still have been there: Redis lost it, and this is a retry of
                    # an order that exists. Never a second purchase for one request.
                    await _log_created(conn, inserted.lastrowid)
                    await transition(
                        conn, order.order_no, OrderStatus.PENDING_PAYMENT, OrderStatus.REJECTED, "duplicate_request"
                    )
                    return Outcome.REJECTED
                # Older than the replay window: the key was reused after it expired, a new purchase.
            if inserted.rowcount == 0:
                raise _Rollback(Outcome.UNKNOWN_PRODUCT)
            await _log_created(conn, inserted.lastrowid)
            # rowcount is matched rows on MySQL dialects; matched is what "had stock" means here.
            if (await conn.execute(_TAKE_STOCK, {"product_id": order.product_id, "quantity": order.quantity})).rowcount == 1:
                return Outcome.APPLIED
            await transition(conn, order.order_no, OrderStatus.PENDING_PAYMENT, OrderStatus.REJECTED, "sold_out")
            return Outcome.REJECTED
    except _Rollback as rollback:
        return rollback.outcome


async def _insert(conn: AsyncConnection, order: OrderMessage, request_id: str) -> CursorResult | None:
    """INSERT the order (``pending_payment``); None when a UNIQUE index refused it (1062)."""
    params = {
        "order_no": order.order_no,
        "request_id": request_id,
        "user_id": order.user_id,
        "product_id": order.product_id,
        "quantity": order.quantity,
        "amount": order.amount,
        "status": OrderStatus.PENDING_PAYMENT,
    }
    try:
        return await conn.execute(_INSERT_ORDER, params)
    except IntegrityError as exc:
        if as_duplicate_key(exc) is None:
            raise
        return None


async def _log_created(conn: AsyncConnection, order_id: int) -> None:
    await conn.execute(
        _LOG_STATUS, {"order_id": order_id, "from_status": None, "to_status": OrderStatus.PENDING_PAYMENT, "reason": None}
    )


async def _taken_within(conn: AsyncConnection, request_id: str, seconds: int) -> bool:
    """True when the order holding ``request_id`` was created less than ``seconds`` ago."""
    recent = await conn.execute(
        text("SELECT created_at > NOW() - INTERVAL :s SECOND FROM orders WHERE request_id = :r"),
        {"s": seconds, "r": request_id},
    )
    return bool(recent.scalar())


async def _request_id_of(conn: AsyncConnection, order_no: str) -> str | None:
    stored = await conn.execute(text("SELECT request_id FROM orders WHERE order_no = :o"), {"o": order_no})
    return stored.scalar()


class OrderConsumer:
    """Handles deliveries from the order queue; tracks the ones in hand for a clean shutdown."""

    def __init__(
        self, engine: AsyncEngine, redis: Redis, scripts: Scripts, key_prefix: str, replay_window_seconds: int = 86_400
    ) -> None:
        self._engine = engine
        self._replay_window = replay_window_seconds
        self._redis = redis
        self._scripts = scripts
        self._prefix = key_prefix
        self._in_hand: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()
        self.counts: dict[str, int] = {}

    @property
    def in_hand(self) -> int:
        """Deliveries being processed right now."""
        return len(self._in_hand)

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    async def _claim(self, order: OrderMessage) -> str:
        keys = ProductKeys(self._prefix, order.product_id)
        try:
            return await self._scripts.claim(keys=[keys.journal, keys.replay(order.request_id)], args=[order.request_id])
        except RedisError as exc:
            # Without Redis, MySQL's unique request id still decides: never drop an order for it.
            log.warning("claim_failed", request_id=order.request_id, error=repr(exc))
            return "unknown"

    async def handle(self, message: AbstractIncomingMessage) -> None:
        """Process one delivery; ack after commit, dead-letter what can never be applied."""
        task = asyncio.current_task()
        assert task is not None
        self._in_hand.add(task)
        try:
            await self._handle(message)
        except Exception as exc:  # never leave a delivery unsettled: it would stall the prefetch window
            log.exception("handler_failed", message_id=message.message_id, error=repr(exc))
            if not message.processed:
                await self._retry_later(message)
        finally:
            self._in_hand.discard(task)

    async def _handle(self, message: AbstractIncomingMessage) -> None:
        try:
            order = parse_order(message.body)
        except InvalidOrder as exc:
            log.error("dead_lettered_invalid", message_id=message.message_id, error=str(exc))
            self._count("invalid")
            await message.reject(requeue=False)
            return
        if await self._claim(order) == "released":
            # The API gave this reservation back (publish failed) and told the buyer 503.
            self._count("released")
            await message.ack()
            return
        try:
            outcome = await apply_order(self._engine, order, self._replay_window)
        except Exception as exc:
            log.error("apply_failed", request_id=order.request_id, error=repr(exc))
            self._count("failed")
            await self._retry_later(message)
            return
        if outcome is Outcome.UNKNOWN_PRODUCT:
            log.error("unknown_product", request_id=order.request_id, product_id=order.product_id)
            self._count(outcome.value)
            await self._retry_later(message)
            return
        self._count(outcome.value)
        await message.ack()

    async def _retry_later(self, message: AbstractIncomingMessage) -> None:
        """Requeue after a backoff that grows with the delivery count (1, 2, 4 ... 30 s), so a
        short MySQL outage does not burn the delivery limit; past the limit the quorum queue
        dead-letters the message (and realignment re-publishes its reservation after the grace).
        A shutdown cuts the wait short."""
        deliveries = int((message.headers or {}).get("x-delivery-count", 0) or 0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), min(2.0**deliveries, 30.0) * RETRY_BACKOFF_SECONDS)
        await message.nack(requeue=True)

    async def drain(self) -> None:
        """Wait for every delivery in hand to finish (used on SIGTERM); backoffs end at once."""
        self._stopping.set()
        while self._in_hand:
            await asyncio.gather(*list(self._in_hand), return_exceptions=True)


async def run_consumer(settings: Settings, engine: AsyncEngine, redis: Redis, scripts: Scripts, prefetch: int) -> None:
    """Consume until SIGTERM/SIGINT, then stop taking messages, finish those in hand, and return."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    consumer = OrderConsumer(engine, redis, scripts, settings.redis.key_prefix, settings.orders.replay_ttl_seconds)
    connection = await aio_pika.connect_robust(settings.amqp.url)
    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=prefetch)
        _, queue = await declare_topology(channel, settings.amqp)
        tag = await queue.consume(consumer.handle)
        log.info("consuming", queue=settings.amqp.queue, prefetch=prefetch)
        await stop.wait()
        log.info("stopping", in_hand=consumer.in_hand)
        await queue.cancel(tag)
        await consumer.drain()
    finally:
        await connection.close()
        log.info("stopped", **consumer.counts)
