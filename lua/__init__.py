"""Redis Lua scripts of flashsale, shipped as package data and read with ``importlib.resources``.

Every script touches only keys passed in KEYS, and all keys of one call share the product's hash
tag ``{p:ID}``, so each script runs unchanged on Redis Cluster.

Journal entry format (hash field = request id):
``user|quantity|order_no|reserved_at_ms|unit_price|claimed`` (``unit_price`` in minor units, fixed
when the stock was reserved; ``claimed`` stays last: ``claim.lua`` flips the last character).
Entries written before the unit price was recorded, ``user|quantity|order_no|reserved_at_ms|claimed``,
are still read (``release.lua``, ``realign.lua``, ``replies.parse_journal_entry``): an order
number starts with letters, so the two shapes cannot be confused.
Replay record (hash per request id): ``quantity``, ``order_no``, ``attempt`` (token of the HTTP
attempt that reserved), ``state`` in ``pending`` (reserved, publish not yet confirmed), ``queued``
(broker confirmed) or ``released`` (that attempt was given back: stock, quota and journal entry);
plus ``abandoned:<attempt>`` for each attempt that ``release.lua`` gave up before its reserve took
effect (such a reserve, arriving late, writes nothing).
"""
