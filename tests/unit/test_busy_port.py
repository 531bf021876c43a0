"""The busy-port probe of every server (service.api.serving.require_free_port) and its hint."""

from __future__ import annotations

import socket

import pytest
from click.testing import CliRunner

from service.api.serving import SHARE_PORT_OPTION, PortInUse, require_free_port
from service.cli.main import main


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


def _busy_port(listener: socket.socket) -> int:
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    return int(listener.getsockname()[1])


def test_channel_serve_on_a_busy_port_names_no_option_it_lacks() -> None:
    """``flashsale channel serve`` has no --share-port: its busy-port line must not offer one."""
    with socket.socket() as listener:
        port = _busy_port(listener)
        result = CliRunner().invoke(main, ["channel", "serve", "--port", str(port)])
    assert result.exit_code == 2, result.output
    assert f"--port {port}: address already in use on 127.0.0.1" in result.output
    assert "stop it or choose another --port)" in result.output
    assert "--share-port" not in result.output


def test_serve_names_its_share_port_option() -> None:
    with socket.socket() as listener:
        port = _busy_port(listener)
        with pytest.raises(PortInUse, match="or --share-port to share the port with it"):
            require_free_port("127.0.0.1", port, share_option=SHARE_PORT_OPTION)
