"""One buyer of a ``flashsale sale`` crowd at work (:class:`Visit`), inside a Locust user of
:mod:`toolkit.sale.swarm_users`: it arrives at its time, then, with the waiting room, joins the
product's queue, follows its ticket and buys with the admission token; without the room it sends
purchases straight at ``POST /orders``, as people and scripts do at a sale without a queue.
Every answer goes into the buyer's :class:`~toolkit.sale.crowd.Trail`.
"""

from __future__ import annotations

import time
from typing import Any

import gevent
import msgspec
from locust import FastHttpUser

from toolkit.sale.crowd import NOT_IN_QUEUE, SCRIPT_JOINS, SCRIPT_POLL, Behaviour, Purchase, Told, Trail
from toolkit.sale.plan import ACCEPTED
from toolkit.sale.swarm_crew import Answered, answer_of, body_of, crew, send_request

ORDERS_PATH = "/api/v1/orders"
FALLBACK_POLL = 1.0
"""Seconds an honest buyer waits when an answer names no interval."""
SNIPE_EVERY = 10
"""A scripted buyer in the queue fires a purchase without an admission every this many polls."""
TOO_SOON = "too_many_requests"
"""``GET .../queue/me`` sooner than the last answer said (a ticket in this state, ``poll_after_ms``
its ``Retry-After``)."""
CLOCK_SLACK = 1.0
"""Seconds past the opening after which ``sale_not_active`` means the sale is over, not yet to open."""
DONE = frozenset({"sold_out", "closed"})
"""Ticket states after which a buyer stops."""
GIVE_UP = frozenset({"sold_out", "limit_exceeded", "product_not_found", "sale_not_active"})
"""Purchase answers after which a buyer without the room stops (once the sale is open)."""


class Gone(Exception):
    """The buyer stops: it left, or the deadline passed."""


class Visit:
    """One buyer's calls and choices, every answer written into its :class:`Trail`."""

    def __init__(self, user: FastHttpUser, trail: Trail) -> None:
        self.user = user
        self.trail = trail
        self.buyer = trail.buyer
        self.queue = f"/api/v1/products/{crew.product_id}/queue"
        self.headers = {"Authorization": crew.tokens[trail.buyer.user]}
        self.keys = 0

    def run(self) -> None:
        due = crew.opened + self.buyer.arrival
        gevent.sleep(max(0.0, due - time.time()))
        self.trail.arrived = time.time()
        try:
            self._in_the_room() if crew.room else self._without_room()
        except Gone:
            pass

    def _call(
        self, method: str, path: str, name: str, headers: dict[str, str], body: bytes | None, due: float
    ) -> Answered:
        if time.time() > crew.deadline:
            self.trail.timed_out = True
            raise Gone
        status, content, answer_headers, sent, finished = send_request(self.user, method, path, name, headers, body)
        self.trail.lags.append(sent - due)
        return status, content, answer_headers, sent, finished

    def _sleep(self, seconds: float) -> float:
        """Sleep ``seconds``; returns when the next call is due."""
        due = time.time() + seconds
        gevent.sleep(seconds)
        return due

    def _error(self, code: str) -> None:
        self.trail.errors[code] = self.trail.errors.get(code, 0) + 1

    def _ticket(self, method: str, path: str, into: list[Told], due: float) -> Told | None:
        """One queue call; the ticket it answered (None: no ticket, counted in ``errors``; a
        ``Retry-After`` of such an answer is slept here)."""
        status, content, headers, sent, finished = self._call(method, path, f"{method} queue", self.headers, None, due)
        if status == 0:
            self._error((content or b"").decode())
            self.trail.unticketed.append(sent)
            return None
        body = body_of(content)
        if status != 200:
            code = body.code or f"http_{status}"
            if code != NOT_IN_QUEUE:
                self.trail.unticketed.append(sent)
            self._error(code)
            if code == NOT_IN_QUEUE:  # no place (an admission lapsed or was used): the buyer may join again
                lost = Told(finished, NOT_IN_QUEUE, None, None, None, None, None, None, None, sent=sent)
                into.append(lost)  # the place ended here: what the room promised of it ends too
                return lost
            if code == TOO_SOON:  # asked sooner than told: _wait_of decides how long this buyer waits
                retry_ms = int(headers.get("Retry-After") or FALLBACK_POLL) * 1000
                return Told(finished, TOO_SOON, None, None, None, None, None, None, retry_ms)
            gevent.sleep(float(headers.get("Retry-After") or FALLBACK_POLL))
            return None
        told = Told(
            finished,
            body.state,
            body.ticket,
            body.position,
            body.ahead,
            body.units_left,
            body.admission_token,
            body.admission_expires_at,
            body.poll_after_ms,
            body.holds_unit,
            sent,
        )
        into.append(told)
        return told

    def join(self, due: float | None = None) -> Told | None:
        return self._ticket("POST", self.queue, self.trail.joins, time.time() if due is None else due)

    def poll(self, due: float | None = None) -> Told | None:
        return self._ticket("GET", f"{self.queue}/me", self.trail.polls, time.time() if due is None else due)

    def next_key(self) -> str:
        """A new Idempotency-Key: one per unit the buyer goes after."""
        self.keys += 1
        return f"{self.buyer.user}-{self.keys}"

    def buy(self, key: str, admission: str | None, due: float | None = None) -> Purchase:
        headers = {**self.headers, "Idempotency-Key": key, "Content-Type": "application/json"}
        if admission is not None:
            headers["Admission-Token"] = admission
        body = msgspec.json.encode({"product_id": crew.product_id, "quantity": 1})
        due = time.time() if due is None else due
        status, content, _, sent, finished = self._call("POST", ORDERS_PATH, "POST /orders", headers, body, due)
        purchase = Purchase(sent, admission, key, 1, answer_of(status, content, sent, finished))
        self.trail.purchases.append(purchase)
        return purchase

    def _impatient_gone(self) -> bool:
        """An impatient buyer past its patience leaves (and says when)."""
        if self.buyer.patience is None or time.time() < self.trail.arrived + self.buyer.patience:
            return False
        self.trail.left = time.time()
        return True

    def _wait_of(self, told: Told) -> float:
        """How long a buyer waits before its next poll: a person what it was told; a script its
        own interval, except after a ``429``: then it hammers again from a second before the
        whole-second ``Retry-After`` ends (hammering sooner is answered ``429`` again)."""
        if self.buyer.behaviour is Behaviour.SCRIPTED:
            if told.state == TOO_SOON and told.poll_after_ms:
                return max(told.poll_after_ms / 1000 - 1.0, SCRIPT_POLL)
            return SCRIPT_POLL
        return told.poll_after_ms / 1000 if told.poll_after_ms else FALLBACK_POLL

    def _joined(self, background: list[Any]) -> Told | None:
        """Join: a script joins :data:`SCRIPT_JOINS` times and fires a purchase without an
        admission, all at once, and goes on with the first ticket answered (one ticket for all:
        the invariants check it); the other calls finish in ``background``."""
        if self.buyer.behaviour is not Behaviour.SCRIPTED:
            return self.join()
        due = time.time()
        joins = [gevent.spawn(self.join, due) for _ in range(SCRIPT_JOINS)]
        background += joins
        background.append(gevent.spawn(self.buy, self.next_key(), None, due))
        for answered in gevent.iwait(joins):
            if isinstance(answered.value, Told):
                return answered.value
        return None

    def _in_the_room(self) -> None:
        """Join, follow the ticket, buy with the admission until the buyer has its unit, is
        told ``sold_out``/``closed``, or (impatient) leaves."""
        background: list[Any] = []
        try:
            self._follow(self._joined(background))
        finally:
            gevent.joinall(background)

    def _follow(self, told: Told | None) -> None:
        polls, spent = 0, set()
        while True:
            if told is not None and told.state == NOT_IN_QUEUE:  # back in line
                if self._impatient_gone():
                    return
                told = self.join()
                continue
            if told is None or told.state not in ("admitted", *DONE) or told.admission_token in spent:
                if self._impatient_gone():
                    return
                polls += 1
                if self.buyer.behaviour is Behaviour.SCRIPTED and polls % SNIPE_EVERY == 0:
                    if self.buy(self.next_key(), None).answer.code == ACCEPTED:  # expected: 428
                        return
                due = self._sleep(FALLBACK_POLL if told is None else self._wait_of(told))
                told = self.poll(due)
                continue
            if told.state in DONE:
                return
            if self._impatient_gone():
                return  # walked away from its turn: the token lapses
            assert told.admission_token is not None
            purchase = self.buy(self.next_key(), told.admission_token)
            spent.add(told.admission_token)
            if purchase.answer.code == ACCEPTED:
                if self.buyer.behaviour is Behaviour.SCRIPTED:  # the spent admission again, for a second unit
                    self.buy(self.next_key(), told.admission_token)
                return
            if purchase.answer.code in ("sold_out", "limit_exceeded", "sale_not_active"):
                return
            told = self.poll()

    def _without_room(self) -> None:
        """Straight at ``POST /orders``: a person who came early presses the button its reaction
        time after the opening and retries only what says to retry; a script fires from its
        arrival every :data:`SCRIPT_POLL` seconds until it has its unit or is told ``sold_out``."""
        scripted = self.buyer.behaviour is Behaviour.SCRIPTED
        due = time.time()
        if not scripted:
            due = max(due, crew.opened + self.buyer.reaction)
            gevent.sleep(max(0.0, due - time.time()))
        key = self.next_key()
        while True:
            answer = self.buy(key, None, due).answer
            if answer.code == ACCEPTED:
                return
            open_now = time.time() >= crew.opened + CLOCK_SLACK
            if answer.code in GIVE_UP and (open_now or answer.code != "sale_not_active"):
                return
            if self._impatient_gone():
                return
            if not scripted and answer.status not in (0, 409, 429, 503):
                return  # a person stops at an error it cannot act on
            due = self._sleep(SCRIPT_POLL if scripted else FALLBACK_POLL)
