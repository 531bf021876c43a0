"""Tables of the authoritative store. Money is BIGINT in minor currency units."""

from __future__ import annotations

from datetime import datetime
from enum import IntEnum, StrEnum
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    SmallInteger,
    String,
    UniqueConstraint,
    func,
)
from sqlalchemy.dialects.mysql import LONGTEXT, TINYINT
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

MAX_AMOUNT = 2**63 - 1
"""The largest amount a BIGINT column holds (minor currency units)."""


class OrderStatus(IntEnum):
    """Order status codes as stored in ``orders.status`` (TINYINT)."""

    PENDING_PAYMENT = 0
    PAID = 1
    SHIPPED = 2
    COMPLETED = 3
    CANCELLED = 4
    REFUNDING = 5
    REFUNDED = 6
    REJECTED = 7

    @property
    def label(self) -> str:
        return self.name.lower()


class Base(DeclarativeBase):
    pass


class StockMode(StrEnum):
    """How a product's stock is taken (docs/ARCHITECTURE.md, "Stock modes")."""

    DATABASE = "database"
    REDIS = "redis"


class Product(Base):
    """A product on sale: price in minor units, per-user limit (units), sale window (UTC, naive),
    stock mode, whether a purchase needs an order token, and whether buyers pass a waiting room."""

    __tablename__ = "products"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    name: Mapped[str] = mapped_column(String(200))
    price: Mapped[int] = mapped_column(BigInteger)
    per_user_limit: Mapped[int] = mapped_column(Integer)
    sale_starts_at: Mapped[datetime] = mapped_column(DateTime)
    sale_ends_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    stock_mode: Mapped[str] = mapped_column(String(8), server_default="database")
    """``database`` (conditional UPDATE in the request's transaction) or ``redis``
    (Redis pre-decrement, queue, consumer)."""
    require_token: Mapped[bool] = mapped_column(Boolean, server_default="0")
    """A purchase needs a server-issued order token (header ``Order-Token``)."""
    buckets: Mapped[int] = mapped_column(SmallInteger, server_default="1")
    """Stock buckets K in Redis (1..64, fixed at creation): :mod:`service.domain.stock.buckets`."""
    waiting_room: Mapped[bool] = mapped_column(Boolean, server_default="0")
    """A purchase needs an admission from the product's waiting room (header ``Admission-Token``)."""


class Inventory(Base):
    """Stock of one product: stock + sold is constant
    except when stock is added or returned."""

    __tablename__ = "inventory"

    product_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("products.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
    )
    stock: Mapped[int] = mapped_column(Integer)
    sold: Mapped[int] = mapped_column(Integer, default=0)
    version: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime, server_default=func.current_timestamp(), onupdate=func.current_timestamp()
    )


class OrderNoGeneration(Base):
    """The order-number generation of one shard (00-99): bumped when a minter finds that Redis
    lost the shard's sequence; its last digit leads the sequence of every number minted in it
    (:mod:`service.domain.order_numbers.minter`)."""

    __tablename__ = "order_no_generations"

    shard: Mapped[int] = mapped_column(SmallInteger, primary_key=True, autoincrement=False)
    generation: Mapped[int] = mapped_column(Integer, server_default="0")
    changed_at: Mapped[datetime] = mapped_column(DateTime, server_default=func.current_timestamp())


class Order(Base):
    """One accepted purchase. ``request_id`` and ``order_no`` are both unique; amount in minor units."""

    __tablename__ = "orders"
    __table_args__ = (
        Index("ix_orders_user_created", "user_id", "created_at"),
        Index("ix_orders_status_created", "status", "created_at"),
        UniqueConstraint("order_no", name="uq_orders_order_no"),
        UniqueConstraint("request_id", name="uq_orders_request_id"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    order_no: Mapped[str] = mapped_column(String(26))
    request_id: Mapped[str] = mapped_column(String(32))
    user_id: Mapped[str] = mapped_column(String(64))
    product_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("products.id"))
    quantity: Mapped[int] = mapped_column(Integer)
    amount: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[int] = mapped_column(TINYINT)
    reason: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, server_default=func.current_timestamp())
    updated_at: Mapped[datetime] = mapped_column(
        DateTime, server_default=func.current_timestamp(), onupdate=func.current_timestamp()
    )


class UserQuota(Base):
    """Units each user holds of each product against its per-user limit, kept in MySQL beside the
    orders (Redis's quota hash is only the hot path's copy): every order that takes stock adds its
    units in the same transaction, under the inventory row lock, and is refused when that takes
    the user over ``products.per_user_limit``; a cancel gives them back, a refund does not (the
    buyer did buy), a rejected order never counted."""

    __tablename__ = "user_quota"

    product_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    user_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    bought: Mapped[int] = mapped_column(Integer)


class OrderNoConflict(Base):
    """An accepted order whose order number was already taken by another request's order when the
    consumer came to write it (a minter fault; ``UNIQUE(order_no)`` stopped it). Its order row is
    written ``rejected``/``order_no_conflict`` under a number of its own
    (:func:`service.domain.order_numbers.conflicts.stand_in_order_no`); this row leads its buyer from
    the order number of the 202 (``order_no``) to it."""

    __tablename__ = "order_no_conflicts"
    __table_args__ = (Index("ix_order_no_conflicts_order_no_user", "order_no", "user_id"),)

    request_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    order_no: Mapped[str] = mapped_column(String(26))
    user_id: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime, server_default=func.current_timestamp())


class OrderStatusLog(Base):
    """Every status change of an order, written in the same transaction as the change."""

    __tablename__ = "order_status_log"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    order_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("orders.id", ondelete="CASCADE"), index=True)
    from_status: Mapped[int | None] = mapped_column(TINYINT, nullable=True)
    to_status: Mapped[int] = mapped_column(TINYINT)
    reason: Mapped[str | None] = mapped_column(String(64), nullable=True)
    actor: Mapped[str | None] = mapped_column(String(80), nullable=True)
    """Who made the change (``service.domain.orders.actors``); NULL on rows older than the column."""
    created_at: Mapped[datetime] = mapped_column(DateTime, server_default=func.current_timestamp())


class Payment(Base):
    """The payment channel's side of an order (docs/ARCHITECTURE.md,
    "Payments"): the internal ``order_no`` and the channel's ``channel_txn_id`` kept apart; amount in
    minor units; ``idem_key`` = ``biz_type:order_no:event`` on the notification that changed the
    order (NULL on recorded-only rows); ``raw`` = the notification as received."""

    __tablename__ = "payments"
    __table_args__ = (
        UniqueConstraint("idem_key", name="uq_payments_idem_key"),
        UniqueConstraint("channel", "channel_txn_id", name="uq_payments_channel_txn"),
        Index("ix_payments_order_no", "order_no"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    order_no: Mapped[str] = mapped_column(String(26))
    channel: Mapped[str] = mapped_column(String(32))
    channel_txn_id: Mapped[str] = mapped_column(String(64))
    event: Mapped[str] = mapped_column(String(16))
    amount: Mapped[int] = mapped_column(BigInteger)
    currency: Mapped[str] = mapped_column(String(3))
    status: Mapped[str] = mapped_column(String(16))
    flagged: Mapped[bool] = mapped_column(Boolean, default=False)
    raw: Mapped[dict[str, Any]] = mapped_column(JSON)
    idem_key: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, server_default=func.current_timestamp())
    updated_at: Mapped[datetime] = mapped_column(DateTime, server_default=func.current_timestamp())


class PaymentAttempt(Base):
    """One order's payment at one channel (the order's one
    merchant order number is reused on every attempt). ``status``: ``open`` (created at the
    channel), ``closed`` (closed at the channel, it can no longer be paid there) or ``paid``."""

    __tablename__ = "payment_attempts"
    __table_args__ = (UniqueConstraint("order_no", "channel", name="uq_payment_attempts_order_channel"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    order_no: Mapped[str] = mapped_column(String(26))
    channel: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(DateTime, server_default=func.current_timestamp())
    updated_at: Mapped[datetime] = mapped_column(DateTime, server_default=func.current_timestamp())


class Refund(Base):
    """An operator's refund of a paid order, asked of the channel that took the payment
    (``channel`` + ``payment_txn_id``); amount in minor units; ``restock``: the units go back on
    sale once the channel confirms. ``status``: ``requested``, ``refunded``, ``failed``, ``rejected``."""

    __tablename__ = "refunds"
    __table_args__ = (
        UniqueConstraint("refund_no", name="uq_refunds_refund_no"),
        Index("ix_refunds_order_no", "order_no"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    refund_no: Mapped[str] = mapped_column(String(32))
    order_no: Mapped[str] = mapped_column(String(26))
    channel: Mapped[str] = mapped_column(String(32))
    payment_txn_id: Mapped[str] = mapped_column(String(64))
    amount: Mapped[int] = mapped_column(BigInteger)
    restock: Mapped[bool] = mapped_column(Boolean, default=False)
    status: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(DateTime, server_default=func.current_timestamp())
    updated_at: Mapped[datetime] = mapped_column(DateTime, server_default=func.current_timestamp())


class OrderNoSequence(Base):
    """The MySQL order-number minter's counter for one shard reserved to it (90-99, see
    ``service.domain.order_numbers.mysql_minter``): the last UTC ``yyyyMMddHHmmss`` second and sequence
    handed out. Only ever moves forward, so no number is handed out twice."""

    __tablename__ = "order_no_sequences"

    shard: Mapped[int] = mapped_column(TINYINT, primary_key=True, autoincrement=False)
    second: Mapped[str] = mapped_column(String(14))
    sequence: Mapped[int] = mapped_column(Integer)


class WaitingRoomDraw(Base):
    """The draw of a product's pre-queue at the opening of its sale (docs/ARCHITECTURE.md,
    "Waiting room"): the seed the order derives from, how many took part, and the drawn order
    (user ids, one per line), kept for audit after Redis forgot the room."""

    __tablename__ = "waiting_room_draws"

    product_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    opened_ms: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    """The Redis time (Unix ms) of the first call that found the sale open: when the draw took effect."""
    seed: Mapped[str] = mapped_column(String(64))
    entrants: Mapped[int] = mapped_column(Integer)
    drawn_order: Mapped[str] = mapped_column(LONGTEXT)
    created_at: Mapped[datetime] = mapped_column(DateTime, server_default=func.current_timestamp())
