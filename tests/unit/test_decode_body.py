"""The purchase route's one-pass strict decode (``service/api/body.py: decode_strict``) answers
exactly as the two-pass path of every other route: Litestar's generic JSON decode, then
``msgspec.convert(strict=True)``. Compared on hand-picked bodies and on seeded random mutations
of a valid one and of one with a key repeated (deterministic)."""

from __future__ import annotations

import random

import msgspec
import pytest
from litestar.exceptions import SerializationException
from litestar.serialization import decode_json

from service.api.body import decode_strict
from service.api.controllers.orders import PurchaseRequest
from service.api.problems import Problem, field_error, validation_problem

VALID = b'{"product_id": 12, "quantity": 1}'
PICKED = [
    b" ",
    b"null",
    b"1",
    b"[]",
    b"{}",
    b'{"product_id": 1}',
    b'{"product_id": 1, "quantity": 1,}',
    b'{"product_id": 1, "quantity": 1} x',
    b'{"product_id": 1, "quantity": "1"}',
    b'{"product_id": 1.0, "quantity": 1}',
    b'{"product_id": 0, "quantity": 1}',
    b'{"product_id": 1, "quantity": 2147483648}',
    b'{"product_id": 1, "quantity": true}',
    b'{"x": 1, "product_id": 1, "quantity": 1}',
    b'{"product_id": 1, "product_id": 2, "quantity": 1}',
    b'{"product_id": 99999999999999999999, "quantity": 1}',
    b"\xff\xfe",
    b'{"quantity": "a", "product_id": ',
    b"[" * 2000,
    b'\n{"product_id": 1, "quantity": 1}\n',
    # a key repeated: only the last value counts, as in the two-pass path
    b'{"product_id": "x", "product_id": 111, "quantity": 1}',
    b'{"product_id": null, "product_id": 1, "quantity": 1}',
    b'{"product_id": 1, "product_id": "x", "quantity": 1}',
    b'{"quantity": 1.5, "product_id": 1, "quantity": 1}',
    b'{"product_id": 1, "quantity": 1, "coupon": 1, "coupon": 2}',
]


def _mutations(count: int) -> list[bytes]:
    rnd = random.Random(7)
    bodies = []
    for _ in range(count):
        body = bytearray(VALID)
        for _ in range(rnd.randint(1, 3)):
            at = rnd.randrange(len(body))
            roll = rnd.random()
            if roll < 0.4:
                del body[at]
            elif roll < 0.8:
                body.insert(at, rnd.choice(b'{}[]":,0123456789-.eE tnrufals\\x'))
            else:
                body[at] = rnd.randrange(256)
        bodies.append(bytes(body))
    return bodies


def _repeated_keys(count: int) -> list[bytes]:
    """A valid body with one of its keys repeated, before or after, holding a value of any kind."""
    rnd = random.Random(11)
    values = [b'"x"', b"null", b"1.5", b"true", b"[]", b"{}", b"0", b"-3", b"7", b"2147483648"]
    bodies = []
    for _ in range(count):
        key = rnd.choice([b'"product_id"', b'"quantity"', b'"coupon"'])
        extra = key + b": " + rnd.choice(values)
        inner = [b'"product_id": 12', b'"quantity": 1']
        inner.insert(rnd.randrange(len(inner) + 1), extra)
        bodies.append(b"{" + b", ".join(inner) + b"}")
    return bodies


def _two_pass(body: bytes) -> object:
    """What a route taking ``data`` answers (``check_json_body`` after Litestar's decode)."""
    try:
        raw = decode_json(body)
    except RecursionError:  # both paths leave it to the app's handler (400, service/api/problems.py)
        return "too deep"
    except SerializationException:
        return _answer(field_error("body", "Not valid JSON"))
    try:
        return msgspec.convert(raw, PurchaseRequest, strict=True)
    except msgspec.ValidationError as exc:
        return _answer(validation_problem(str(exc)))


def _one_pass(body: bytes) -> object:
    try:
        return decode_strict(body, PurchaseRequest)
    except RecursionError:
        return "too deep"
    except Problem as exc:
        return _answer(exc)


def _answer(problem: Problem) -> tuple[int, str, object]:
    return problem.status_code, problem.detail, problem.extra


@pytest.mark.parametrize("body", [VALID, *PICKED, *_mutations(400), *_repeated_keys(200)])
def test_one_pass_answers_as_the_two_pass_decode(body):
    assert _one_pass(body) == _two_pass(body)


def test_the_mutations_reach_both_kinds_of_refusal_and_some_valid_bodies():
    """Guards the comparison above against comparing only one kind of answer."""
    answers = [_one_pass(body) for body in _mutations(400)]
    details = [answer[1] for answer in answers if isinstance(answer, tuple)]
    assert any(isinstance(answer, PurchaseRequest) for answer in answers)
    assert "body: Not valid JSON" in details
    assert any(detail != "body: Not valid JSON" for detail in details)


def test_an_empty_body_says_a_json_object_is_required():
    with pytest.raises(Problem) as refused:
        decode_strict(b"", PurchaseRequest)
    assert refused.value.detail.startswith("body: A JSON object is required")
