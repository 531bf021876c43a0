"""Revision 0008 backfills the per-user counts (``user_quota``) from the orders that hold units, so a
live sale keeps its limit across the upgrade; on a database of the test's own."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import make_url

from db.engine import make_engine
from db.migrate import downgrade, drop_database, upgrade


async def test_upgrade_counts_what_each_user_holds(settings):
    url = make_url(settings.db.url)
    own = url.set(database=f"{url.database}_quota").render_as_string(hide_password=False)
    try:
        await upgrade(own)
        assert await downgrade(own, "0007") == "0007"
        engine = make_engine(own, pool_size=1, max_overflow=0)
        try:
            async with engine.begin() as conn:
                for product_id in (1, 2):
                    await conn.execute(
                        text(
                            "INSERT INTO products (id, name, price, per_user_limit, sale_starts_at)"
                            " VALUES (:p, 'p', 100, 5, '2026-01-01')"
                        ),
                        {"p": product_id},
                    )
                orders = [  # (user, product, quantity, status)
                    ("ann", 1, 1, 0),  # pending_payment: holds
                    ("ann", 1, 2, 1),  # paid: holds
                    ("ann", 1, 3, 4),  # cancelled: gave its units back
                    ("ann", 2, 1, 6),  # refunded: the buyer did buy, keeps the quota
                    ("bob", 1, 2, 7),  # rejected: never held
                    ("bob", 1, 1, 3),  # completed: holds
                ]
                for n, (user, product_id, quantity, status) in enumerate(orders):
                    await conn.execute(
                        text(
                            "INSERT INTO orders (order_no, request_id, user_id, product_id, quantity, amount, status)"
                            " VALUES (:o, :r, :u, :p, :q, 100, :s)"
                        ),
                        {"o": f"o{n}", "r": f"r{n}", "u": user, "p": product_id, "q": quantity, "s": status},
                    )
            await upgrade(own)
            async with engine.connect() as conn:
                counted = {
                    (row.product_id, row.user_id): row.bought
                    for row in await conn.execute(text("SELECT product_id, user_id, bought FROM user_quota"))
                }
            assert counted == {(1, "ann"): 3, (2, "ann"): 1, (1, "bob"): 1}
        finally:
            await engine.dispose()
        assert await downgrade(own, "0007") == "0007"
    finally:
        await drop_database(own)
