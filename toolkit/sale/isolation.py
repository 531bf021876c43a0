"""Run-scoped settings: one database, key prefix and set of queue names per run (tests,
``flashsale sale``), the environment that hands them to child processes, and the run itself
(:class:`Sale`)."""

from __future__ import annotations

import json
import os
import random
import re
import secrets
import socket
from dataclasses import dataclass

from pydantic import BaseModel
from sqlalchemy.engine import make_url

from service.settings import Settings


def new_run_id(kind: str) -> str:
    """``<kind>_<8 hex>``: a name usable as database name, key prefix and queue-name prefix."""
    return f"{kind}_{secrets.token_hex(4)}"


def isolated_settings(base: Settings, run_id: str) -> Settings:
    """``base`` with its own database (named ``run_id``), Redis key prefix and AMQP names.

    Raises:
        ValueError: ``run_id`` is not ``[A-Za-z0-9_]+``.
    """
    if not re.fullmatch(r"[A-Za-z0-9_]+", run_id):
        raise ValueError("run id must match [A-Za-z0-9_]+")
    url = make_url(base.db.url).set(database=run_id).render_as_string(hide_password=False)
    return base.model_copy(
        update={
            "db": base.db.model_copy(update={"url": url}),
            "redis": base.redis.model_copy(update={"key_prefix": run_id}),
            "amqp": base.amqp.model_copy(
                update={
                    "exchange": f"{run_id}.orders",
                    "queue": f"{run_id}.orders",
                    "dead_letter_exchange": f"{run_id}.orders.dlx",
                    "dead_letter_queue": f"{run_id}.orders.dead",
                }
            ),
        }
    )


def consumer_partitions(consumers: int, partitions: int) -> list[list[int]]:
    """The order-queue partitions each of ``consumers`` consumers takes: consumer ``i`` takes
    every partition ``j`` with ``j mod consumers == i`` (with more consumers than partitions,
    partition ``i mod partitions``), so every partition has a consumer and partitions are shared
    out evenly. ``[[0, 1, 2], [3, 4]]``-shaped: one list per consumer, each sorted.

    Raises:
        ValueError: ``consumers`` or ``partitions`` below 1.
    """
    if consumers < 1 or partitions < 1:
        raise ValueError("a sale needs at least one consumer and one partition")
    if consumers >= partitions:
        taken = [[number % partitions] for number in range(consumers)]
    else:
        taken = [[p for p in range(partitions) if p % consumers == number] for number in range(consumers)]
    assert {p for each in taken for p in each} == set(range(partitions)), "a partition without a consumer"
    return taken


def with_own_secrets(settings: Settings) -> Settings:
    """``settings`` with a random JWT secret and a random secret for each payment channel (same
    channel names): what a run that starts its own API uses instead of the development secrets."""
    auth = settings.auth.model_copy(update={"jwt_secret": secrets.token_hex(32)})
    channels = {name: secrets.token_hex(32) for name in settings.payment.channel_secrets}
    payment = settings.payment.model_copy(update={"channel_secrets": channels})
    return settings.model_copy(update={"auth": auth, "payment": payment})


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now (for a subprocess to bind)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _env_value(value: object) -> str:
    """One setting as pydantic-settings reads it back: JSON for dicts and lists, ``true``/``false``
    for booleans, ``str`` otherwise."""
    if isinstance(value, dict | list):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _variables(model: BaseModel, prefix: str, delimiter: str) -> dict[str, str]:
    """``<PREFIX><FIELD>`` per field of ``model``; a nested group recurses with ``<FIELD><delimiter>``."""
    variables: dict[str, str] = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        key = f"{prefix}{name.upper()}"
        if isinstance(value, BaseModel):
            variables |= _variables(value, f"{key}{delimiter}", delimiter)
        else:
            variables[key] = _env_value(value)
    return variables


def environment(settings: Settings) -> dict[str, str]:
    """The ``FLASHSALE_*`` variables that make a subprocess read exactly ``settings``: every field
    of the model, nested groups joined with ``__`` (``FLASHSALE_DB__URL``), dicts and lists as JSON."""
    config = Settings.model_config
    return _variables(settings, config.get("env_prefix", ""), config.get("env_nested_delimiter") or "__")


@dataclass(frozen=True, slots=True)
class Sale:
    """One run of ``flashsale sale``: its id, the settings of every process in it, the API's base
    URL, the product on sale and its terms (``stock`` and ``per_user_limit`` in units, its stock
    ``buckets`` in Redis, its ``waiting_room``); ``isolated`` False with ``--url``."""

    run_id: str
    settings: Settings
    isolated: bool
    url: str
    product_id: int
    stock: int
    per_user_limit: int
    buckets: int = 1
    waiting_room: bool = False


def sale_settings(settings: Settings, run_id: str, window_seconds: int | None) -> Settings:
    """``settings`` isolated for the run (:func:`isolated_settings`) with secrets of its own
    (:func:`with_own_secrets`), no per-address purchase rate (every buyer comes from this
    machine) and, when given, a payment window of ``window_seconds``."""
    isolated = with_own_secrets(isolated_settings(settings, run_id))
    # Every simulated buyer comes from this one machine: the per-address purchase rate would
    # throttle the whole crowd, so it is off; the per-user rate stays as configured.
    limits = isolated.rate_limit.model_copy(update={"address_per_second": 0.0})
    isolated = isolated.model_copy(update={"rate_limit": limits})
    if window_seconds is None:
        return isolated
    payment = isolated.payment.model_copy(update={"window_seconds": window_seconds})
    return isolated.model_copy(update={"payment": payment})


def new_sale(
    settings: Settings,
    url: str | None,
    stock: int,
    per_user_limit: int,
    window_seconds: int | None,
    buckets: int = 1,
    host: str = "127.0.0.1",
) -> Sale:
    """A new run with a random product id in [10^9, 2*10^9): isolated settings (payment window
    ``window_seconds`` seconds when given) and an API URL on ``host`` at a free port (the
    channel simulator's too), or ``settings`` as given with ``url``."""
    run_id = new_run_id("sale")
    product_id = random.randrange(10**9, 2 * 10**9)
    if url is not None:
        return Sale(run_id, settings, False, url.rstrip("/"), product_id, stock, per_user_limit, buckets)
    isolated = sale_settings(settings, run_id, window_seconds)
    api_url = f"http://{host}:{free_port(host)}"
    if window_seconds is not None:
        isolated = with_own_channels(isolated, f"http://{host}:{free_port(host)}", api_url)
    return Sale(run_id, isolated, True, api_url, product_id, stock, per_user_limit, buckets)


def with_own_channels(settings: Settings, simulator_url: str, api_url: str) -> Settings:
    """``settings`` whose channels (those with a secret) are served by the simulator at
    ``simulator_url`` (``<url>/<channel>``) and notify the API at ``api_url``."""
    payment = settings.payment.model_copy(
        update={
            "channel_urls": {name: f"{simulator_url}/{name}" for name in settings.payment.channel_secrets},
            "notify_url": f"{api_url}/api/v1/payments/notify",
        }
    )
    return settings.model_copy(update={"payment": payment})


def simulator_url(settings: Settings) -> str:
    """The simulator's base URL of settings made by :func:`with_own_channels`."""
    first = next(iter(settings.payment.channel_urls.values()))
    return first.rsplit("/", 1)[0]


def child_env(settings: Settings) -> dict[str, str]:
    """This process's environment plus the ``FLASHSALE_*`` variables of ``settings``
    (:func:`environment`)."""
    return {**os.environ, **environment(settings)}
