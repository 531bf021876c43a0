"""The engine's connect: asyncmy's bare RuntimeError for a socket the server closed during the
handshake (MariaDB past max_connections) reaches callers as a typed database outage."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from db.engine import ER_CONNECTION_LOST, make_engine
from service.failures import StoreUnavailable, is_unavailable


async def test_a_connection_closed_during_the_handshake_is_an_outage_not_an_unknown_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = make_engine("mysql+asyncmy://root@127.0.0.1:1/none")  # never dialled: connect is replaced
    dialect = engine.sync_engine.dialect

    def closed_by_server(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("Transport does not expose socket instance")  # what asyncmy raises

    monkeypatch.setattr(dialect, "connect", closed_by_server)
    try:
        with pytest.raises(StoreUnavailable) as caught:  # the engine's translation of OperationalError
            async with engine.connect():
                pass
    finally:
        await engine.dispose()
    assert caught.value.store == "mysql" and caught.value.__cause__.args[0] == ER_CONNECTION_LOST
    assert is_unavailable(caught.value)  # the API answers 503 unavailable for it


def test_too_many_connections_is_an_outage() -> None:
    refused = OperationalError("connect", {}, Exception(1040, "Too many connections"))
    assert is_unavailable(refused)  # 503 unavailable on the API, one line from the CLI
