"""The merchant's side of a payment channel's HTTP API (create, query, close, refund, bill), as
``flashsale channel serve`` implements it (docs/API.md).

One pooled ``httpx.AsyncClient`` per process (created in the composition root), every call
bounded by the settings' timeout. The channel's answers are decoded leniently: fields this
client does not know are ignored (channels add fields).
"""

from __future__ import annotations

from datetime import date, datetime

import httpx
import msgspec

from service.settings import PaymentSettings


class ChannelUnavailable(Exception):
    """The channel did not answer in time, or answered 5xx or something unexpected: nothing is
    known about what it did."""


class ChannelRefused(Exception):
    """The channel answered no (a 4xx: no such payment, a refund number used for another refund,
    a request it will not take): a definite answer, the same request cannot succeed later.
    ``code`` and ``detail`` are the channel's words."""

    def __init__(self, channel: str, status: int, code: str, detail: str) -> None:
        super().__init__(f"{channel} refused: {code}: {detail}")
        self.channel = channel
        self.status = status
        self.code = code
        self.detail = detail


class ChannelPayment(msgspec.Struct):
    """A payment as the channel reports it. ``status``: ``unpaid``, ``paid``, ``closed``; amount
    in minor units; ``pay_url`` is the buyer's pay parameter."""

    channel: str
    order_no: str
    channel_txn_id: str
    amount: int
    currency: str
    status: str
    pay_url: str = ""
    paid_at: datetime | None = None


class BillLine(msgspec.Struct):
    """One transaction of a channel's daily bill; ``type``: ``payment`` or ``refund``."""

    channel_txn_id: str
    order_no: str
    amount: int
    currency: str
    type: str


class _Bill(msgspec.Struct):
    transactions: list[BillLine]


class _Refused(msgspec.Struct):
    code: str
    detail: str = ""


class ChannelClient:
    """Calls to the channels at ``urls`` (channel -> base URL) over ``http`` (pooled, timeouts set)."""

    def __init__(self, urls: dict[str, str], http: httpx.AsyncClient) -> None:
        self._urls = urls
        self._http = http

    async def aclose(self) -> None:
        """Close the pooled connections."""
        await self._http.aclose()

    @property
    def channels(self) -> frozenset[str]:
        """The channels this process can talk to."""
        return frozenset(self._urls)

    async def _call(self, method: str, channel: str, path: str, **kwargs: object) -> httpx.Response:
        if channel not in self._urls:
            raise ChannelUnavailable(f"{channel}: no URL for this channel")
        try:
            response = await self._http.request(method, self._urls[channel] + path, **kwargs)  # type: ignore[arg-type]
        except httpx.HTTPError as exc:
            raise ChannelUnavailable(f"{channel}: {exc!r}") from None
        if response.status_code >= 500:
            raise ChannelUnavailable(f"{channel}: {response.status_code}")
        return response

    @staticmethod
    def _decode(response: httpx.Response, channel: str) -> ChannelPayment:
        try:
            return msgspec.json.decode(response.content, type=ChannelPayment)
        except msgspec.DecodeError:
            raise ChannelUnavailable(f"{channel}: unreadable answer {response.status_code}") from None

    async def create(self, channel: str, order_no: str, amount: int, currency: str, notify_url: str) -> ChannelPayment:
        """Create (or fetch: the merchant order number is the key) the payment of ``order_no``.

        Raises:
            ChannelUnavailable: no usable answer (a refusal included: the API cannot fix it).
        """
        body = {"order_no": order_no, "amount": amount, "currency": currency, "notify_url": notify_url}
        response = await self._call("POST", channel, "/payments", json=body)
        if response.status_code != 200:
            raise ChannelUnavailable(f"{channel}: create {response.status_code} {response.text[:200]}")
        return self._decode(response, channel)

    async def query(self, channel: str, order_no: str) -> ChannelPayment | None:
        """The channel's payment of ``order_no``, None when it has none.

        Raises: ChannelUnavailable.
        """
        response = await self._call("GET", channel, f"/payments/{order_no}")
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise ChannelUnavailable(f"{channel}: query {response.status_code}")
        return self._decode(response, channel)

    async def close(self, channel: str, order_no: str) -> ChannelPayment | None:
        """Close the unpaid payment of ``order_no``: the payment afterwards (``status`` ``closed``,
        or ``paid`` when the channel refused because it is paid), None when the channel has none.

        Raises: ChannelUnavailable.
        """
        response = await self._call("POST", channel, f"/payments/{order_no}/close")
        if response.status_code == 404:
            return None
        if response.status_code == 409 and msgspec.json.decode(response.content, type=_Refused).code == "already_paid":
            return await self.query(channel, order_no)
        if response.status_code != 200:
            raise ChannelUnavailable(f"{channel}: close {response.status_code}")
        return self._decode(response, channel)

    async def refund(self, channel: str, refund_no: str, order_no: str, amount: int) -> None:
        """Ask for refund ``refund_no`` (``amount`` minor units of ``order_no``); the outcome comes
        as a notification.

        Raises:
            ChannelRefused: the channel answered 4xx: not taken in, and never will be.
            ChannelUnavailable: no usable answer: taken in or not, nobody knows.
        """
        body = {"refund_no": refund_no, "order_no": order_no, "amount": amount}
        response = await self._call("POST", channel, "/refunds", json=body)
        if 400 <= response.status_code < 500:
            raise self._refusal(channel, response)
        if response.status_code not in (200, 202):
            raise ChannelUnavailable(f"{channel}: refund {response.status_code} {response.text[:200]}")

    @staticmethod
    def _refusal(channel: str, response: httpx.Response) -> ChannelRefused:
        """A 4xx answer as :class:`ChannelRefused`, in the channel's words when its body has them."""
        try:
            said = msgspec.json.decode(response.content, type=_Refused)
        except msgspec.DecodeError:
            said = _Refused(f"http_{response.status_code}", response.text[:200])
        return ChannelRefused(channel, response.status_code, said.code, said.detail[:200])

    async def bill(self, channel: str, day: date) -> list[BillLine]:
        """Every transaction ``channel`` settled on UTC day ``day``.

        Raises: ChannelUnavailable.
        """
        response = await self._call("GET", channel, "/bill", params={"date": day.isoformat()})
        if response.status_code != 200:
            raise ChannelUnavailable(f"{channel}: bill {response.status_code}")
        return msgspec.json.decode(response.content, type=_Bill).transactions


def make_channel_client(payment: PaymentSettings) -> ChannelClient:
    """The channels' HTTP API on one pooled client per process: every call bounded by
    ``channel_timeout`` seconds (connect, read, write and the wait for a pooled connection), at
    most 20 connections."""
    http = httpx.AsyncClient(
        timeout=httpx.Timeout(payment.channel_timeout),
        limits=httpx.Limits(max_connections=20, max_keepalive_connections=10),
    )
    return ChannelClient(payment.channel_urls, http)
