"""One Locust worker's share of a ``flashsale sale`` wave (:data:`crew`: its errands or buyers,
its connections, what it sent) and the one way its users send a request and record the answer
(:func:`send_request`, :func:`answer_of`). Runs inside Locust's gevent processes
(:mod:`toolkit.sale.locustfile`). Times are epoch seconds, so trails from several hosts merge on
one clock.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import gevent
import msgspec
from gevent.event import Event
from gevent.lock import BoundedSemaphore
from locust import FastHttpUser

from toolkit.sale.crowd import Buyer, Trail
from toolkit.sale.plan import ACCEPTED, Answer
from toolkit.sale.swarm_plan import Assignment, Errand, Sent

REQUEST_TIMEOUT = 30.0  # seconds per request
POOL_CEILING = 16_384  # geventhttpclient's own cap; the worker's connections are crew.slots


class Body(msgspec.Struct):
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
    holds_unit: bool = False


_decode_body = msgspec.json.Decoder(Body).decode


def body_of(content: bytes | None) -> Body:
    try:
        return _decode_body(content or b"{}")
    except msgspec.DecodeError:
        return Body()


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


Answered = tuple[int, bytes, Any, float, float]


def send_request(
    user: FastHttpUser, method: str, url: str, name: str, headers: dict[str, str], body: bytes | None
) -> Answered:
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


def answer_of(status: int, content: bytes | None, sent: float, finished: float) -> Answer:
    if status == 0:
        return Answer(0, (content or b"connection_error").decode(), None, None, finished - sent, finished)
    body = body_of(content)
    code = ACCEPTED if status == 202 else body.result or body.code or f"http_{status}"
    return Answer(status, code, body.order_no, body.request_id, finished - sent, finished)
