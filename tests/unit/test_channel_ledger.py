"""The channel simulator's books (no server): one payment per merchant order number, close
refused once paid, refunds decided by the payment, the day's bill."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from toolkit.channel.ledger import Ledger, Refused

URL = "http://api.example/api/v1/payments/notify"


def test_the_merchant_order_number_is_the_key() -> None:
    ledger = Ledger("mockpay")
    first = ledger.create("FS1", 700, "CNY", URL)
    assert ledger.create("FS1", 700, "CNY", URL) is first
    with pytest.raises(Refused) as differs:
        ledger.create("FS1", 900, "CNY", URL)
    assert (differs.value.status, differs.value.code) == (409, "order_terms_differ")
    assert ledger.close("FS1").status == "closed"
    assert ledger.create("FS1", 700, "CNY", URL).channel_txn_id == first.channel_txn_id  # opened again


def test_close_is_refused_once_paid_and_a_closed_payment_cannot_be_paid() -> None:
    ledger = Ledger("altpay")
    ledger.create("FS1", 700, "CNY", URL)
    ledger.create("FS2", 700, "CNY", URL)
    assert ledger.pay("FS1")[1] is True and ledger.pay("FS1")[1] is False  # charged once
    with pytest.raises(Refused) as paid:
        ledger.close("FS1")
    assert paid.value.code == "already_paid"
    ledger.close("FS2")
    with pytest.raises(Refused) as closed:
        ledger.pay("FS2")
    assert closed.value.code == "payment_closed"
    with pytest.raises(Refused) as unknown:
        ledger.get("FS3")
    assert unknown.value.status == 404


def test_refunds_are_decided_by_the_payment() -> None:
    ledger = Ledger("mockpay")
    ledger.create("FS1", 700, "CNY", URL)
    unpaid, _ = ledger.refund("R0", "FS1", 700)
    assert ledger.settle(unpaid, fail=False) == "rejected"
    ledger.pay("FS1")
    too_much, _ = ledger.refund("R1", "FS1", 701)
    assert ledger.settle(too_much, fail=False) == "rejected"
    failing, _ = ledger.refund("R2", "FS1", 700)
    assert ledger.settle(failing, fail=True) == "failed"
    good, new = ledger.refund("R3", "FS1", 700)
    assert new and ledger.refund("R3", "FS1", 700) == (good, False)
    assert ledger.settle(good, fail=False) == "refunded"
    twice, _ = ledger.refund("R4", "FS1", 700)
    assert ledger.settle(twice, fail=False) == "rejected"  # refunded already
    with pytest.raises(Refused):
        ledger.refund("R3", "FS2", 700)


def test_the_bill_lists_the_days_payments_and_refunds() -> None:
    ledger = Ledger("mockpay")
    ledger.create("FS1", 700, "CNY", URL)
    ledger.pay("FS1")
    refund, _ = ledger.refund("R1", "FS1", 700)
    ledger.settle(refund, fail=False)
    today = datetime.now(UTC).date()
    assert [(line.order_no, line.amount, line.type) for line in ledger.bill(today)] == [
        ("FS1", 700, "payment"),
        ("FS1", 700, "refund"),
    ]
    assert ledger.bill(today - timedelta(days=1)) == []
