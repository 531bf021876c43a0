"""Whether Redis may evict keys (``maxmemory-policy``), as readiness reports it.

Stock counters, the reservation journal, quotas and replay records live in Redis without a TTL
or with one that must run out by itself: a Redis that evicts keys under memory pressure
(``allkeys-*``, ``volatile-*``: anything but ``noeviction``) can drop any of them. MySQL backs
up what it can (the stock, the per-user limit: :mod:`service.domain.purchase.user_quota`), but a lost
journal entry is a lost reservation and a lost replay record a second purchase attempt. So the
API reads the policy once at start and again at most every :data:`REFRESH_SECONDS` (when the
readiness probe asks), and is not ready while Redis may evict.

``CONFIG`` may be renamed away or denied by an ACL (managed Redis services do that): then the
policy is unknown, logged once, and not held against readiness. On a Redis Cluster every master
is asked; the policy reported is the first one that is not ``noeviction`` (one evicting master
loses the keys of its slots).
"""

from __future__ import annotations

import time

import structlog
from redis.exceptions import ResponseError

from service.adapters.redis.boundary import translated
from service.adapters.redis.client import RedisClient, config_values

log = structlog.get_logger(__name__)

REFRESH_SECONDS = 30.0
"""Least time between two reads of the policy."""
SAFE_POLICY = "noeviction"


class EvictionPolicy:
    """The ``maxmemory-policy`` of the Redis behind ``redis``, read with ``CONFIG GET`` at most
    every ``refresh_seconds`` (default :data:`REFRESH_SECONDS`)."""

    def __init__(self, redis: RedisClient, refresh_seconds: float | None = None) -> None:
        self._redis = redis
        self._refresh = refresh_seconds
        self._next_read = 0.0
        self._unavailable_logged = False
        self.policy: str | None = None
        """The policy last read; None when unknown (not read yet, or ``CONFIG`` unavailable)."""

    @property
    def may_evict(self) -> bool:
        """True when the policy last read lets Redis evict keys (anything but ``noeviction``)."""
        return self.policy is not None and self.policy != SAFE_POLICY

    @translated
    async def check(self, *, force: bool = False) -> str | None:
        """Read the policy again when the last read is :data:`REFRESH_SECONDS` old (or
        ``force``); returns it (None: unknown). A connection error propagates as
        :class:`~service.failures.StoreUnavailable` (Redis is down, readiness says so
        anyway); a refused ``CONFIG`` leaves the policy unknown."""
        now = time.monotonic()
        if not force and now < self._next_read:
            return self.policy
        self._next_read = now + (REFRESH_SECONDS if self._refresh is None else self._refresh)
        try:
            policies = await config_values(self._redis, "maxmemory-policy")
        except ResponseError as exc:  # renamed away, or NOPERM
            if not self._unavailable_logged:
                log.warning("redis_config_unavailable", error=str(exc))
                self._unavailable_logged = True
            self.policy = None
            return None
        policy = next((each for each in policies if each != SAFE_POLICY), policies[0] if policies else None)
        if policy != self.policy and policy is not None and policy != SAFE_POLICY:
            log.error("redis_may_evict_keys", maxmemory_policy=policy, expected=SAFE_POLICY)
        self.policy = policy
        return policy
