"""``flashsale sale`` with part of its crowd on another host: two local Locust workers and one
``flashsale sale-worker`` in a network namespace this test creates, standing in for a second
machine (it reaches the sale only over a veth pair). Every invariant holds and the merged trail
has every request exactly once, the other host's among them."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolkit.sale.isolation import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and ip (netns, veth)"),
]

FLASHSALE = str(Path(sys.executable).with_name("flashsale"))


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextlib.contextmanager
def _other_host() -> Iterator[tuple[str, str, str]]:
    """A network namespace joined to this host by a veth pair: (namespace, this host's address,
    the namespace's address); removed afterwards."""
    tag = secrets.token_hex(3)
    namespace, here, there = f"fs-{tag}", f"vfh{tag}", f"vfn{tag}"
    octet = 1 + int(tag, 16) % 250
    host_ip, ns_ip = f"10.231.{octet}.1", f"10.231.{octet}.2"
    _ip("netns", "add", namespace)
    try:
        _ip("link", "add", here, "type", "veth", "peer", "name", there)
        _ip("link", "set", there, "netns", namespace)
        _ip("addr", "add", f"{host_ip}/30", "dev", here)
        _ip("link", "set", here, "up")
        _ip("-n", namespace, "addr", "add", f"{ns_ip}/30", "dev", there)
        _ip("-n", namespace, "link", "set", there, "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        yield namespace, host_ip, ns_ip
    finally:
        subprocess.run(["ip", "link", "del", here], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", namespace], check=False, capture_output=True)


def test_a_worker_on_another_host_joins_the_crowd_and_its_trail_merges_exactly_once(tmp_path):
    with _other_host() as (namespace, host_ip, ns_ip):
        port = free_port(host_ip)
        log = (tmp_path / "sale-worker.log").open("wb")
        worker = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                namespace,
                FLASHSALE,
                "sale-worker",
                "--master",
                f"{host_ip}:{port}",
                "--processes",
                "1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            argv = [FLASHSALE, "sale", "--json", "--stock", "30", "--requests", "300", "--users", "120"]
            argv += ["--concurrency", "24", "--noop-requests", "150", "--consumers", "1"]
            argv += ["--crowd-workers", "2", "--remote-workers", "1", "--bind", host_ip, "--master-port", str(port)]
            result = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=400)
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=30)
            log.close()
    assert result.stdout, result.stderr[-3000:]
    report = json.loads(result.stdout)
    failed = {name: check for name, check in report["invariants"].items() if not check["ok"]}
    assert report["ok"] is True, failed
    trail = report["invariants"]["trail_complete"]
    assert (trail["duplicates"], trail["missing"], trail["waves"]) == (0, 0, 2)
    assert trail["requests"] == 150 + 300
    for name, requests in (("no-op", 150), ("purchase", 300)):
        wave = report["crowd"]["waves"][name]
        assert wave["workers"] == 3 and wave["requests"] == requests
        assert sum(wave["hosts"].values()) == requests
        assert any(f"({ns_ip})" in host and sent > 0 for host, sent in wave["hosts"].items()), wave["hosts"]
        assert any(f"({host_ip})" in host and sent > 0 for host, sent in wave["hosts"].items()), wave["hosts"]
