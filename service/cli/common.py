"""What the command modules share: running a coroutine, the settings, the ``--metrics-port``
option.

The command modules import only click (and the standard library) at module level: ``flashsale
--help`` and a short command then load neither pydantic, structlog nor the stores' drivers; each
command imports what it uses when it runs.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from service.settings import Settings

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on uvloop (the asyncio loop where uvloop is missing)."""
    from service.runtime import run_async

    return run_async(coro)


def load_settings() -> Settings:
    """The process settings (environment, ``.env``; :func:`service.settings.get_settings`)."""
    from service.settings import get_settings

    return get_settings()


metrics_port_option = click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve /metrics on this port (default FLASHSALE_METRICS__PORT; 0: not served).",
)
