"""The failure vocabulary's one table of driver errors and its classifier, without any server
(docs/ARCHITECTURE.md, "Failure vocabulary")."""

from __future__ import annotations

import pytest
from aiormq.exceptions import AMQPConnectionError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from service.failures import (
    DuplicateKey,
    PublishFailed,
    StoreError,
    StoreRefused,
    StoreUnavailable,
    TransientConflict,
    is_transient,
    is_unavailable,
    outage_of,
    translate,
)


def _mysql(kind: type[OperationalError | IntegrityError | ProgrammingError], errno: int, message: str = "m"):
    return kind("SQL", {}, Exception(errno, message))


def test_mysql_errors_become_the_vocabulary() -> None:
    assert isinstance(translate(_mysql(OperationalError, 1213)), TransientConflict)
    assert isinstance(translate(_mysql(OperationalError, 1205)), TransientConflict)
    duplicate = translate(_mysql(IntegrityError, 1062, "Duplicate entry 'x' for key 'orders.uq_order_no'"))
    assert isinstance(duplicate, DuplicateKey) and duplicate.key == "uq_order_no"
    for errno in (1044, 1045, 1049, 1698):  # 1698: an unknown user or root on unix_socket (MariaDB)
        refused = translate(_mysql(OperationalError, errno))
        assert isinstance(refused, StoreRefused) and refused.store == "mysql"
    gone = translate(_mysql(OperationalError, 2006))
    assert type(gone) is StoreUnavailable and gone.store == "mysql"
    for statement_error in (_mysql(IntegrityError, 1452), _mysql(ProgrammingError, 1146)):  # a foreign key, a bug
        failure = translate(statement_error)
        assert isinstance(failure, StoreError) and failure.store == "mysql" and not failure.transient
        assert not is_unavailable(statement_error) and outage_of(statement_error) is None  # 500, no waiting
        assert not is_transient(statement_error)  # the consumer dead-letters after its retries
    unknown_column = _mysql(OperationalError, 1054)  # a schema the code does not expect
    assert isinstance(translate(unknown_column), StoreError)
    assert not is_unavailable(unknown_column) and outage_of(unknown_column) is None
    assert is_transient(unknown_column)  # the consumer retries (a migration under way)


def test_redis_and_rabbitmq_errors_become_the_vocabulary() -> None:
    redis_down = translate(RedisConnectionError("Error 111"))
    assert isinstance(redis_down, StoreUnavailable) and redis_down.store == "redis"
    reply = ResponseError("OOM command not allowed")  # an answer, not an outage
    assert isinstance(translate(reply), StoreError) and translate(reply).store == "redis"  # type: ignore[union-attr]
    assert not is_unavailable(reply) and outage_of(reply) is None and not is_transient(reply)
    broker_down = translate(AMQPConnectionError("refused"))
    assert isinstance(broker_down, StoreUnavailable) and broker_down.store == "rabbitmq"


@pytest.mark.parametrize(
    ("failure", "store"),
    [
        (StoreUnavailable("redis", "Error 111"), "Redis"),  # what the Redis adapter raises
        (StoreUnavailable("mysql"), "MySQL"),
    ],
)
def test_the_classifier_reads_the_vocabulary(failure: StoreUnavailable, store: str) -> None:
    assert outage_of(failure) == store
    assert is_unavailable(failure) and is_transient(failure)


def test_refusals_conflicts_and_duplicates() -> None:
    refused = StoreRefused("mysql", "access denied")
    assert outage_of(refused) is None and is_unavailable(refused)  # 503, but no waiting it out
    assert outage_of(TransientConflict()) is None and is_transient(TransientConflict())
    assert outage_of(DuplicateKey("uq")) is None and not is_transient(DuplicateKey("uq"))
    assert str(PublishFailed("broker connection is down")) == "broker connection is down"
    nack = PublishFailed("nack")  # an outage for the --watch loops; outside the purchase path a 500
    assert outage_of(nack) == "RabbitMQ" and not is_unavailable(nack) and not is_transient(nack)
