"""A live payment channel simulator and an API process on real ports for the payment tests.

Session-scoped: ``flashsale channel serve`` (mockpay and altpay) and ``flashsale serve`` (one
worker) reading the run's isolated settings, the API's channel URLs pointing at the simulator
(and ``deadpay`` at a port nobody listens on), the simulator's notifications at the API.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from service.settings import Settings
from tests.support import flashsale_process
from toolkit.sale.isolation import free_port


@dataclass
class Live:
    """The live processes: ``api`` and ``sim`` clients on their base URLs, their ``settings``,
    the files the API process and the simulator log to."""

    settings: Settings
    api: httpx.AsyncClient
    sim: httpx.AsyncClient
    api_log: Path
    sim_log: Path

    async def faults(self, **knobs: float) -> None:
        """Set the simulator's fault knobs (what is left out is 0)."""
        assert (await self.sim.put("/faults", json=knobs)).status_code == 200

    async def buyer_pays(self, channel: str, order_no: str) -> httpx.Response:
        return await self.sim.post(f"/{channel}/payments/{order_no}/pay")


@pytest.fixture(scope="session")
async def live(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Live]:
    api_port, sim_port = free_port(), free_port()
    logs = tmp_path_factory.mktemp("live")
    api_log, sim_log = logs / "api.log", logs / "sim.log"
    sim_url, api_url = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{api_port}"
    urls = {name: f"{sim_url}/{name}" for name in settings.payment.channel_secrets}
    mine = settings.model_copy(
        update={
            "db": settings.db.model_copy(update={"pool_size": 3, "max_overflow": 2}),
            "payment": settings.payment.model_copy(
                update={
                    "channel_urls": {**urls, "deadpay": f"http://127.0.0.1:{free_port()}/deadpay"},
                    "notify_url": f"{api_url}/api/v1/payments/notify",
                    "channel_timeout": 2.0,
                }
            ),
        }
    )
    async with (
        flashsale_process(mine, f"{sim_url}/health", "channel", "serve", "--port", str(sim_port), log=sim_log),
        flashsale_process(
            mine, f"{api_url}/api/v1/health/ready", "serve", "--port", str(api_port), "--workers", "1", log=api_log
        ),
        httpx.AsyncClient(base_url=api_url, timeout=30) as api,
        httpx.AsyncClient(base_url=sim_url, timeout=30) as sim,
    ):
        yield Live(mine, api, sim, api_log, sim_log)


@pytest.fixture
async def clean_faults(live: Live) -> AsyncIterator[Live]:
    """``live`` with no faults before and after the test."""
    await live.faults()
    yield live
    await live.faults()


@pytest.fixture
def one_order(client, token, put_product, product_id, engine):
    """``await one_order(user, stock=2) -> order_no``: product ``product_id`` on sale (limit 1)
    and one order of ``user`` written to MySQL (needs the ``consumer`` fixture)."""
    from tests.support import buy_and_settle

    async def make(user: str, stock: int = 2) -> str:
        await put_product(product_id, stock=stock, limit=1)
        [order_no] = await buy_and_settle(client, token, engine, product_id, [user])
        return order_no

    return make
