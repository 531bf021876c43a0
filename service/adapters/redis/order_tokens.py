"""Order tokens: a purchase of a product that needs one names a token issued to the buyer when
the order page opened (``SET token EX ttl``), taken by the reserve that uses it.

Failures raise the vocabulary only (:mod:`.boundary`).
"""

from __future__ import annotations

from service.adapters.redis.boundary import translated
from service.adapters.redis.keys import ProductKeys
from service.adapters.redis.scripts import KeyspaceStore

TOKEN_USED = -2
""":meth:`OrderTokens.take`: this user already used the order token (a purchase took it)."""
TOKEN_INVALID = -1
""":meth:`OrderTokens.take`: the order token is unknown, expired or another user's."""


class OrderTokens(KeyspaceStore):
    """The order tokens of one key prefix, each in the slot of its product's stock bucket."""

    @translated
    async def issue(self, product_id: int, token: str, user_id: str, ttl_seconds: int, *, bucket: int = 0) -> None:
        """Keep order token ``token`` for ``user_id`` in the slot of the product's ``bucket`` (the
        buyer's) for ``ttl_seconds`` (``SET token EX 300`` when the order page opens)."""
        key = ProductKeys(self._prefix, product_id, bucket).order_token(token)
        await self._redis.set(key, user_id, ex=ttl_seconds)

    async def take(self, product_id: int, token: str, user_id: str, *, bucket: int = 0) -> int:
        """``lua/take_token.lua``: mark ``token`` used if it is ``user_id``'s. Returns the
        milliseconds it had left (>= 1, for :meth:`give_back`), :data:`TOKEN_USED` when this
        user already used it, :data:`TOKEN_INVALID` when it is unknown, expired or another
        user's (nothing written)."""
        key = ProductKeys(self._prefix, product_id, bucket).order_token(token)
        return int(await self._scripts.run("take_token", keys=[key], args=[user_id]))

    @translated
    async def give_back(self, product_id: int, token: str, user_id: str, left_ms: int, *, bucket: int = 0) -> None:
        """Put back a token :meth:`take` marked used, for the ``left_ms`` it had left (the
        purchase it was taken for did not happen); nothing when it has expired since."""
        key = ProductKeys(self._prefix, product_id, bucket).order_token(token)
        await self._redis.set(key, user_id, px=left_ms, xx=True)
