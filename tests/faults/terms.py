"""The fault suite's terms: the sale each case runs, the deployment it starts, the bounds it
demands (tests/faults/harness.py), and the one clock the suite reads."""

import time

# -- the sale ------------------------------------------------------------------------------------
STOCK = 500
LIMIT = 2
REQUESTS = 2400
USERS = 1200
CONCURRENCY = 64
PURCHASE_RATE = 200.0
"""New purchases per second at most (retries are not paced): the 2,400 take about 12 s and the
stock sells out over the first few, so a fault injected mid-sale meets orders in flight."""
WORKERS = 2
PREFETCH = 64  # the consumer's prefetch window (the poison flood is larger)
PRICE = 1500

# -- the deployment ------------------------------------------------------------------------------
GRACE_SECONDS = 3.0  # FLASHSALE_REALIGN__GRACE_SECONDS: a reservation without a row is overdue after this
WATCH_SECONDS = 1.0  # realign --watch
SWEEP_SECONDS = 5.0  # sweep --watch (the payment window is 15 minutes: it cancels nothing here)

# -- what the suite demands ----------------------------------------------------------------------
STRANDED_BOUND = 15.0
"""Seconds a reservation may stay in the journal without a row once the fault is over (the
bound for stranded reservations in docs/ARCHITECTURE.md, "Self-healing", with this deployment's
grace and watch interval)."""
RECOVERY_TIMEOUT = 120.0  # seconds after the load (and the fault) for everything to settle
BUYER_PATIENCE = 90.0  # seconds a buyer keeps retrying one purchase
LOAD_DEADLINE = 150.0
"""Seconds the load may take in all: past it, retries stop and purchases not sent yet are not
sent (a service that never recovers would otherwise keep the 64 connections retrying for hours)."""
POISON_STALL_BOUND = 5.0  # seconds a poison flood may hold up real orders ("a few seconds")
REPUBLISH_PER_ORDER = 3
"""Re-published messages per accepted order at most while consumers lag (once per back-off
period, not once per realignment pass: a pass per second for ~20 s was 6 per order)."""
READINESS_LIE_BOUND = 3.0
"""Seconds readiness may say 200 while every purchase answers 503 (Redis lost its data)."""

RETRY_STATUSES = {0, 429, 503}  # no answer (connection lost, timeout), too many requests, unavailable
RETRY_CODES = {"request_in_progress"}  # 409: the same key's purchase is still being settled
CANARY_STOCK = 1_000_000
CANARY_EVERY = 0.5


def monotonic() -> float:
    return time.monotonic()
