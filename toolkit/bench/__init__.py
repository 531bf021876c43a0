"""``flashsale bench``: each hop of the purchase path measured side by side in one run.

A C load client (wrk) drives a bare Litestar app and the product's API; the consumer drains a
backlog beside raw MySQL writers on the same database. See :mod:`toolkit.bench.run`.
"""
