"""The common start of a row in the modules beside tests/faults/test_faults.py."""

from __future__ import annotations

from tests.faults.harness import FaultSale


async def under_load(sale: FaultSale, fraction: float = 0.3) -> None:
    """Start the sale's processes, wait until the API is ready, start the buyers and wait until
    ``fraction`` of the stock was answered 202 (orders are in flight)."""
    await sale.start_all()
    assert await sale.ready(), f"the API did not become ready: {sale.supervisor.log_text('api')[-2000:]}"
    sale.start_load()
    await sale.mid_sale(fraction)
