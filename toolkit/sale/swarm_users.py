"""The sale's crowd as Locust users (``FastHttpUser``, geventhttpclient), run by the shipped
locustfile (:mod:`toolkit.sale.locustfile`) in worker processes, here or on other hosts:

- lanes, closed-loop users that take the next errand of the plan as soon as they are free:
  :class:`PlanBuyer` (buys, retries with the same key, duplicate pairs sent at once, over-limit
  attempts; the no-op wave too) and :class:`Payer` (starts a payment, then pays at the channel);
- buyers of a crowd, each on its own clock (:mod:`toolkit.sale.crowd`): :class:`HonestBuyer`
  (joins the waiting room, polls as told, buys with the admission), :class:`ImpatientBuyer` (the
  same, but leaves after its patience), :class:`ScriptedBuyer` (joins many times at once, polls
  hard, fires purchases without an admission). Without the room they go straight at
  ``POST /orders``.

The worker's share of the plan is :data:`~toolkit.sale.swarm_crew.crew`, filled by the master's
assignment; every request goes through :func:`~toolkit.sale.swarm_crew.send_request` and is
recorded with when it was due, when it got a connection and its answer.
"""

from __future__ import annotations

import time
from typing import ClassVar

import gevent
from geventhttpclient.client import HTTPClientPool
from locust import FastHttpUser, constant, task
from locust.exception import StopUser

from toolkit.sale.crowd import Behaviour, Trail
from toolkit.sale.swarm_crew import POOL_CEILING, REQUEST_TIMEOUT, answer_of, crew, send_request
from toolkit.sale.swarm_plan import Call, Errand, Sent
from toolkit.sale.swarm_visit import Visit


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
        status, content, _, sent, finished = send_request(
            self, call.method, call.url, call.name, call.headers, call.body
        )
        crew.sent.append(Sent(call.index, answer_of(status, content, sent, finished), due, sent))
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
    key, duplicate pairs sent at once, over-limit attempts (:func:`toolkit.sale.plan.build_plan`);
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
                    Visit(self, trail).run()
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
