"""Redis Lua scripts of flashsale, shipped as package data and read with ``importlib.resources``.

Every script touches only keys passed in KEYS, and all keys of one call share the product's hash
tag ``{p:ID}``, so each script runs unchanged on Redis Cluster.

Journal entry format (hash field = request id): ``user|quantity|order_no|reserved_at_ms|claimed``.
Replay record (hash per request id): ``quantity``, ``order_no``, ``state`` in
``pending`` (reserved, publish not yet confirmed), ``queued`` (broker confirmed) or
``released`` (publish failed; stock, quota and journal entry were given back).
"""
