"""What the consumer does with an order it cannot write now, without any server: which failures are
transient (retry queue) and which are not, the retry queues' names and delays, and the stand-in
number of an order whose number was taken."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, ProgrammingError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from service.adapters.retry_routing import RetryRouter
from service.domain.order_numbers.conflicts import stand_in_order_no
from service.domain.order_numbers.format import is_valid_order_no
from service.failures import is_transient
from service.settings import AMQPSettings


def _mysql(kind: type[DBAPIError], errno: int) -> DBAPIError:
    return kind("INSERT ...", {}, Exception(errno, "from MySQL"))


@pytest.mark.parametrize(
    ("failure", "transient"),
    [
        (_mysql(OperationalError, 2003), True),  # cannot connect
        (_mysql(OperationalError, 2013), True),  # lost connection during the query
        (_mysql(OperationalError, 1213), True),  # deadlock, past the transaction's own retries
        (_mysql(OperationalError, 1205), True),  # lock wait timeout, likewise
        (_mysql(OperationalError, 1290), True),  # read-only while failing over
        (_mysql(OperationalError, 1040), True),  # too many connections
        (PoolTimeoutError(), True),  # no pooled connection in time
        (ConnectionResetError(), True),
        (TimeoutError(), True),
        (_mysql(IntegrityError, 1452), False),  # a foreign key: the order itself is wrong
        (_mysql(ProgrammingError, 1146), False),  # a table missing: not going away by waiting
        (ValueError("bug"), False),
    ],
)
def test_transient_failures(failure: BaseException, transient: bool) -> None:
    assert is_transient(failure) is transient


def test_retry_queues_follow_the_order_queue_and_the_delays() -> None:
    amqp = AMQPSettings(queue="run_1.orders", retry_delays=[5, 0.5, 5, 30])
    assert amqp.retry_queue(0.5) == "run_1.orders.retry.500ms"
    assert amqp.retry_queues() == [f"run_1.orders.retry.{ms}ms" for ms in (500, 5000, 30000)]
    router = RetryRouter(channel=None, settings=amqp)  # type: ignore[arg-type]  # no publish here
    assert [router.retry_delay(n) for n in range(6)] == [5, 0.5, 5, 30, 30, 30]


def test_retry_delays_are_checked() -> None:
    with pytest.raises(ValueError, match="retry_delays"):
        AMQPSettings(retry_delays=[])
    with pytest.raises(ValueError, match="retry_delays"):
        AMQPSettings(retry_delays=[1, 0])


def test_stand_in_order_number() -> None:
    first, second = "0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789abcdee"
    stand_in = stand_in_order_no(first)
    assert len(stand_in) == 26 and stand_in == stand_in.lower()
    assert stand_in == stand_in_order_no(first) != stand_in_order_no(second)
    assert not is_valid_order_no(stand_in)  # never a number the minter makes, nor one the API takes
