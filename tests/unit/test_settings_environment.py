"""The child processes' environment is generated from the settings model: every field round-trips.

Needs no running server.
"""

from __future__ import annotations

import os

import pytest
from pydantic import BaseModel

from service.settings import (
    AMQPSettings,
    AuthSettings,
    DBSettings,
    MetricsSettings,
    OrderSettings,
    PaymentSettings,
    RateLimitSettings,
    RealignSettings,
    RedisSettings,
    Settings,
    WaitingRoomSettings,
)
from toolkit.sale.isolation import environment


def _leaves(model: BaseModel, path: str = "") -> dict[str, object]:
    """Every non-group field of ``model`` by dotted path."""
    leaves: dict[str, object] = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            leaves |= _leaves(value, f"{path}{name}.")
        else:
            leaves[f"{path}{name}"] = value
    return leaves


def _unlike_the_defaults() -> Settings:
    """Settings with every field set to something other than its default."""
    return Settings(
        db=DBSettings(
            url="mysql+asyncmy://app:pw@db.example:3307/shop", pool_size=7, max_overflow=3, idle_session_seconds=9
        ),
        redis=RedisSettings(
            url="redis://cache.example:6380/2",
            key_prefix="run_1.x-y",
            max_connections=17,
            socket_timeout=0.75,
            connect_timeout=1.25,
            health_check_interval=4.5,
            cluster=True,
            cluster_nodes=["cache-2.example:6380", "10.0.0.3:7000"],
        ),
        amqp=AMQPSettings(
            url="amqp://u:p@mq.example:5673/vh",
            exchange="x.orders",
            queue="x.orders.q",
            dead_letter_exchange="x.dlx",
            dead_letter_queue="x.dead",
            confirm_timeout=2.5,
            delivery_limit=9,
            prefetch=11,
            publish_channels=3,
            group_max=7,
            group_linger_ms=0.5,
            group_linger_adaptive=False,
            batch_size=13,
            batch_writers=2,
            batch_linger_ms=7.5,
            retry_delays=[0.25, 3.0],
            partitions=3,
            failover_urls=["amqp://u:p@rabbit-2:5673/v", "amqps://u:p@rabbit-3:5671/v"],
            heartbeat_seconds=4,
        ),
        auth=AuthSettings(
            jwt_secret="s" * 40,
            token_ttl_seconds=120,
            leeway_seconds=1.5,
            audience="shop",
            issuer="https://idp.example",
            max_token_bytes=2048,
        ),
        orders=OrderSettings(
            order_no_prefix="QX",
            replay_ttl_seconds=600,
            token_ttl_seconds=45,
            shard_lease_seconds=12,
            sequence_block=7,
            publish_mode="async",
            sold_out_flag_seconds=0.25,
        ),
        realign=RealignSettings(grace_seconds=1.5, auto_seconds=2.5, keep_resolved_seconds=30.0),
        rate_limit=RateLimitSettings(user_per_second=2.5, user_burst=3, address_per_second=7.5, address_burst=9),
        waiting_room=WaitingRoomSettings(
            admit_factor=2.5,
            admission_ttl_seconds=30,
            poll_min_ms=500,
            poll_max_ms=9000,
            arrival_window_ms=250,
            depart_after_polls=4.5,
            depart_grace_ms=20_000,
            opening_draw_ms=5_000,
            poll_budget_per_second=250,
        ),
        payment=PaymentSettings(
            channel_secrets={"a": "secret-a", "b": 'quote " and \\ backslash'},
            window_seconds=33,
            currency="EUR",
            channel_urls={"a": "http://pay.example:9/a"},
            channel_timeout=1.5,
            notify_url="http://api.example/api/v1/payments/notify",
        ),
        metrics=MetricsSettings(enabled=False, port=9109, host="0.0.0.0"),
        access_log=False,
        log_level="DEBUG",
        env="development",
        allow_unknown=["FLASHSALE_SIDECAR_MODE"],
    )


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No ``FLASHSALE_*`` variable from the process running the tests."""
    for name in list(os.environ):
        if name.upper().startswith("FLASHSALE_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_every_setting_round_trips_through_the_child_environment(clean_environment: pytest.MonkeyPatch) -> None:
    custom = _unlike_the_defaults()
    defaults = _leaves(Settings(_env_file=None))  # type: ignore[call-arg]
    assert [path for path, value in _leaves(custom).items() if value == defaults[path]] == []

    variables = environment(custom)
    assert len(variables) == len(defaults)
    assert all(name.startswith("FLASHSALE_") for name in variables)
    assert variables["FLASHSALE_DB__URL"] == custom.db.url
    assert variables["FLASHSALE_AUTH__JWT_SECRET"] == custom.auth.jwt_secret
    for name, value in variables.items():
        clean_environment.setenv(name, value)

    assert Settings(_env_file=None) == custom  # type: ignore[call-arg]


def test_the_defaults_round_trip_too(clean_environment: pytest.MonkeyPatch) -> None:
    defaults = Settings(_env_file=None)  # type: ignore[call-arg]
    for name, value in environment(defaults).items():
        clean_environment.setenv(name, value)
    assert Settings(_env_file=None) == defaults  # type: ignore[call-arg]
