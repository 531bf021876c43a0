"""Products, their sale windows and stock: create/update (admin) and read (anyone)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
import structlog
from msgspec import Meta
from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from db.engine import in_transaction
from db.models import MAX_AMOUNT, StockMode
from db.queries import inventory, products
from service import metrics
from service.adapters.redis.stores import RedisStores
from service.domain.errors import InvalidInput, ProductNotFound
from service.domain.stock.buckets import MAX_BUCKETS
from service.domain.stock.modes import switch_to_database, switch_to_redis
from service.domain.stock.realign import Realigner
from service.domain.stock.realign_report import RealignReport, without_redis
from service.failures import StoreFailure

_SET_RETRIED = metrics.retry_counter("set_product")

log = structlog.get_logger(__name__)

PositiveId = Annotated[int, Meta(ge=1, le=2**63 - 1)]


class InvalidProduct(InvalidInput):
    """Product input that is well-formed but inconsistent; ``field`` names the culprit."""


class ProductInput(msgspec.Struct, forbid_unknown_fields=True):
    """Create or update a product. ``stock`` is the sale's units in all, sold ones included (MySQL
    keeps ``stock - sold`` on sale, so repeating a PUT changes nothing). ``price`` (minor currency
    units), ``per_user_limit`` (units) and ``name`` left out keep their current values (on
    creation: 0, 1 and "product ID"). The sale window likewise: on creation, without
    ``sale_starts_at`` the sale opens now and without ``sale_ends_at`` it has no end; on update,
    a bound left out is kept and ``"sale_ends_at": null`` removes the end (ISO 8601; naive
    times are UTC). ``stock_mode`` (docs/ARCHITECTURE.md: ``database``, sold from MySQL,
    or ``redis``, pre-decremented in Redis; new products default to ``database``) and ``require_token`` (a
    purchase needs an ``Order-Token``; default false) left out keep their values; a new
    ``stock_mode`` switches the product safely mid-sale (:mod:`service.domain.stock.modes`).
    ``buckets`` (1..64, default 1): how many Redis key sets the stock is split over, for a product
    hotter than one Redis Cluster slot (:mod:`service.domain.stock.buckets`); fixed at creation.
    ``waiting_room`` (default false; left out: kept): buyers pass the product's waiting room and a
    purchase needs their admission (docs/ARCHITECTURE.md, "Waiting room"); only for stock mode
    ``redis`` with one bucket (the admission is consumed in the reserve call, in the product's slot)."""

    stock: Annotated[int, Meta(ge=0, le=2**31 - 1)]
    price: Annotated[int, Meta(ge=0, le=2**62)] | None = None
    per_user_limit: Annotated[int, Meta(ge=1, le=1_000_000)] | None = None
    name: Annotated[str, Meta(min_length=1, max_length=200)] | None = None
    sale_starts_at: datetime | None = None
    sale_ends_at: datetime | None | msgspec.UnsetType = msgspec.UNSET
    stock_mode: StockMode | None = None
    require_token: bool | None = None
    buckets: Annotated[int, Meta(ge=1, le=MAX_BUCKETS)] | None = None
    waiting_room: bool | None = None


class ProductTerms(msgspec.Struct):
    """What a product is sold under: name, price (minor units), per-user limit (units), the sale
    window (``sale_ends_at`` None: no end) and whether it is open now (``sale_active``), stock mode
    (``database`` or ``redis``), whether a purchase needs an order token, stock buckets."""

    id: int
    name: str
    price: int
    per_user_limit: int
    sale_starts_at: datetime
    sale_ends_at: datetime | None
    sale_active: bool
    stock_mode: str
    require_token: bool
    buckets: int
    waiting_room: bool


class ProductView(ProductTerms):
    """Public sale info: the product's terms and ``remaining``, the stock Redis can still sell in
    ``redis`` mode (MySQL's when not loaded), MySQL's in ``database`` mode."""

    remaining: int


def _utc_naive(value: datetime) -> datetime:
    return value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value


async def set_product(
    engine: AsyncEngine, store: RedisStores, realigner: Realigner, product_id: int, data: ProductInput
) -> RealignReport:
    """Upsert the product and its MySQL stock (``stock - sold``), switch its stock mode when
    ``stock_mode`` names another one (:mod:`service.domain.stock.modes`), then load Redis (sale
    window, per-user limit, stock, mode marker) by a realignment pass: exact against
    reservations in flight, never a blind overwrite of live stock.

    A product in (or switched to) stock mode ``database`` is set while Redis is unreachable
    too: MySQL is written, the Redis load is left to the next realignment pass (the report says
    ``redis_unreachable``).

    Raises:
        InvalidProduct: ``sale_ends_at`` is not after ``sale_starts_at``, ``price x
            per_user_limit`` does not fit a BIGINT amount, ``buckets`` differs from the
            product's, or a waiting room would sell in stock mode ``database`` or over several
            buckets (nothing is written).
        service.failures.StoreUnavailable: Redis failed for a product in stock mode ``redis`` (MySQL
            is written; run it again).
    """
    starts = _utc_naive(data.sale_starts_at) if data.sale_starts_at else None
    ends = _utc_naive(data.sale_ends_at) if isinstance(data.sale_ends_at, datetime) else None
    row = {
        "id": product_id,
        "name": data.name,
        "default_name": f"product {product_id}",
        "price": data.price,
        "limit": data.per_user_limit,
        "starts": starts,
        "ends": ends,
        "ends_given": data.sale_ends_at is not msgspec.UNSET,
        "stock": data.stock,
        "mode": data.stock_mode.value if data.stock_mode else None,
        "require_token": data.require_token,
        "buckets": data.buckets,
        "waiting_room": data.waiting_room,
    }

    async def write(conn: AsyncConnection) -> str:
        # The product row, then the inventory row: the lock order of every transaction that
        # writes orders (products.LOCKED).
        await conn.execute(products.LOCKED, {"id": product_id})
        await conn.execute(inventory.STOCK_LOCKED, {"p": product_id})
        await conn.execute(products.UPSERT, row)
        price, limit, starts_at, ends_at, mode, buckets, room = (await conn.execute(products.TERMS, row)).one()
        # Checked on the values now stored (kept ones included); raised inside the transaction,
        # so nothing is written.
        if price * limit > MAX_AMOUNT:
            raise InvalidProduct("price", "price x per_user_limit must fit a BIGINT amount (minor units)")
        if ends_at is not None and ends_at <= starts_at:
            raise InvalidProduct("sale_ends_at", "must be after sale_starts_at")
        if data.buckets is not None and data.buckets != buckets:
            raise InvalidProduct("buckets", f"is fixed when the product is created (this one has {buckets})")
        if room and ((data.stock_mode or mode) != StockMode.REDIS or buckets != 1):
            # The admission is checked and consumed in the reserve call, in the product's one slot.
            raise InvalidProduct("waiting_room", "needs stock_mode redis and one stock bucket")
        # ``stock`` is the sale's units in all: what is sold stays sold, the rest is on sale.
        # Setting the same number again changes nothing, mid-sale included.
        await conn.execute(inventory.SET_SALE_UNITS, row)
        return str(mode)

    mode = await in_transaction(engine, write, label="set_product", on_retry=_SET_RETRIED)
    if data.stock_mode is StockMode.DATABASE and mode != StockMode.DATABASE:
        await switch_to_database(engine, store, realigner, product_id)
        mode = StockMode.DATABASE
    elif data.stock_mode is StockMode.REDIS and mode != StockMode.REDIS:
        return await switch_to_redis(engine, store, realigner, product_id)
    try:
        return await realigner.realign(product_id)
    except StoreFailure as exc:
        if mode != StockMode.DATABASE or exc.store != "redis":
            raise
        # MySQL alone sells this product; the next realignment pass once Redis answers writes
        # its terms and the mode marker there.
        log.warning("product_set_without_redis", product_id=product_id, error=repr(exc))
        return await without_redis(realigner.engine, product_id)


async def get_product(engine: AsyncEngine, store: RedisStores, product_id: int) -> ProductView | None:
    """Sale info and remaining stock, or None for an unknown product."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                products.VIEW,
                {"id": product_id},
            )
        ).first()
    if row is None:
        return None
    database = row.stock_mode == StockMode.DATABASE
    redis_stock = None if database else await store.stock.units(product_id, buckets=row.buckets)
    terms = _terms(row, datetime.now(UTC).replace(tzinfo=None))
    return ProductView(**msgspec.structs.asdict(terms), remaining=redis_stock if redis_stock is not None else row.stock)


def _terms(row: Row[Any], now: datetime) -> ProductTerms:
    """A product's terms from its ``products`` row (MySQL's naive UTC times); open at ``now``."""
    return ProductTerms(
        id=row.id,
        name=row.name,
        price=row.price,
        per_user_limit=row.per_user_limit,
        sale_starts_at=row.sale_starts_at.replace(tzinfo=UTC),
        sale_ends_at=row.sale_ends_at.replace(tzinfo=UTC) if row.sale_ends_at else None,
        sale_active=row.sale_starts_at <= now and (row.sale_ends_at is None or now < row.sale_ends_at),
        stock_mode=row.stock_mode,
        require_token=bool(row.require_token),
        buckets=row.buckets,
        waiting_room=bool(row.waiting_room),
    )


class CatalogService:
    """Product use cases: read the sale info (anyone), create or update a product (admin)."""

    def __init__(self, engine: AsyncEngine, store: RedisStores, realigner: Realigner) -> None:
        self._engine = engine
        self._store = store
        self._realigner = realigner

    async def get(self, product_id: int) -> ProductView:
        """Sale info and remaining stock. Raises :class:`ProductNotFound`."""
        view = await get_product(self._engine, self._store, product_id)
        if view is None:
            raise ProductNotFound(product_id)
        return view

    async def terms(self) -> list[ProductTerms]:
        """Every product's terms, by id (the ops page)."""
        async with self._engine.connect() as conn:
            rows = (await conn.execute(products.ALL_TERMS)).all()
        now = datetime.now(UTC).replace(tzinfo=None)
        return [_terms(row, now) for row in rows]

    async def set(self, product_id: int, data: ProductInput) -> RealignReport:
        """Create or update a product and load Redis by a realignment pass (see :func:`set_product`).
        Raises :class:`InvalidProduct`."""
        return await set_product(self._engine, self._store, self._realigner, product_id, data)
