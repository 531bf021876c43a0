"""Stock buckets: the buyer -> bucket map and the split of stock over buckets."""

from __future__ import annotations

from zlib import crc32

from hypothesis import given
from hypothesis import strategies as st

from service.adapters.redis.keys import ProductKeys
from service.domain.stock.buckets import MAX_BUCKETS, bucket_of, split


def test_a_buyers_bucket_is_crc32_of_the_user_id_modulo_k() -> None:
    assert crc32(b"alice") == 663665735  # zlib's CRC-32, the same in every process and release
    assert bucket_of("alice", 3) == 663665735 % 3
    assert bucket_of("alice", 1) == 0
    assert {bucket_of(f"user-{i}", 4) for i in range(100)} == {0, 1, 2, 3}


@given(st.integers(0, 10**9), st.integers(1, MAX_BUCKETS))
def test_the_shares_add_up_and_differ_by_one_unit_at_most(units: int, buckets: int) -> None:
    shares = split(units, buckets)
    assert len(shares) == buckets and sum(shares) == units
    assert max(shares) - min(shares) <= 1
    assert shares == sorted(shares, reverse=True)


def test_bucket_zero_keeps_the_keys_of_a_product_of_one_bucket() -> None:
    assert ProductKeys("fs", 7).stock == "fs:{p:7}:stock"
    assert ProductKeys("fs", 7, 0).stock == "fs:{p:7}:stock"
    assert ProductKeys("fs", 7, 2).stock == "fs:{p:7:2}:stock"


@given(st.integers(0, 1000), st.integers(1, MAX_BUCKETS), st.data())
def test_a_favoured_bucket_gets_what_its_buyer_asks_where_the_stock_allows(units: int, buckets: int, data) -> None:
    bucket = data.draw(st.integers(0, buckets - 1))
    need = data.draw(st.integers(1, 10))
    shares = split(units, buckets, (bucket, need))
    assert sum(shares) == units and min(shares) >= 0
    assert shares[bucket] >= min(need, units)
    if split(units, buckets)[bucket] >= need:  # no buyer short: the even split stands
        assert shares == split(units, buckets)


def test_a_short_remainder_goes_where_it_is_asked_for() -> None:
    assert split(3, 3) == [1, 1, 1]
    assert split(3, 3, (2, 2)) == [1, 0, 2]
    assert split(2, 3, (2, 1)) == [1, 0, 1]
    assert split(1, 3, (1, 2)) == [0, 1, 0]
