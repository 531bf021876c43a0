"""Per-process sold-out flags: most rejections of a sold-out product never leave the process.

When Redis answers ``sold_out`` for a product, the purchase path raises a flag for it in this
process; while the flag stands, a request *without* an Idempotency-Key is answered from it
(``sold_out``, or ``400`` for a quantity above the per-user limit) with no Redis round trip and no
order number taken. A flag only ever short-circuits a rejection, never an acceptance, so it
cannot oversell; the risk is the other way round, hiding a unit that came back. Hence:

- Every Lua script that puts stock back (``restock``, ``release``, ``realign``) announces the
  product on a Redis pub/sub channel; each API process follows the channel and clears the
  product's flag (:meth:`SoldOutFlags.restocked`). A returned unit stays hidden only as long as
  the announcement takes to arrive.
- A flag lives at most ``ttl_seconds`` (and never past the sale's end), the bound when an
  announcement is lost.
- Flags are raised only while the process follows the channel (:meth:`following`); when the
  subscription is lost or (re)made, every flag is dropped, since announcements may have been
  missed in between.
- The set-after-clear race: a request takes a :meth:`token` before it asks Redis; its
  ``sold_out`` answer raises the flag only if no clear for the product (and no resubscription)
  arrived since. A ``sold_out`` that raced a restock never sticks.
- What a flag answers is exactly what ``reserve.lua`` would answer for a request that is not a
  replay: its checks run sale window, quantity above the limit, stock, then the user's quota,
  and the flag holds the limit and the stock Redis reported (an upper bound of the stock until
  the next clear), and expires at the sale's end. Requests with an Idempotency-Key (possible
  replays of an accepted purchase) always go to Redis.

Single-threaded by design: one instance per process, used from its event loop only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum


class FlagAnswer(Enum):
    """What a standing flag answers for a request."""

    OVER_LIMIT = "over_limit"  # the quantity alone is above the per-user limit (400)
    SOLD_OUT = "sold_out"  # the quantity is above the stock Redis last reported (409)


@dataclass(frozen=True, slots=True)
class Token:
    """The flag state a request saw when it started: (resubscriptions, clears of its product)."""

    epoch: int
    generation: int


@dataclass(frozen=True, slots=True)
class _Flag:
    stock: int  # units Redis reported with sold_out: an upper bound until the next clear
    per_user_limit: int
    until: float  # clock() deadline


class SoldOutFlags:
    """The sold-out flags of one process. ``ttl_seconds`` (> 0) bounds a flag's life; ``clock``
    is monotonic seconds (injectable for tests)."""

    def __init__(self, ttl_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        if ttl_seconds <= 0:
            raise ValueError("ttl_seconds must be positive (0 means: build no flags at all)")
        self._ttl = ttl_seconds
        self._clock = clock
        self._flags: dict[int, _Flag] = {}
        self._generations: dict[int, int] = {}
        self._epoch = 0
        self._live = False

    @property
    def live(self) -> bool:
        """True while the process follows the restock announcements (flags can be raised)."""
        return self._live

    def verdict(self, product_id: int, quantity: int) -> FlagAnswer | None:
        """The answer of a standing flag for ``quantity`` units, or None: ask Redis."""
        flag = self._flags.get(product_id)
        if flag is None:
            return None
        if self._clock() >= flag.until:
            del self._flags[product_id]
            return None
        if quantity > flag.per_user_limit:
            return FlagAnswer.OVER_LIMIT
        if quantity > flag.stock:
            return FlagAnswer.SOLD_OUT
        return None

    def token(self, product_id: int) -> Token:
        """Take before asking Redis; hand to :meth:`sold_out` with Redis's answer."""
        return Token(self._epoch, self._generations.get(product_id, 0))

    def sold_out(
        self, product_id: int, token: Token, stock: int, per_user_limit: int, sale_left_ms: int | None
    ) -> bool:
        """Redis answered ``sold_out`` with ``stock`` units left, the per-user limit and the time
        left in the sale (None: no end). Raise the flag unless the process does not follow the
        announcements, or a clear or resubscription arrived since ``token`` was taken.
        True when the flag was raised."""
        if not self._live or token != self.token(product_id):
            return False
        lifetime = self._ttl if sale_left_ms is None else min(self._ttl, sale_left_ms / 1000)
        if lifetime <= 0:
            return False
        self._flags[product_id] = _Flag(stock, per_user_limit, self._clock() + lifetime)
        return True

    def restocked(self, product_id: int) -> None:
        """Stock of ``product_id`` went up (or its sale terms changed): drop its flag, and make
        every ``sold_out`` answer to a request that started before now unable to raise it."""
        self._generations[product_id] = self._generations.get(product_id, 0) + 1
        self._flags.pop(product_id, None)

    def following(self) -> None:
        """The subscription to the announcements is (again) confirmed. Announcements sent before
        may have been missed: drop every flag, then flags may be raised."""
        self._epoch += 1
        self._flags.clear()
        self._live = True

    def lost(self) -> None:
        """The subscription is gone: drop every flag and raise none until :meth:`following`."""
        self._live = False
        self._epoch += 1
        self._flags.clear()
