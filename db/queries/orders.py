"""Statements on ``orders`` and ``order_status_log`` (the order aggregate)."""

from __future__ import annotations

from sqlalchemy import TextClause, bindparam, text

from db.models import OrderStatus
from db.queries.json_rows import ROWS

_VIEW_COLUMNS = "id, order_no, request_id, user_id, product_id, quantity, amount, status, reason, created_at"


INSERT_MANY = text(
    "INSERT INTO orders (order_no, request_id, user_id, product_id, quantity, amount, status)"
    " SELECT j.order_no, j.request_id, j.user_id, p.id, j.quantity, j.amount, :status"
    f" FROM JSON_TABLE({ROWS}, '$[*]' COLUMNS (seq FOR ORDINALITY, order_no VARCHAR(26) PATH '$[0]',"
    " request_id VARCHAR(32) PATH '$[1]', user_id VARCHAR(64) PATH '$[2]', product_id BIGINT PATH '$[3]',"
    " quantity INT PATH '$[4]', amount BIGINT PATH '$[5]')) j"
    " JOIN products p ON p.id = j.product_id ORDER BY j.seq"
)
"""Many orders in one statement, all ``:status``: ``:rows`` is a JSON array of
``[order_no, request_id, user_id, product_id, quantity, amount]`` (amount in minor units;
:func:`db.queries.json_rows.json_rows`), rows
written in array order. A row naming an unknown product inserts nothing
(rowcount counts the rows written); under ``UNIQUE(request_id)`` and ``UNIQUE(order_no)`` one
taken key fails the whole statement with 1062 (MySQL 8 / MariaDB 10.6+: ``JSON_TABLE``)."""

TAKEN = text(
    "SELECT order_no, request_id, created_at > NOW() - INTERVAL :s SECOND AS recent FROM orders"
    " WHERE order_no IN :o OR request_id IN :r LOCK IN SHARE MODE"
).bindparams(bindparam("o", expanding=True), bindparam("r", expanding=True))
"""Which of order numbers ``:o`` and request ids ``:r`` have a row, and whether that row is less
than ``:s`` seconds old: a locking read, so it sees the latest committed rows (the ones a 1062
collided with) even inside a transaction whose snapshot is older."""

REPLAYABLE = text(
    "SELECT request_id, order_no, user_id, quantity, TIMESTAMPDIFF(SECOND, created_at, NOW()) AS age FROM orders"
    " WHERE product_id = :p AND created_at > NOW() - INTERVAL :s SECOND"
)
"""The orders of product ``:p`` written less than ``:s`` seconds ago (the replay window), with
their buyer and age in seconds: the replay records realignment gives back after Redis lost them
(each into its buyer's stock bucket)."""

PRESENT_REQUEST_IDS = text("SELECT request_id FROM orders WHERE request_id IN :r").bindparams(
    bindparam("r", expanding=True)
)
"""Which of request ids ``:r`` have a row."""

LOG_MANY = text(
    "INSERT INTO order_status_log (order_id, from_status, to_status, reason, actor)"
    " SELECT STRAIGHT_JOIN o.id, :from_, :to, :reason, :actor"
    f" FROM JSON_TABLE({ROWS}, '$[*]' COLUMNS (request_id VARCHAR(32) COLLATE utf8mb4_bin PATH '$[0]')) j"
    " JOIN orders o ON o.request_id = j.request_id ORDER BY o.id"
)
"""One history entry (``:from_`` -> ``:to``, ``:reason``, by ``:actor``; ``:from_`` NULL when the
order is created) for each order whose request id is in ``:rows`` (a JSON array of
``[request_id]``, :func:`db.queries.json_rows.json_rows`), written in the change's transaction.
Joined from the rows as sent, one unique-key look-up each (``STRAIGHT_JOIN``: the rows first;
the binary collation of the tables, or the key is not used): no ``IN`` list for the server to
plan nor for the client to render and escape (docs/BENCHMARKS.md, "The consumer drain")."""

REJECT_MANY = text(
    "UPDATE orders SET status = :to, reason = :reason WHERE request_id IN :r AND status = :from_"
).bindparams(bindparam("r", expanding=True))
"""The conditional status change of many orders by request id (rowcount: the ones still in
``:from_``); :data:`LOG_MANY` writes their history."""


LOG_TRANSITION = text(
    "INSERT INTO order_status_log (order_id, from_status, to_status, reason, actor)"
    " SELECT id, :from_, :to, :reason, :actor FROM orders WHERE order_no = :o"
)
"""A status change of order ``:o`` by ``:actor``, written in the change's transaction."""

TRANSITION = text("UPDATE orders SET status = :to, reason = :reason WHERE order_no = :o AND status = :from_")
"""The conditional status change: matches one row only while the order is in ``:from_``."""

STATUS = text("SELECT status FROM orders WHERE order_no = :o")
BY_REQUEST_ID = text("SELECT order_no, product_id, quantity, status FROM orders WHERE request_id = :r")
"""The order written under request id ``:r`` (a replay of a ``database``-mode purchase)."""
AMOUNT = text("SELECT amount FROM orders WHERE order_no = :o")

VIEW_BY_ORDER_NO = text(f"SELECT {_VIEW_COLUMNS} FROM orders WHERE order_no = :o")
HISTORY = text(
    "SELECT from_status, to_status, reason, actor, created_at FROM order_status_log WHERE order_id = :id ORDER BY id"
)


def lifecycle_row(*, for_update: bool) -> TextClause:
    """The columns the lifecycle needs of order ``:o``; row-locked with ``for_update``."""
    return _LIFECYCLE_LOCKED if for_update else _LIFECYCLE


_LIFECYCLE = text("SELECT id, order_no, user_id, product_id, quantity, amount, status FROM orders WHERE order_no = :o")
_LIFECYCLE_LOCKED = text(_LIFECYCLE.text + " FOR UPDATE")


def page_of_user(*, after_cursor: bool) -> TextClause:
    """A keyset page of user ``:u``'s orders, newest first, ``:n`` rows over the
    ``(user_id, created_at)`` index; with ``after_cursor`` only rows before (``:c``, ``:i``)."""
    return _PAGE_AFTER if after_cursor else _PAGE


_PAGE = text(f"SELECT {_VIEW_COLUMNS} FROM orders WHERE user_id = :u ORDER BY created_at DESC, id DESC LIMIT :n")
_PAGE_AFTER = text(
    f"SELECT {_VIEW_COLUMNS} FROM orders WHERE user_id = :u AND (created_at < :c OR (created_at = :c AND id < :i))"
    " ORDER BY created_at DESC, id DESC LIMIT :n"
)


def due_unpaid(*, one_product: bool) -> TextClause:
    """(id, order_no) of orders still ``:pending`` ``:window`` seconds after creation with an id
    above ``:after``, by id, at most ``:batch`` (a sweep pages on the id, so orders it leaves
    pending are not read again in the same pass); with ``one_product`` only product
    ``:product``'s (``(status, created_at)`` index)."""
    return _DUE_OF_PRODUCT if one_product else _DUE


_DUE = text(
    "SELECT id, order_no FROM orders WHERE status = :pending AND id > :after"
    " AND created_at < NOW() - INTERVAL :window SECOND ORDER BY id LIMIT :batch"
)
_DUE_OF_PRODUCT = text(
    "SELECT id, order_no FROM orders WHERE status = :pending AND product_id = :product AND id > :after"
    " AND created_at < NOW() - INTERVAL :window SECOND ORDER BY id LIMIT :batch"
)

PRESENT_ORDER_NOS = text("SELECT order_no FROM orders WHERE order_no IN :order_nos").bindparams(
    bindparam("order_nos", expanding=True)
)
"""Which of ``:order_nos`` have a row (realignment: a reservation is resolved once its order exists)."""

PRESENT_ORDER_STATUSES = text(
    "SELECT order_no, request_id, status FROM orders WHERE order_no IN :order_nos"
    " UNION ALL SELECT order_no, request_id, :rejected FROM order_no_conflicts WHERE order_no IN :order_nos"
).bindparams(bindparam("order_nos", expanding=True), bindparam("rejected", int(OrderStatus.REJECTED)))
"""Which of ``:order_nos`` have a row, with the request id it was written for and its status
(realignment: resolved, and whether rejected). A request whose order number was taken has its
``rejected`` row under a stand-in number; ``order_no_conflicts`` names it under the number it was given."""

UNITS_HELD = text(
    "SELECT user_id, SUM(quantity) FROM orders WHERE product_id = :p AND status NOT IN :released GROUP BY user_id"
).bindparams(bindparam("released", expanding=True))
"""Units each user holds of product ``:p`` against the per-user limit (statuses ``:released`` excluded)."""

# Reads of the main job's report (``flashsale sale``): whole-product views, off the hot path.
COUNT_OF_PRODUCT = text("SELECT COUNT(*) FROM orders WHERE product_id = :p")
OF_PRODUCT = text("SELECT order_no, request_id, user_id, quantity, status, reason FROM orders WHERE product_id = :p")
UNPAID_OF_PRODUCT = text(
    "SELECT order_no, user_id, quantity, amount FROM orders WHERE product_id = :p AND status = :pending ORDER BY id"
)
YOUNGEST_UNPAID_AGE = text(
    "SELECT TIMESTAMPDIFF(SECOND, MAX(created_at), NOW()) FROM orders WHERE product_id = :p AND status = :pending"
)
"""Whole seconds from the newest ``created_at`` of product ``:p``'s orders in ``:pending`` to
``NOW()``, NULL when none."""
