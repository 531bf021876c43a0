"""A private three-node RabbitMQ cluster on free ports (the fault suite's broker-cluster rows,
docs/RELIABILITY.md): three :class:`tests.servers.PrivateRabbitMQ` nodes ``fs-<hex>-a@localhost``
… ``-c@localhost`` that share one ``epmd`` (on a port of their own) and one Erlang cookie, the
second and third joined to the first with ``rabbitmqctl join_cluster``. Each node can be killed,
paused and started again (it rejoins by itself: it is still a member). Nothing here touches the
system's broker: other node names, ports and ``epmd``.

``python -m tests.rabbitmq_cluster`` starts one, prints its nodes' URLs (comma-separated, for
``flashsale sale --rabbitmq-cluster``) and removes it on Ctrl-C (docs/OPERATIONS.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
from pathlib import Path

from tests.servers import PrivateRabbitMQ, _program, scratch
from toolkit.sale.isolation import free_port

NODES = ("a", "b", "c")


class ClusterNode(PrivateRabbitMQ):
    """A node of :class:`PrivateRabbitMQCluster`: its own ports, database and logs; the
    cluster's ``epmd`` port, cookie and node-name stem."""

    def __init__(self, root: Path, node: str, epmd_port: int, cookie: str) -> None:
        super().__init__(root)
        self.node = node
        self.epmd_port = epmd_port
        cookie_file = root / "home" / ".erlang.cookie"
        cookie_file.write_text(cookie)
        cookie_file.chmod(0o400)

    async def start(self, timeout: float = 90.0) -> float:
        # the cluster runs the one epmd (PrivateRabbitMQ.start would start one per node)
        return await super(PrivateRabbitMQ, self).start(timeout)

    async def remove(self) -> None:
        await super(PrivateRabbitMQ, self).remove()


class PrivateRabbitMQCluster:
    """Three clustered nodes (:data:`NODES`), with what the fault suite's
    :class:`tests.faults.harness.Servers` asks of a server (``url``, ``process``, ``running``,
    ``start``, ``resume``), over the whole cluster."""

    name = "rabbitmq-cluster"

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or scratch("rabbitmq-cluster")
        self.epmd_port = free_port()
        stem = f"fs-{secrets.token_hex(3)}"
        cookie = secrets.token_hex(16).upper()
        self.nodes = {
            letter: ClusterNode(self.root / letter, f"{stem}-{letter}@localhost", self.epmd_port, cookie)
            for letter in NODES
        }
        self._epmd: subprocess.Popen[bytes] | None = None

    # -- what a Servers member offers --------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.nodes[NODES[0]].url

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes.values()]

    @property
    def process(self) -> object:
        return self._epmd

    @property
    def running(self) -> bool:
        return all(node.running for node in self.nodes.values())

    def resume(self) -> None:
        for node in self.nodes.values():
            if node.process is not None:
                node.resume()

    async def start(self) -> None:
        """Start the cluster (the first time: the nodes, then the joins), or the nodes that are down."""
        first = self._epmd is None
        if first:
            (self.root / "epmd.out").parent.mkdir(parents=True, exist_ok=True)
            with (self.root / "epmd.out").open("ab") as out:
                self._epmd = subprocess.Popen(
                    [_program("epmd", "erlang-base"), "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        down = [node for node in self.nodes.values() if not node.running]
        await asyncio.gather(*(node.start() for node in down))
        if first:
            seed = self.nodes[NODES[0]]
            for letter in NODES[1:]:
                await self._join(self.nodes[letter], seed)
            await self._ctl_ok(seed, "await_online_nodes", str(len(NODES)), "--timeout", "60")

    async def _join(self, node: ClusterNode, seed: ClusterNode) -> None:
        await self._ctl_ok(node, "stop_app")
        await self._ctl_ok(node, "join_cluster", seed.node)
        await self._ctl_ok(node, "start_app")

    @staticmethod
    async def _ctl_ok(node: ClusterNode, *args: str) -> str:
        done = await node.ctl(*args)
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl -n {node.node} {' '.join(args)}: {done.stdout}{done.stderr}")
        return done.stdout

    async def remove(self) -> None:
        await asyncio.gather(*(node.remove() for node in self.nodes.values()), return_exceptions=True)
        if self._epmd is not None and self._epmd.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._epmd.pid, signal.SIGKILL)
            await asyncio.to_thread(self._epmd.wait)
        shutil.rmtree(self.root, ignore_errors=True)

    # -- the cluster -------------------------------------------------------------------------------

    def live(self) -> ClusterNode:
        """A running node (to ask the cluster through)."""
        return next(node for node in self.nodes.values() if node.running)

    def node_named(self, name: str) -> ClusterNode:
        return next(node for node in self.nodes.values() if node.node == name)

    async def consumers(self, queue: str) -> int:
        """Consumers of ``queue`` now."""
        out = await self._ctl_ok(self.live(), "list_queues", "--quiet", "--formatter", "json", "name", "consumers")
        return next(int(entry["consumers"]) for entry in json.loads(out) if entry["name"] == queue)

    async def quorum(self, queue: str) -> tuple[str, list[str]]:
        """The leader and the members of quorum queue ``queue`` (Erlang node names)."""
        out = await self._ctl_ok(
            self.live(), "list_queues", "--quiet", "--formatter", "json", "name", "type", "leader", "members"
        )
        for entry in json.loads(out):
            if entry["name"] == queue:
                assert entry["type"] == "quorum", entry
                return entry["leader"], sorted(entry["members"])
        raise AssertionError(f"no queue {queue}")


async def _serve() -> None:
    """Start a cluster, print its nodes' URLs (comma-separated, for ``flashsale sale
    --rabbitmq-cluster``), keep it until interrupted, then remove it."""
    cluster = PrivateRabbitMQCluster()
    try:
        await cluster.start()
        print(",".join(cluster.urls), flush=True)
        await asyncio.Event().wait()
    finally:
        await cluster.remove()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve())
