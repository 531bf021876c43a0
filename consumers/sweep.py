"""``flashsale sweep``: the payment-timeout sweep (one pass, or ``--watch`` until SIGTERM).

The pass itself is :func:`service.domain.orders.lifecycle.expire_unpaid`; this module only opens the
connections, repeats and prints, as :mod:`consumers.realign` does for realignment.
"""

from __future__ import annotations

import json

from consumers import worker_metrics
from service.domain.orders.lifecycle import expire_unpaid
from service.failures import is_outage
from service.log_setup import configure_logging
from service.runtime import watch
from service.settings import Settings
from service.startup import job_opened


async def run_sweep(
    settings: Settings,
    product_id: int | None,
    every: float | None,
    as_json: bool = False,
    metrics_port: int | None = None,
) -> None:
    """``flashsale sweep``: cancel unpaid orders past the payment window; one pass, or repeated
    every ``every`` seconds until SIGTERM/SIGINT (then ``/metrics`` on ``metrics_port``, default
    ``FLASHSALE_METRICS__PORT``, 0: not served). Each pass prints one line (a JSON object
    ``{"cancelled", "window_seconds", "product_id"}`` with ``as_json``). With ``every`` it
    outlives store outages as ``realign --watch`` does (:func:`service.runtime.watch`)."""
    configure_logging(settings.log_level)
    window = settings.payment.window_seconds
    async with job_opened(settings, publish=False, wait=every is not None) as opened_job:
        if opened_job is None:  # stopped while waiting for a store
            return
        job = opened_job

        async def one_pass() -> None:
            cancelled = await expire_unpaid(
                job.engine, job.store, window, product_id=product_id, may_cancel=job.checkout.may_cancel
            )
            if as_json:
                line = json.dumps({"cancelled": cancelled, "window_seconds": window, "product_id": product_id})
            else:
                line = f"cancelled {cancelled} unpaid order(s) past {window}s"
            print(line, flush=True)

        async with worker_metrics.exposed(settings, metrics_port if every else 0, sample_queues=False):
            await watch(every, one_pass, survive=is_outage, event="sweep_pass")
