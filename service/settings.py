"""Configuration, read once per process from the environment (prefix ``FLASHSALE_``) and ``.env``.

Nested groups use ``__``: ``FLASHSALE_DB__URL``, ``FLASHSALE_REDIS__URL``, ``FLASHSALE_AMQP__URL``,
``FLASHSALE_AUTH__JWT_SECRET`` and so on. Every name is listed in the README.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class DBSettings(BaseModel):
    """MySQL/MariaDB, the authoritative store (SQLAlchemy async URL, asyncmy driver)."""

    url: str = "mysql+asyncmy://root@127.0.0.1:3306/flashsale"
    pool_size: int = Field(20, ge=1)
    max_overflow: int = Field(10, ge=0)


class RedisSettings(BaseModel):
    """Redis: stock pre-decrement, reservation journal, quotas, replay records, order-number sequences."""

    url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = Field("fs", pattern=r"^[A-Za-z0-9_.-]{1,40}$")
    max_connections: int = Field(200, ge=1)
    socket_timeout: float = Field(2.0, gt=0)
    """Seconds one command may wait for Redis's reply before it fails (the request answers 503)."""
    connect_timeout: float = Field(2.0, gt=0)
    """Seconds to open a connection to Redis."""
    health_check_interval: float = Field(10.0, ge=0)
    """A pooled connection idle longer than this many seconds is PINGed before its next command
    (and re-opened when the PING fails); 0 turns it off."""


class AMQPSettings(BaseModel):
    """RabbitMQ topology and publishing (seconds for timeouts)."""

    url: str = "amqp://guest:guest@127.0.0.1:5672/"
    exchange: str = "flashsale.orders"
    queue: str = "flashsale.orders"
    dead_letter_exchange: str = "flashsale.orders.dlx"
    dead_letter_queue: str = "flashsale.orders.dead"
    confirm_timeout: float = Field(5.0, gt=0)
    delivery_limit: int = Field(5, ge=1)
    prefetch: int = Field(256, ge=1)
    batch_size: int = Field(100, ge=1)  # orders one consumer writes in one MySQL transaction, at most
    publish_channels: int = Field(4, ge=1, le=64)
    """Confirming channels of the API's publisher (used in turn)."""


class AuthSettings(BaseModel):
    """JWT (HS256) for buyers and admins."""

    jwt_secret: str = Field("dev-only-secret-change-me-0123456789abcdef", min_length=32)
    token_ttl_seconds: int = Field(3600, ge=1)


class OrderSettings(BaseModel):
    """Order numbers, replay records and the API's sold-out flags.

    ``sold_out_flag_seconds``: the longest a per-process sold-out flag answers requests without
    an Idempotency-Key before Redis is asked again (the bound when a restock announcement is
    lost); 0 turns the flags off.
    """

    order_no_prefix: str = Field("FS", pattern=r"^[A-Z]{2}$")
    replay_ttl_seconds: int = Field(86_400, ge=60)
    shard_lease_seconds: int = Field(30, ge=3)
    sequence_block: int = Field(100, ge=1, le=999_999)
    """Order-number sequence numbers one Redis call takes (per shard and second)."""
    publish_mode: Literal["confirm", "async"] = "confirm"
    """``confirm``: 202 only after the broker confirmed the order message. ``async``: 202 once
    the reservation is in Redis; published in the background (see the README for the guarantee)."""
    sold_out_flag_seconds: float = Field(1.0, ge=0, le=60)


class RealignSettings(BaseModel):
    """Realignment job: a journal entry older than ``grace_seconds`` with no order row is re-published."""

    grace_seconds: float = Field(60.0, ge=0)


class PaymentSettings(BaseModel):
    """Payment channels and the payment window (seconds).

    ``channel_secrets`` is a JSON object channel -> HMAC-SHA256 secret
    (``FLASHSALE_PAYMENT__CHANNEL_SECRETS='{"mockpay": "..."}'``).
    """

    channel_secrets: dict[str, str] = {"mockpay": "dev-only-mockpay-secret-change-me"}
    window_seconds: int = Field(900, ge=1)
    currency: str = Field("CNY", pattern=r"^[A-Z]{3}$")


class MetricsSettings(BaseModel):
    """Prometheus metrics: ``enabled`` mounts ``GET /metrics`` and the request observations on
    the API; ``port`` (0: none) is where ``consume``, ``realign --watch`` and ``sweep --watch``
    expose theirs unless ``--metrics-port`` says otherwise, on ``host``."""

    enabled: bool = True
    port: int = Field(0, ge=0, le=65535)
    host: str = "127.0.0.1"


class Settings(BaseSettings):
    """All settings; ``get_settings()`` returns the process-wide instance."""

    model_config = SettingsConfigDict(
        env_prefix="FLASHSALE_", env_nested_delimiter="__", env_file=".env", extra="ignore"
    )

    db: DBSettings = DBSettings()
    redis: RedisSettings = RedisSettings()
    amqp: AMQPSettings = AMQPSettings()
    auth: AuthSettings = AuthSettings()
    orders: OrderSettings = OrderSettings()
    realign: RealignSettings = RealignSettings()
    payment: PaymentSettings = PaymentSettings()
    metrics: MetricsSettings = MetricsSettings()
    access_log: bool = True
    """One JSON line per HTTP request on stderr (``FLASHSALE_ACCESS_LOG=false``: none)."""
    log_level: str = "INFO"
    bench_routes: bool = False


@lru_cache
def get_settings() -> Settings:
    """The settings of this process, read once."""
    return Settings()
