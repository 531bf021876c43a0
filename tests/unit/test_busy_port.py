"""The busy-port probe of every server (service.api.serving.require_free_port)."""

from __future__ import annotations

import socket

import pytest

from service.api.serving import PortInUse, require_free_port


def test_a_port_someone_listens_on_with_reuseport_is_refused() -> None:
    with socket.socket() as listener:  # as granian binds: SO_REUSEPORT
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(PortInUse, match=f"--port {port}: address already in use on 127.0.0.1"):
            require_free_port("127.0.0.1", port)
        with pytest.raises(PortInUse):
            require_free_port("0.0.0.0", port)  # every address includes the busy one
    require_free_port("127.0.0.1", port)  # closed: free again
    require_free_port("127.0.0.1", 0)  # any free port: nothing to check
