"""What becomes of a delivery the consumer took: one :class:`Settlement` per order it carries,
folded into the copies to publish before the delivery is acked (:func:`copies_of`).

A delivery in the single-order format has one order and, when it is not written, one copy: its
own body to a retry queue or the dead-letter queue, as before groups. A group
(docs/ARCHITECTURE.md, "Order messages and groups") is settled order by order:

- an order dead-lettered is dead-lettered alone, as a single-order message (``message_id`` its
  request id, so ``flashsale dlq`` shows, redrives and purges it per order) with its reason; one
  that does not decode (:class:`Malformed`) as its own JSON;
- the orders retried go to the retry queue together: the group's own body when every order of it
  is retried, else a group (or a single order) of just those; the others are written or dead;
- the delivery is acked once every copy is confirmed (a redelivered group's written orders are
  duplicates, so a copy that cannot be published sends the whole group back).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from service.adapters.subscription import Delivery
from service.domain.fulfilment.incoming import InvalidOrder, Malformed
from service.model.order_message import GROUP_FORMAT, OrderGroup, OrderMessage, encode_group, encode_order


class Action(Enum):
    ACK = "ack"
    RETRY = "retry"
    DEAD = "dead"


@dataclass(frozen=True, slots=True)
class Settlement:
    """What becomes of one order (or of a delivery that carries none): ``action``, and for
    ``RETRY``/``DEAD`` why (``reason``: the dead-letter reason; ``detail``: the error)."""

    action: Action
    reason: str = ""
    detail: str = ""


ACK = Settlement(Action.ACK)


@dataclass(frozen=True, slots=True)
class Copy:
    """A copy of a delivery to publish before it is acked: to a retry queue or the dead-letter
    queue (``settlement``), with the delivery's own body and ids, or with ``body``,
    ``message_id`` and ``correlation_id`` of its own (part of a group)."""

    settlement: Settlement
    body: bytes | None = None
    message_id: str | None = None
    correlation_id: str | None = None


@dataclass(frozen=True, slots=True)
class Carried:
    """One order of a delivery as it was settled: the order (None when the body carries no
    order at all), the HTTP request it came with, and its settlement."""

    order: OrderMessage | Malformed | None
    http_request_id: str | None
    settlement: Settlement


@dataclass(slots=True)
class Waiting:
    """One order of a decoded delivery waiting for (or in) a batch: the HTTP request it came
    with, the group it came in (None: a single-order body), and why it is out of its domain
    (then it is dead-lettered, not written)."""

    message: Delivery
    order: OrderMessage | Malformed
    http_request_id: str | None
    group: OrderGroup | None
    invalid: InvalidOrder | None = None

    @property
    def good(self) -> OrderMessage:
        """The order, of one that decoded (every order that is written did)."""
        assert isinstance(self.order, OrderMessage), "a malformed order is never written"
        return self.order


Settled = tuple[OrderGroup | None, list[Carried]]
"""One delivery's orders as settled: the group its body is (None: a single order), each order."""


def by_delivery(batch: list[Waiting], settlements: list[Settlement]) -> dict[Delivery, Settled]:
    """The settlements of ``batch``'s orders (one each, in order), delivery by delivery."""
    settled: dict[Delivery, Settled] = {}
    for waiting, settlement in zip(batch, settlements, strict=True):
        carried = Carried(waiting.order, waiting.http_request_id, settlement)
        settled.setdefault(waiting.message, (waiting.group, []))[1].append(carried)
    return settled


def copies_of(group: OrderGroup | None, carried: Sequence[Carried]) -> list[Copy]:
    """The copies to publish for one delivery, every order of which was settled (``carried``,
    in body order); ``group`` the envelope when its body is a group."""
    redirected = [item for item in carried if item.settlement.action is not Action.ACK]
    if group is None or not redirected:
        return [Copy(item.settlement) for item in redirected]
    copies = [_alone(item) for item in redirected if item.settlement.action is Action.DEAD]
    retried = [item for item in redirected if item.settlement.action is Action.RETRY]
    if len(retried) == len(carried):
        copies.append(Copy(retried[0].settlement))
    elif len(retried) == 1:
        copies.append(_alone(retried[0]))
    elif retried:
        part = OrderGroup(
            GROUP_FORMAT,
            group.id,
            [item.order for item in retried if isinstance(item.order, OrderMessage)],
            [item.http_request_id for item in retried] if group.http_request_ids is not None else None,
        )
        copies.append(Copy(retried[0].settlement, encode_group(part), group.id))
    return copies


def _alone(item: Carried) -> Copy:
    """A copy of one order of a group, as a single-order message under its request id (a
    malformed one: its own JSON, under the id it was given)."""
    order = item.order
    assert order is not None  # every order of a group is carried
    body = order.body if isinstance(order, Malformed) else encode_order(order)
    return Copy(item.settlement, body, order.request_id, item.http_request_id)


def fallback(carried: Sequence[Carried]) -> Settlement:
    """The settlement of a whole delivery whose copies could not all be published: ``DEAD`` when
    nothing of it is retried (without a router it is rejected to the queue's dead-letter
    exchange), else its first ``RETRY`` (requeued)."""
    retried = [item.settlement for item in carried if item.settlement.action is Action.RETRY]
    if retried:
        return retried[0]
    return next(item.settlement for item in carried if item.settlement.action is Action.DEAD)
