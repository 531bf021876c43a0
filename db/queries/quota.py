"""Statements on ``user_quota`` (units each user holds of a product against its per-user limit) and
``order_no_conflicts``.

Every writer of ``user_quota`` holds the product's inventory row lock first (the consumer's
``UPDATE inventory`` or ``SELECT ... FOR UPDATE``, the ``database``-mode purchase's lock, a
cancel's give-back), so the quota rows of one product are always locked after its inventory row:
one lock order everywhere, and the count of a product changes one transaction at a time.
"""

from __future__ import annotations

from sqlalchemy import bindparam, text

from db.queries.json_rows import ROWS

ADD_MANY = text(
    "INSERT INTO user_quota (product_id, user_id, bought)"
    f" SELECT :p, j.user_id, j.units FROM JSON_TABLE({ROWS}, '$[*]' COLUMNS ("
    " user_id VARCHAR(64) PATH '$[0]', units INT PATH '$[1]')) j ORDER BY j.user_id"
    " ON DUPLICATE KEY UPDATE bought = bought + VALUES(bought)"
)
"""Add units to users of product ``:p``: ``:rows`` is a JSON array of ``[user_id, units]`` (one
entry per user, :func:`db.queries.json_rows.json_rows`); a user without a row gets one. The rows
are locked (in user order) until the transaction ends."""

OVER_LIMIT = text(
    "SELECT STRAIGHT_JOIN j.user_id, q.bought, p.per_user_limit"
    f" FROM JSON_TABLE({ROWS}, '$[*]' COLUMNS (user_id VARCHAR(64) COLLATE utf8mb4_bin PATH '$[0]')) j"
    " JOIN user_quota q ON q.product_id = :p AND q.user_id = j.user_id"
    " JOIN products p ON p.id = q.product_id WHERE q.bought > p.per_user_limit"
)
"""Which of the users of ``:rows`` (:data:`ADD_MANY`'s parameter: the first column is the user)
now hold more of product ``:p`` than its per-user limit (after :data:`ADD_MANY` in the same
transaction: the rows are this transaction's, read as written). One primary-key look-up per
user, joined from the rows as sent (as :data:`db.queries.orders.LOG_MANY`)."""

TAKE_BACK = text("UPDATE user_quota SET bought = GREATEST(bought - :units, 0) WHERE product_id = :p AND user_id = :u")
"""``:units`` of user ``:u``'s count of product ``:p`` go back (a cancel, or units a transaction
added and then did not take). Never below 0: an order written before the count existed and
cancelled after cannot make it negative."""

BOUGHT = text("SELECT bought FROM user_quota WHERE product_id = :p AND user_id = :u")
"""User ``:u``'s count of product ``:p`` (None when the user holds none)."""

RECORD_CONFLICT = text(
    "INSERT INTO order_no_conflicts (request_id, order_no, user_id)"
    f" SELECT j.request_id, j.order_no, j.user_id FROM JSON_TABLE({ROWS}, '$[*]' COLUMNS ("
    " request_id VARCHAR(32) PATH '$[0]', order_no VARCHAR(26) PATH '$[1]', user_id VARCHAR(64) PATH '$[2]')) j"
)
"""``:rows``: JSON array of ``[request_id, order_no the buyer was given, user_id]``."""

CONFLICT_OF_USER = text(
    "SELECT o.id, c.order_no, o.request_id, o.user_id, o.product_id, o.quantity, o.amount, o.status, o.reason,"
    " o.created_at FROM order_no_conflicts c JOIN orders o ON o.request_id = c.request_id"
    " WHERE c.order_no = :o AND c.user_id = :u ORDER BY o.id LIMIT 1"
)
"""User ``:u``'s order that was given order number ``:o`` and found it taken (the view's columns,
with the number the buyer knows), or nothing."""

GIVEN_ORDER_NOS = text("SELECT request_id, order_no FROM order_no_conflicts WHERE request_id IN :r").bindparams(
    bindparam("r", expanding=True)
)
"""The order numbers the buyers were given, for those of request ids ``:r`` written under a stand-in."""
