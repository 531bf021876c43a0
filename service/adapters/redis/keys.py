"""Redis key names, used only inside this package (callers name products, shards and locks: :mod:`.stores`).

Keys of one product share the hash tag ``{p:ID}`` (one Redis Cluster slot), so every script call
on a product passes all its keys in KEYS and runs on Redis Cluster.
"""

from __future__ import annotations


class ProductKeys:
    """The Redis keys of one product under a key prefix (the prefix isolates deployments and test runs).

    - ``stock``: string, integer units still sellable in Redis.
    - ``sale``: hash ``starts_ms``, ``ends_ms`` (0 = no end), ``limit`` (per-user limit, units),
      ``price`` (minor currency units).
    - ``journal``: hash request id -> ``user|quantity|order_no|reserved_at_ms|unit_price|claimed``
      (``unit_price`` in minor units, fixed at reservation; entries written before it was
      recorded read ``user|quantity|order_no|reserved_at_ms|claimed``).
    - ``quota``: hash user id -> units the user holds.
    - ``replay(request_id)``: hash ``quantity``, ``order_no``, ``state``, ``attempt`` (the token of
      the HTTP attempt that made the reservation) for replays, and ``abandoned:<attempt>`` for
      each attempt answered 503 before its reserve took effect (its reserve is then refused).
    - ``units``: string, units of every journal entry (kept by the scripts that add or drop
      entries, so realignment reads it in O(1)).
    - ``republished``: hash request id -> ``ms|count``: when realignment last published the
      entry again and how often (its back-off).
    - ``versions``: hash ``synced`` (inventory version of the last realignment snapshot),
      ``restocked`` (highest inventory version whose returned units reached Redis) and
      ``dropped`` (newest snapshot version that dropped resolved journal entries).
    - ``returned(order_no)``: marker that the order's units were given back to Redis.
    - ``user_rate(user_id)`` / ``address_rate(address)``: purchase rate buckets (GCRA arrival time).
    - ``order_token(token)``: string, the user id an order token was issued to (expires).

    Waiting room (``lua/queue.lua``; docs/ARCHITECTURE.md, "Waiting room"): ``room`` (hash
    ``seed``, ``seq``, ``opened_ms``, ``entrants``, ``admitted``, ``expired``, ``used``, ``held``
    units kept for admitted buyers, ``factor``, ``starts_ms`` of its window, ``departed``,
    ``withdrawn``, ``vacated``, ``rolled``, ``gone``, ``expiry``: no admission expires before it,
    ``none`` with none),
    ``room_line`` (zset user -> place score: positions), ``room_waiting`` (zset, the same scores:
    who waits), ``room_admitted`` (zset user -> admission expiry ms), ``room_grants`` (hash user ->
    admission token), ``room_joined`` (hash user -> ms joined, until admitted), ``room_pre`` (zset
    user -> lottery score: the pre-queue as drawn, kept for the record), ``room_due`` (hash user ->
    ``due ms:longest poll ms told:departure bucket[:final position]``), ``room_seen`` (hash
    departure bucket -> waiting buyers in it), ``room_closed`` (zset: the previous window's line).

    The ``sale`` hash also holds ``room`` (``1``: a purchase needs an admission), ``token``
    (``1``: a purchase needs an order token), ``buckets``
    (the product's K) and, while the product sells from MySQL (stock mode ``database``),
    ``mode`` = ``database``.

    ``bucket``: one of the product's stock buckets (:mod:`service.domain.stock.buckets`), each a whole
    set of these keys with its own hash tag; bucket 0's keys are those of a product of one bucket.
    The ``versions`` hash of a bucket of a product of several also holds ``pass`` (the newest
    rebalancing pass that drained it) and ``filling`` (that pass, until its share is filled in).
    """

    __slots__ = ("tag",)

    def __init__(self, prefix: str, product_id: int, bucket: int = 0) -> None:
        self.tag = f"{prefix}:{{p:{product_id}}}" if bucket == 0 else f"{prefix}:{{p:{product_id}:{bucket}}}"
        """``prefix:{p:ID}`` (bucket 0) or ``prefix:{p:ID:B}``: the start of every key of the bucket."""

    @property
    def stock(self) -> str:
        return f"{self.tag}:stock"

    @property
    def sale(self) -> str:
        return f"{self.tag}:sale"

    @property
    def journal(self) -> str:
        return f"{self.tag}:journal"

    @property
    def quota(self) -> str:
        return f"{self.tag}:quota"

    @property
    def units(self) -> str:
        return f"{self.tag}:units"

    @property
    def republished(self) -> str:
        return f"{self.tag}:republished"

    @property
    def versions(self) -> str:
        return f"{self.tag}:versions"

    @property
    def room(self) -> str:
        return f"{self.tag}:wr"

    @property
    def room_line(self) -> str:
        return f"{self.tag}:wr:line"

    @property
    def room_waiting(self) -> str:
        return f"{self.tag}:wr:waiting"

    @property
    def room_admitted(self) -> str:
        return f"{self.tag}:wr:admitted"

    @property
    def room_grants(self) -> str:
        return f"{self.tag}:wr:grants"

    @property
    def room_joined(self) -> str:
        return f"{self.tag}:wr:joined"

    @property
    def room_pre(self) -> str:
        return f"{self.tag}:wr:pre"

    @property
    def room_due(self) -> str:
        return f"{self.tag}:wr:due"

    @property
    def room_seen(self) -> str:
        return f"{self.tag}:wr:seen"

    @property
    def room_closed(self) -> str:
        return f"{self.tag}:wr:closed"

    def replay(self, request_id: str) -> str:
        return f"{self.tag}:req:{request_id}"

    def returned(self, order_no: str) -> str:
        return f"{self.tag}:returned:{order_no}"

    def order_token(self, token: str) -> str:
        return f"{self.tag}:tok:{token}"

    def user_rate(self, user_id: str) -> str:
        return f"{self.tag}:rate:u:{user_id}"

    def address_rate(self, address: str) -> str:
        return f"{self.tag}:rate:a:{address}"


def order_key(prefix: str, order_no: str) -> str:
    """``order_no -> user|product|request_id|quantity`` for orders that only Redis knows yet (GET while queued)."""
    return f"{prefix}:order:{order_no}"


def sequence_key(prefix: str, shard: int, second: str) -> str:
    """Order-number sequence counter of one shard in one UTC second (``yyyyMMddHHmmss``); in the
    shard's slot (hash tag ``{seq:SS}``) with the shard's epoch."""
    return f"{prefix}:{{seq:{shard:02d}}}:{second}"


def epoch_key(prefix: str, shard: int) -> str:
    """Hash ``generation``, ``run_id``: the order-number generation a shard mints in, and the run
    id of the Redis server it was installed on (``lua/epoch.lua``, ``lua/mint.lua``)."""
    return f"{prefix}:{{seq:{shard:02d}}}:epoch"


def shard_lease_key(prefix: str, shard: int) -> str:
    """The lease that gives one process exclusive use of an order-number shard (00-99)."""
    return f"{prefix}:shard:{shard:02d}"


def lock_key(prefix: str, name: str) -> str:
    """A lock of the key prefix's deployment (e.g. ``recovery``: one self-healing pass at a time)."""
    return f"{prefix}:lock:{name}"


def restock_channel(prefix: str) -> str:
    """Pub/sub channel on which the scripts that put stock back announce the product id (so
    every API process drops its sold-out flag). A channel, not a key: no hash tag needed."""
    return f"{prefix}:restocked"
