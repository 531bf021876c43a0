"""The sale's crowd as Locust users (``FastHttpUser``, geventhttpclient), run by the shipped
locustfile (:mod:`service.sale.locustfile`) in worker processes, here or on other hosts:

- lanes, closed-loop users that take the next errand of the plan as soon as they are free:
  :class:`PlanBuyer` (buys, retries with the same key, duplicate pairs sent at once, over-limit
  attempts; the no-op wave too) and :class:`Payer` (starts a payment, then pays at the channel);
- buyers of a crowd, each on its own clock (:mod:`service.sale.crowd`): :class:`HonestBuyer`
  (joins the waiting room, polls as told, buys with the admission), :class:`ImpatientBuyer` (the
  same, but leaves after its patience), :class:`ScriptedBuyer` (joins many times at once, polls
  hard, fires purchases without an admission). Without the room they go straight at
  ``POST /orders``.

The worker's share of the plan is in :data:`crew`, filled by the master's assignment. Every
request waits for one of the worker's connections (``crew.slots``) and is recorded with when it
was due, when it got a connection and its answer. Times are epoch seconds (``time.time()``), so
trails from several hosts merge on one clock.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, ClassVar

import gevent
import msgspec
from gevent.event import Event
from gevent.lock import BoundedSemaphore
from geventhttpclient.client import HTTPClientPool
from locust import FastHttpUser, constant, task
from locust.exception import StopUser

from service.sale.crowd import SCRIPT_JOINS, SCRIPT_POLL, Behaviour, Buyer, Purchase, Told, Trail
from service.sale.plan import ACCEPTED, Answer
from service.sale.swarm_plan import Assignment, Call, Errand, Sent

REQUEST_TIMEOUT = 30.0  # seconds per request
POOL_CEILING = 16_384  # geventhttpclient's own cap; the worker's connections are crew.slots
ORDERS_PATH = "/api/v1/orders"
FALLBACK_POLL = 1.0
"""Seconds an honest buyer waits when an answer names no interval."""
SNIPE_EVERY = 10
"""A scripted buyer in the queue fires a purchase without an admission every this many polls."""
NOT_IN_QUEUE = "not_in_queue"
"""``GET .../queue/me`` of a buyer without a place (recorded as a ticket in this state)."""
TOO_SOON = "too_many_requests"
"""``GET .../queue/me`` sooner than the last answer said (a ticket in this state, ``poll_after_ms``
its ``Retry-After``)."""
CLOCK_SLACK = 1.0
"""Seconds past the opening after which ``sale_not_active`` means the sale is over, not yet to open."""
DONE = frozenset({"sold_out", "closed"})
"""Ticket states after which a buyer stops."""
GIVE_UP = frozenset({"sold_out", "limit_exceeded", "product_not_found", "sale_not_active"})
"""Purchase answers after which a buyer without the room stops (once the sale is open)."""


class _Body(msgspec.Struct):
    """The fields read from a 202 body, a channel's 200 body, a ticket or a problem body."""

    code: str | None = None
    result: str | None = None
    order_no: str | None = None
    request_id: str | None = None
    state: str = ""
    ticket: str | None = None
    position: int | None = None
    ahead: int | None = None
    units_left: int | None = None
    admission_token: str | None = None
    admission_expires_at: int | None = None
    poll_after_ms: int | None = None


_decode_body = msgspec.json.Decoder(_Body).decode


def _body(content: bytes | None) -> _Body:
    try:
        return _decode_body(content or b"{}")
    except msgspec.DecodeError:
        return _Body()


class Crew:
    """One worker's share of a run: its errands or buyers, connections, and what was sent."""

    def __init__(self) -> None:
        self.assigned = Event()
        self.all_done = Event()
        self.errands: deque[Errand] = deque()
        self.buyers: dict[str, deque[Buyer]] = {}
        self.tokens: dict[str, str] = {}
        self.opened = 0.0
        self.deadline = 0.0
        self.room = False
        self.product_id = 0
        self.slots = BoundedSemaphore(1)
        self.sent: list[Sent] = []
        self.trails: list[Trail] = []
        self.requests = 0
        self.users = 0
        self.finished = 0

    def take(self, assignment: Assignment, users: int) -> None:
        """Start on ``assignment`` with ``users`` users of this worker."""
        self.errands.extend(assignment.errands)
        self.buyers = {name: deque(buyers) for name, buyers in assignment.buyers.items()}
        self.tokens = assignment.tokens
        self.opened, self.deadline = assignment.opened, assignment.opened + assignment.deadline
        self.room, self.product_id = assignment.room, assignment.product_id
        self.slots = BoundedSemaphore(assignment.connections or POOL_CEILING)
        self.users = users
        self.assigned.set()
        if users == 0:
            self.all_done.set()

    def user_done(self) -> None:
        self.finished += 1
        if self.finished >= self.users:
            self.all_done.set()

    def drain(self) -> tuple[list[Sent], list[Trail]]:
        """What was recorded since the last call (the records leave the worker in chunks)."""
        sent, trails = self.sent, self.trails
        self.sent, self.trails = [], []
        return sent, trails


crew = Crew()


_Answered = tuple[int, bytes, Any, float, float]


def _request(
    user: FastHttpUser, method: str, url: str, name: str, headers: dict[str, str], body: bytes | None
) -> _Answered:
    """One request on ``user``'s session, after a connection slot; (status, content, headers,
    sent, finished). Status 0: no HTTP answer (content is ``timeout`` or ``connection_error``)."""
    with crew.slots:
        sent = time.time()
        crew.requests += 1
        # geventhttpclient sends bytes as they are; Locust's annotation names only str and dict
        data: Any = body
        with user.client.request(method, url, name=name, data=data, headers=headers, catch_response=True) as response:
            finished = time.time()
            status = response.status_code or 0
            if status == 0 or status >= 500:
                response.failure(response.error or f"HTTP {status}")
            else:
                response.success()
            if status == 0:
                error = response.error
                code = "timeout" if isinstance(error, TimeoutError | gevent.Timeout) else "connection_error"
                return 0, code.encode(), {}, sent, finished
            return status, response.content or b"", response.headers, sent, finished


def _answer(status: int, content: bytes | None, sent: float, finished: float) -> Answer:
    if status == 0:
        return Answer(0, (content or b"connection_error").decode(), None, None, finished - sent, finished)
    body = _body(content)
    code = ACCEPTED if status == 202 else body.result or body.code or f"http_{status}"
    return Answer(status, code, body.order_no, body.request_id, finished - sent, finished)


class _Base(FastHttpUser):
    abstract = True
    wait_time = constant(0)
    client_pool = HTTPClientPool(concurrency=POOL_CEILING, network_timeout=REQUEST_TIMEOUT, connection_timeout=10.0)


class _Lane(_Base):
    """A lane: errands one after the other until the worker's share is done."""

    abstract = True

    @task
    def work(self) -> None:
        crew.assigned.wait()
        try:
            while crew.errands:
                self._run(crew.errands.popleft())
        finally:
            crew.user_done()
        raise StopUser()

    def _send(self, call: Call, due: float) -> float:
        status, content, _, sent, finished = _request(self, call.method, call.url, call.name, call.headers, call.body)
        crew.sent.append(Sent(call.index, _answer(status, content, sent, finished), due, sent))
        return float(finished)

    def _run(self, errand: Errand) -> None:
        due = time.time()
        if errand.together:
            gevent.joinall([gevent.spawn(self._send, call, due) for call in errand.calls])
            return
        for call in errand.calls:
            due = self._send(call, due)


class PlanBuyer(_Lane):
    """Buyers of the load plan: buys (some without an Idempotency-Key), retries with the same
    key, duplicate pairs sent at once, over-limit attempts (:func:`service.sale.plan.build_plan`);
    the no-op wave sends the same errands to the no-op route."""


class Payer(_Lane):
    """A buyer paying for an order: ``POST /orders/{order_no}/pay`` at a channel, then (unless it
    abandons the payment) paying at the channel simulator."""


class _CrowdBuyer(_Base):
    """One buyer of the crowd (one user per buyer), on its own clock from its arrival."""

    abstract = True
    behaviour: ClassVar[Behaviour]

    @task
    def act(self) -> None:
        crew.assigned.wait()
        queue = crew.buyers.get(type(self).__name__)
        try:
            if queue:
                buyer = queue.popleft()
                trail = Trail(buyer)
                try:
                    _Visit(self, trail).run()
                finally:
                    crew.trails.append(trail)
        finally:
            crew.user_done()
        raise StopUser()


class HonestBuyer(_CrowdBuyer):
    behaviour = Behaviour.HONEST


class ImpatientBuyer(_CrowdBuyer):
    behaviour = Behaviour.IMPATIENT


class ScriptedBuyer(_CrowdBuyer):
    behaviour = Behaviour.SCRIPTED


class _Gone(Exception):
    """The buyer stops: it left, or the deadline passed."""


class _Visit:
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
        except _Gone:
            pass

    def _call(
        self, method: str, path: str, name: str, headers: dict[str, str], body: bytes | None, due: float
    ) -> _Answered:
        if time.time() > crew.deadline:
            self.trail.timed_out = True
            raise _Gone
        status, content, answer_headers, sent, finished = _request(self.user, method, path, name, headers, body)
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
        status, content, headers, _, finished = self._call(method, path, f"{method} queue", self.headers, None, due)
        if status == 0:
            self._error((content or b"").decode())
            return None
        body = _body(content)
        if status != 200:
            code = body.code or f"http_{status}"
            self._error(code)
            if code == NOT_IN_QUEUE:  # no place (an admission lapsed or was used): the buyer may join again
                return Told(finished, NOT_IN_QUEUE, None, None, None, None, None, None, None)
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
        purchase = Purchase(sent, admission, key, 1, _answer(status, content, sent, finished))
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
