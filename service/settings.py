"""Configuration, read once per process from the environment (prefix ``FLASHSALE_``) and ``.env``.

Nested groups use ``__``: ``FLASHSALE_DB__URL``, ``FLASHSALE_REDIS__URL``, ``FLASHSALE_AMQP__URL``,
``FLASHSALE_AUTH__JWT_SECRET`` and so on. docs/CONFIGURATION.md lists every name; it is generated
from this module (``python -m service.config_doc``), from the docstring under each field.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from service.environment_errors import (
    ENV_NESTED_DELIMITER,
    ENV_PREFIX,
    ConfigError,
    SettingsVariables,
    config_error,
    variable_name,
)
from service.queue_topology import QueueTopology

DEV_JWT_SECRET = "dev-only-secret-change-me-0123456789abcdef"
"""The JWT secret a development run may use: anyone can forge tokens with it."""
DEV_CHANNEL_SECRETS = {
    "mockpay": "dev-only-mockpay-secret-change-me",
    "altpay": "dev-only-altpay-secret-change-me",
}
"""The payment channel secrets a development run may use: anyone can forge notifications with them."""


def _url_scheme(*schemes: str) -> AfterValidator:
    """A URL whose scheme is one of ``schemes`` (the drivers installed), with a message naming them."""

    def check(url: str) -> str:
        if url.split("://", 1)[0] not in schemes or "://" not in url:
            raise ValueError(f"must be a {' or '.join(s + '://' for s in schemes)} URL")
        return url

    return AfterValidator(check)


class DBSettings(BaseModel):
    """MySQL/MariaDB, the authoritative store (SQLAlchemy async URL, asyncmy driver)."""

    url: Annotated[str, _url_scheme("mysql+asyncmy")] = "mysql+asyncmy://root@127.0.0.1:3306/flashsale"
    """SQLAlchemy URL; only the asyncmy driver is installed and supported (``mysql+asyncmy://``)."""
    pool_size: int = Field(20, ge=1)
    """Connections each process keeps open to MySQL."""
    max_overflow: int = Field(10, ge=0)
    """Connections a process may open beyond ``pool_size`` under load."""
    idle_session_seconds: int = Field(15, ge=1, le=86_400)
    """MySQL closes a connection of the service idle this long (its session ``wait_timeout``) and
    rolls back the transaction it had open: a process stopped in the middle of a transaction
    (paused, its host frozen) holds its row locks, and stalls every writer of those rows, no longer
    than this. Pooled connections idle longer are replaced when next used."""


class RedisSettings(BaseModel):
    """Redis: stock pre-decrement, reservation journal, quotas, replay records, order-number sequences."""

    url: Annotated[str, _url_scheme("redis", "rediss", "unix")] = "redis://127.0.0.1:6379/0"
    """Redis 7 (``redis://``, ``rediss://``, ``unix://``); with ``cluster``, any node of the cluster (database 0)."""
    key_prefix: str = Field("fs", pattern=r"^[A-Za-z0-9_.-]{1,40}$")
    """Prefix of every key: isolates deployments and test runs sharing one Redis."""
    max_connections: int = Field(200, ge=1)
    """Connection pool size per process; a full pool waits up to 5 s (on a cluster: per node, and a full pool fails at
    once: 503)."""
    socket_timeout: float = Field(2.0, gt=0)
    """Seconds one command may wait for Redis's reply before it fails (the request answers 503)."""
    connect_timeout: float = Field(2.0, gt=0)
    """Seconds to open a connection to Redis."""
    health_check_interval: float = Field(10.0, ge=0)
    """A pooled connection idle longer than this many seconds is PINGed before its next command
    (and re-opened when the PING fails); 0 turns it off."""
    cluster: bool = False
    """``url`` names one node of a Redis Cluster: every client is a ``RedisCluster`` that learns
    the slot map from it and follows MOVED/ASK (``max_connections`` then counts per node)."""
    cluster_nodes: list[Annotated[str, Field(pattern=r"^[^\s:/@]+:[0-9]{1,5}$")]] = []
    """With ``cluster``: other nodes of the same cluster as ``host:port`` (a JSON list), asked for
    the slot map when ``url``'s node does not answer, so a process that starts or reconnects while
    that node is down still finds the cluster (docs/OPERATIONS.md, "Redis Cluster")."""


class AMQPSettings(QueueTopology, BaseModel):  # the queue names derived from these: service/queue_topology.py
    """RabbitMQ topology and publishing (seconds for timeouts)."""

    url: Annotated[str, _url_scheme("amqp", "amqps")] = "amqp://guest:guest@127.0.0.1:5672/"
    """RabbitMQ 3.10+ (``amqp://``, ``amqps://``); on a cluster, the first node tried."""
    failover_urls: list[Annotated[str, _url_scheme("amqp", "amqps")]] = []
    """The other nodes of the same RabbitMQ cluster (a JSON list of URLs). Every connection tries
    ``url`` and these in turn, and a connection lost with its node is made again to the next one
    (docs/OPERATIONS.md, "A RabbitMQ cluster")."""
    heartbeat_seconds: int = Field(10, ge=0, le=600)
    """AMQP heartbeat timeout asked of the broker: a process that stops answering (paused, its host
    frozen) loses its connection after about this long, and the broker hands its unacknowledged
    deliveries to another consumer; 0 turns heartbeats off."""
    exchange: str = "flashsale.orders"
    """Direct exchange the order messages are published to."""
    queue: str = "flashsale.orders"
    """Quorum queue of the orders (the base name of the partitions and retry queues)."""
    dead_letter_exchange: str = "flashsale.orders.dlx"
    """Exchange undeliverable orders are dead-lettered to."""
    dead_letter_queue: str = "flashsale.orders.dead"
    """Queue of the dead-lettered orders (``flashsale dlq``); one for every partition."""
    confirm_timeout: float = Field(5.0, gt=0)
    """Seconds a publish waits for the broker's confirm (reconnecting included)."""
    delivery_limit: int = Field(5, ge=1)
    """Redeliveries before the broker dead-letters a message (a consumer dying with it in hand)."""
    prefetch: int = Field(0, ge=0)
    """Default ``consume --prefetch``: deliveries in hand per consumer and order queue it takes
    (a delivery is a message: with groups, up to ``group_max`` orders). 0: as many as carry
    512 orders at ``group_max`` orders a message (8 groups of 64; 512 single messages with
    ``group_max`` 1), so that consumers starting on a backlog of groups share it instead of the
    first taking it whole."""
    batch_size: int = Field(100, ge=1)
    """Orders one consumer writes in one MySQL transaction, at most."""
    batch_linger_ms: float = Field(20.0, ge=0, le=200)
    """Milliseconds a consumer's short batch waits for more orders, at most; it waits only while
    they come closer together than that (a stampede: larger batches, fewer transactions), not at
    all when they come further apart (a quiet sale: each written at once). 0: never waits."""
    batch_writers: int = Field(3, ge=1, le=16)
    """MySQL transactions one consumer writes at the same time, at most: more than one only while
    full batches wait (a backlog), so that their round trips overlap; a steady trickle is written
    by one, in batches as large as arrivals make them."""
    publish_channels: int = Field(4, ge=1, le=64)
    """Confirming channels of the API's publisher (used in turn)."""
    group_max: int = Field(64, ge=1, le=1000)
    """Orders one published message carries at most: the publisher groups the orders of one
    order queue reserved within ``group_linger_ms`` into one message (docs/ARCHITECTURE.md,
    "Order messages and groups"), sent at once when full. 1: one order per message, in the
    single-order format."""
    group_linger_ms: float = Field(10.0, ge=0, le=50)
    """Milliseconds a group waits for more orders after its first, at most (0: only the orders
    that arrive in the same turn of the event loop); every order of it waits that long more for
    its confirm. With ``group_linger_adaptive`` a group waits only as long as the queue's pace
    makes worthwhile."""
    group_linger_adaptive: bool = True
    """The linger follows the pace of each order queue's orders: none while they come further
    apart than ``group_linger_ms`` (a quiet sale: no wait), the time a group takes to fill at
    their pace as they come closer, ``group_linger_ms`` at most (a stampede: groups grow).
    False: every group waits ``group_linger_ms``."""
    retry_delays: list[Annotated[float, Field(gt=0, le=3600)]] = Field([1.0, 2.0, 5.0, 10.0, 30.0], min_length=1)
    """Seconds an order the consumer could not write for a transient reason (MySQL unreachable,
    deadlocks or lock waits past their retries) waits in a retry queue before it is delivered
    again: the n-th retry waits the n-th value, every later one the last. One retry queue per
    value (:meth:`retry_queue`)."""

    partitions: int = Field(1, ge=1, le=64)
    """Order queues the orders are spread over, by product (:meth:`partition_of`): every order of
    a product goes to the same queue. 1 keeps the single queue named ``queue``; with N > 1 the
    queues are ``<queue>.p0`` … ``<queue>.p<N-1>`` (:meth:`partition_queue`). Change it only with
    the order and retry queues drained: messages in the old queues are not moved."""


class AuthSettings(BaseModel):
    """JWT (HS256) for buyers and admins."""

    jwt_secret: str = Field(DEV_JWT_SECRET, min_length=32)
    """HS256 secret. The default is refused outside development mode (``FLASHSALE_ENV=development``)."""
    token_ttl_seconds: int = Field(3600, ge=1)
    """Default lifetime of the tokens ``flashsale token`` prints."""
    leeway_seconds: float = Field(5.0, ge=0, le=300)
    """Clock skew allowed on a token's ``exp``, ``nbf`` and ``iat`` (issuer and API clocks differ)."""
    audience: str = ""
    """When not empty, a token must carry this ``aud`` (deployments behind an identity provider)."""
    issuer: str = ""
    """When not empty, a token must carry this ``iss``."""
    max_token_bytes: int = Field(4096, ge=256, le=16_384)
    """A longer bearer token is refused (401) before anything decodes it (docs/API.md); raise it for an
    identity provider's larger tokens."""


class OrderSettings(BaseModel):
    """Order numbers, replay records, order tokens, the publish mode and the API's sold-out flags."""

    order_no_prefix: str = Field("FS", pattern=r"^[A-Z]{2}$")
    """The two capital letters every order number starts with."""
    replay_ttl_seconds: int = Field(86_400, ge=60)
    """How long a replay record (Idempotency-Key) and a queued order's Redis view live."""
    token_ttl_seconds: int = Field(300, ge=1)
    """How long an order token (``POST /orders/tokens``, issued when the order page opens) lives."""
    shard_lease_seconds: int = Field(30, ge=3)
    """Lease of an API worker's order-number shard, renewed every third of it; a killed worker's shard is free again
    after this."""
    sequence_block: int = Field(100, ge=1, le=99_999)
    """Order-number counter values one Redis call takes (per shard and second)."""
    publish_mode: Literal["confirm", "async"] = "confirm"
    """``confirm``: 202 only after the broker confirmed the order message. ``async``: 202 once
    the reservation is in Redis; published in the background (docs/ARCHITECTURE.md, "Publish modes")."""
    sold_out_flag_seconds: float = Field(1.0, ge=0, le=60)
    """The longest a per-process sold-out flag answers requests without an Idempotency-Key before Redis is asked
    again (the bound when a restock announcement is lost); 0 turns the flags off."""


class RateLimitSettings(BaseModel):
    """Purchase requests (``POST /orders``) allowed per product, per user and per client address,
    counted in Redis inside the reserve call (every API process shares them; no extra round trip).
    ``*_per_second``: sustained rate (0: no limit); ``*_burst``: requests allowed at once. A
    request over a limit is answered ``429 too_many_requests`` with ``Retry-After``. Not applied
    to admin or payment channel routes, nor to answers a sold-out flag gives in the process.
    The address limit is high by default because buyers behind one NAT or proxy share an address."""

    user_per_second: float = Field(5.0, ge=0)
    """Purchase requests per user and product per second, sustained (0: no limit)."""
    user_burst: int = Field(10, ge=1)
    """Purchase requests per user and product allowed at once."""
    address_per_second: float = Field(200.0, ge=0)
    """Purchase requests per client address and product per second, sustained (0: no limit)."""
    address_burst: int = Field(400, ge=1)
    """Purchase requests per client address and product allowed at once."""


class WaitingRoomSettings(BaseModel):
    """The waiting room of a product with ``waiting_room`` on (docs/ARCHITECTURE.md, "Waiting room"):
    how many buyers hold an admission at once, how long one lasts, how often clients poll."""

    admit_factor: float = Field(1.0, ge=1.0, le=100.0)
    """Buyers admitted but not yet bought are kept under the units left times this. 1: each admission holds a unit
    for its buyer until it is used or expires; above 1 (for products whose admitted buyers often do not buy) no
    admission holds a unit, and the latest ones are withdrawn when the units left no longer cover them."""
    admission_ttl_seconds: int = Field(120, ge=5, le=3600)
    """How long an admission token lasts; then its holder's place goes to the next in line."""
    poll_min_ms: int = Field(1000, ge=100, le=60_000)
    """The soonest a waiting buyer is told to poll again (``poll_after_ms``, ``Retry-After``)."""
    poll_max_ms: int = Field(5000, ge=100, le=60_000)
    """The latest a waiting buyer is told to poll again, while the line is short enough for
    ``poll_budget_per_second``: the bound on how long after the last unit a polling buyer still
    waits before hearing ``sold_out``."""
    poll_budget_per_second: int = Field(1000, ge=0, le=1_000_000)
    """The polls a second a product's whole line is paced to: once more buyers wait than this many
    per second of ``poll_max_ms``, the back of the line is told to poll after (waiting / this)
    seconds, so the room's poll load stays near this whatever the crowd (0: ``poll_max_ms`` caps)."""
    arrival_window_ms: int = Field(1000, ge=0, le=60_000)
    """After the opening, buyers who join within one such window share it, in random order, and hear of
    an admission no sooner than its end (plus up to ``poll_min_ms``): the fastest of many parallel joins
    gains little. 0: exact arrival order, an admission told at the join."""
    depart_after_polls: float = Field(3.0, ge=1.0, le=1000.0)
    """A waiting buyer who has not polled within this many times the longest interval they were told (at least
    ``poll_max_ms``) has departed: the place is lost (never admitted, not counted); coming back joins at the back."""
    opening_draw_ms: int = Field(30_000, ge=0, le=3_600_000)
    """The room opens this long after the sale: who joins before then gets a lottery place, so being read first
    in the opening's stampede earns nothing (docs/ARCHITECTURE.md, "Waiting room"); 0: the pre-queue only."""
    depart_grace_ms: int = Field(45_000, ge=0, le=3_600_000)
    """Added to every departure deadline: a poll's time in a loaded server's queue. Longer finds a buyer who left
    later (who may then be admitted and hold a unit for its TTL)."""


class RealignSettings(BaseModel):
    """Realignment: a journal entry older than ``grace_seconds`` with no order row is re-published.
    ``auto_seconds``: every API process runs the self-healing pass (one process at a time, under a
    Redis lock) this often, and at once when a purchase finds a product's Redis state gone
    (:mod:`service.domain.stock.recovery`); 0 turns it off (then only ``flashsale realign`` heals)."""

    grace_seconds: float = Field(15.0, ge=0)
    """A reservation this old with no order row is published again (then after twice that, four times, ..., at most
    every 5 min)."""
    auto_seconds: float = Field(5.0, ge=0)
    """How often every API process runs the self-healing realignment pass; 0 turns it off."""
    keep_resolved_seconds: float = Field(0.0, ge=0)
    """A reservation whose order has its row stays in the journal until this long after it was made, so that an
    order a database failover lost (asynchronous replication) is written again; 0 drops it at once."""


class PaymentSettings(BaseModel):
    """Payment channels and the payment window (seconds).

    ``channel_secrets`` is a JSON object channel -> HMAC-SHA256 secret
    (``FLASHSALE_PAYMENT__CHANNEL_SECRETS='{"mockpay": "..."}'``); ``channel_urls`` likewise
    channel -> base URL.
    """

    channel_secrets: dict[str, str] = DEV_CHANNEL_SECRETS
    """Channel -> HMAC-SHA256 secret (JSON); the simulator signs with the same. The default is refused outside
    development mode."""
    window_seconds: int = Field(900, ge=1)
    """An order unpaid this long is cancelled by ``flashsale sweep``."""
    currency: str = Field("CNY", pattern=r"^[A-Z]{3}$")
    """The shop's currency (ISO 4217); notifications in another are flagged."""
    channel_urls: dict[str, str] = {
        "mockpay": "http://127.0.0.1:8100/mockpay",
        "altpay": "http://127.0.0.1:8100/altpay",
    }
    """Channel -> base URL of its merchant API (create, query, close, refund, bill); the defaults
    are the two channels of ``flashsale channel serve``."""
    channel_timeout: float = Field(5.0, gt=0)
    """Seconds one call to a channel may take (connect, read, write, pool wait)."""
    notify_url: str = "http://127.0.0.1:8000/api/v1/payments/notify"
    """Where channels send their notifications (given to the channel with every payment)."""


class MetricsSettings(BaseModel):
    """Prometheus metrics: ``enabled`` mounts ``GET /metrics`` and the request observations on
    the API; ``port`` (0: none) is where ``consume``, ``realign --watch`` and ``sweep --watch``
    expose theirs unless ``--metrics-port`` says otherwise, on ``host``."""

    enabled: bool = True
    """``GET /metrics`` and the request observations on the API (false: neither)."""
    port: int = Field(0, ge=0, le=65535)
    """Where ``consume``, ``realign --watch`` and ``sweep --watch`` serve ``/metrics`` (0: not served)."""
    host: str = "127.0.0.1"
    """Address those processes serve ``/metrics`` on."""


class Settings(BaseSettings):
    """All settings; ``get_settings()`` returns the process-wide instance."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter=ENV_NESTED_DELIMITER, env_file=".env", extra="ignore"
    )

    db: DBSettings = DBSettings()
    redis: RedisSettings = RedisSettings()
    amqp: AMQPSettings = AMQPSettings()
    auth: AuthSettings = AuthSettings()
    orders: OrderSettings = OrderSettings()
    rate_limit: RateLimitSettings = RateLimitSettings()
    waiting_room: WaitingRoomSettings = WaitingRoomSettings()
    realign: RealignSettings = RealignSettings()
    payment: PaymentSettings = PaymentSettings()
    metrics: MetricsSettings = MetricsSettings()
    access_log: bool = True
    """One JSON line per HTTP request on stderr (``FLASHSALE_ACCESS_LOG=false``: none)."""
    log_level: Annotated[
        Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        BeforeValidator(lambda value: value.upper() if isinstance(value, str) else value),
    ] = "INFO"
    """Level of the JSON log lines on stderr (structlog; the standard library's and granian's too)."""
    env: Literal["production", "development"] = "production"
    """``development`` is the only mode in which the built-in development secrets are accepted
    (JWT, payment channels; anyone can read them in the source); outside it ``serve``, ``token``
    and ``pay`` refuse them."""
    allow_unknown: list[str] = []
    """``FLASHSALE_*`` names that are no setting and are accepted all the same (a JSON list;
    ``["*"]``: any), for an environment shared with another program or release. Any other
    unknown name in the environment or ``.env`` ends every command with one line naming it and
    the closest known name, exit code 2."""

    @property
    def dev_mode(self) -> bool:
        """True in development mode (``FLASHSALE_ENV=development``)."""
        return self.env == "development"

    def insecure_defaults(self) -> list[str]:
        """The variables still at a development default anyone can read in the source."""
        found = []
        if self.auth.jwt_secret == DEV_JWT_SECRET:
            found.append(variable_name(("auth", "jwt_secret")))
        if any(DEV_CHANNEL_SECRETS.get(name) == secret for name, secret in self.payment.channel_secrets.items()):
            found.append(variable_name(("payment", "channel_secrets")))
        return found

    def require_secrets(self) -> None:
        """Refuse the development secrets outside development mode.

        Raises:
            ConfigError: a secret is at its development default outside development mode.
        """
        insecure = self.insecure_defaults()
        if insecure and not self.dev_mode:
            raise ConfigError(
                f"{', '.join(insecure)}: still the development default (anyone can forge with it); "
                f"set a secret of your own, or FLASHSALE_ENV=development for development"
            )


VARIABLES = SettingsVariables(Settings, ENV_PREFIX, ENV_NESTED_DELIMITER)
"""Every ``FLASHSALE_*`` name the settings read."""


@lru_cache
def get_settings() -> Settings:
    """The settings of this process, read once.

    Raises:
        ConfigError: a setting is invalid, or a ``FLASHSALE_*`` variable names no setting
            (one line naming each variable).
    """
    try:
        settings = Settings()
    except ValidationError as exc:
        raise config_error(exc) from None
    except SettingsError as exc:
        raise ConfigError(VARIABLES.undecodable(str(exc), _given())) from None
    unknown = VARIABLES.unknown(_given(), settings.allow_unknown)
    if unknown:
        raise ConfigError(VARIABLES.unknown_line(unknown))
    return settings


def _given() -> dict[str, str | None]:
    """The variables the settings read: ``.env``'s, and the environment's, which win."""
    from dotenv import dotenv_values

    return {**dotenv_values(".env"), **os.environ}
