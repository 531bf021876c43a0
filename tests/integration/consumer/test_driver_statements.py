"""The consumer's statements run on the driver (:func:`db.engine.on_driver`) keep the engine's
semantics: matched rows as the row count, and the failure vocabulary of
:mod:`service.failures`. On the real MariaDB."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from db.engine import DriverStatement, on_driver
from db.queries import inventory, quota
from db.queries.json_rows import json_rows
from service.failures import DuplicateKey

_TAKE = DriverStatement(inventory.TAKE)
_ADD_MANY = DriverStatement(quota.ADD_MANY)
_OVER_LIMIT = DriverStatement(quota.OVER_LIMIT)


async def test_the_row_count_is_the_rows_matched_not_changed(engine, put_product, product_id):
    await put_product(product_id, stock=3, limit=5)
    async with engine.begin() as conn:
        assert await on_driver(conn, _TAKE, {"product_id": product_id, "quantity": 0}) == (1, [])  # nothing changed
        assert (await on_driver(conn, _TAKE, {"product_id": product_id, "quantity": 4}))[0] == 0  # stock 3 < 4
        assert (await on_driver(conn, _TAKE, {"product_id": product_id, "quantity": 3}))[0] == 1


async def test_rows_come_back_as_tuples(engine, put_product, product_id):
    await put_product(product_id, stock=3, limit=2)
    rows = json_rows([["a", 3], ["b", 1]])
    async with engine.begin() as conn:
        await on_driver(conn, _ADD_MANY, {"p": product_id, "rows": rows})
        count, over = await on_driver(conn, _OVER_LIMIT, {"p": product_id, "rows": rows})
        assert (count, list(over)) == (1, [("a", 3, 2)])
        await conn.rollback()


async def test_a_taken_key_is_the_vocabularys_duplicate_key(engine, put_product, product_id):
    await put_product(product_id, stock=3, limit=5)
    duplicate = DriverStatement(text("INSERT INTO inventory (product_id, stock, sold, version) VALUES (:p, 1, 0, 0)"))
    async with engine.begin() as conn:
        with pytest.raises(DuplicateKey) as raised:
            await on_driver(conn, duplicate, {"p": product_id})
        assert raised.value.key == "PRIMARY"
        # The transaction goes on after the failed statement, as through SQLAlchemy.
        assert (await on_driver(conn, _TAKE, {"product_id": product_id, "quantity": 1}))[0] == 1
