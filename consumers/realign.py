"""``flashsale realign``: the stock realignment job (one pass, or ``--watch`` until SIGTERM).

The pass itself is :class:`service.domain.stock.realign.Realigner`; this module only opens the
connections, repeats and prints.
"""

from __future__ import annotations

import sys

from consumers import observe
from service.bootstrap import opened
from service.cli.render import print_reports
from service.domain.errors import ProductNotFound
from service.failures import is_outage
from service.log_setup import configure_logging
from service.runtime import watch
from service.settings import Settings
from service.startup import opened_when_reachable


async def run_realign(
    settings: Settings,
    product_id: int | None,
    dry_run: bool,
    every: float | None,
    as_json: bool,
    metrics_port: int | None = None,
) -> int:
    """Realign ``product_id`` (or every product); repeat every ``every`` seconds when given.
    ``dry_run`` reports without writing. With ``every``, ``/metrics`` is served on
    ``metrics_port`` (default ``FLASHSALE_METRICS__PORT``; 0: not served). Returns the exit
    status: 0, or 1 for an unknown product.

    With ``every`` it outlives store outages: started while Redis, RabbitMQ or MySQL is away it
    waits for them, and a pass that meets an outage is tried again with back-off (see
    :func:`service.runtime.watch`); one log line when an outage begins, one when it ends."""
    configure_logging("WARNING")
    publish = not dry_run
    opening = opened(settings, publish=publish) if every is None else opened_when_reachable(settings, publish=publish)
    async with opening as resources:
        if resources is None:  # stopped while waiting for a store
            return 0
        realigner = resources.realigner

        async def one_pass() -> None:
            print_reports(await realigner.realign_pass(product_id, dry_run), as_json)

        try:
            async with observe.exposed(settings, metrics_port if every else 0, sample_queues=False):
                await watch(every, one_pass, survive=is_outage, event="realign_pass")
        except ProductNotFound as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0
