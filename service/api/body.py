"""Strict JSON bodies: a JSON integer for an integer, an RFC 3339 string for a datetime, no
field the type does not name.

Litestar converts a request body to its handler's ``data`` type leniently (``"100"``, ``100.0``
and ``true`` become integers, ``0`` becomes 1970-01-01); every route here takes exactly the JSON
types its schema states. The body Litestar parsed (``request.json()``, cached for the handler) is
converted once more with ``msgspec.convert(strict=True)`` before the handler runs; the failure
becomes ``400 invalid_request`` naming the field. An empty body on a route whose body is
required is answered with a message that says so. The purchase route, the hot path, reads its
body itself and decodes it once, strictly, with :func:`decode_body`.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
from litestar import Request
from litestar.exceptions import SerializationException
from litestar.handlers import HTTPRouteHandler

from service.api.problems import Problem, field_error, validation_problem

T = TypeVar("T")
_EMPTY = "A JSON object is required (Content-Type: application/json); the body was empty"


class BodySpec(msgspec.Struct, frozen=True):
    """What a handler takes as its ``data``: the type and whether a body must be sent."""

    annotation: Any
    required: bool


_SPEC_OPT = "body_spec"


def body_spec(route_handler: HTTPRouteHandler) -> BodySpec | None:
    """The ``data`` parameter of ``route_handler`` (None when it takes none), read once per handler
    and kept in its ``opt``."""
    opt = route_handler.opt
    if _SPEC_OPT not in opt:
        field = route_handler.parsed_fn_signature.parameters.get("data")
        opt[_SPEC_OPT] = None if field is None else BodySpec(field.annotation, not field.has_default)
    spec: BodySpec | None = opt[_SPEC_OPT]
    return spec


async def check_json_body(request: Request[Any, Any, Any], spec: BodySpec, body_sent: bool) -> None:
    """Raises :class:`~service.api.problems.Problem` 400 ``invalid_request`` for a missing required
    body or a body that does not strictly match ``spec.annotation``."""
    if not body_sent:
        if spec.required:
            raise field_error("body", _EMPTY)
        return
    try:
        raw = await request.json()
    except SerializationException as exc:
        raise _not_json() from exc
    _converted(raw, spec.annotation)


def _not_json() -> Problem:
    return field_error("body", "Not valid JSON")


def _converted(raw: Any, annotation: type[T]) -> T:
    """``raw`` (generic JSON) converted strictly to ``annotation``; a 400 naming the field if not."""
    try:
        value: T = msgspec.convert(raw, annotation, strict=True)
    except msgspec.ValidationError as exc:
        raise validation_problem(str(exc)) from exc
    return value


_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}


async def decode_body(request: Request[Any, Any, Any], annotation: type[T]) -> T:
    """The request's body decoded straight into ``annotation`` under the same strict rules, in one
    pass: for a hot route that reads its body itself (``opt`` ``json_body`` and
    ``request_schema``) instead of taking ``data``, which costs a generic JSON decode, Litestar's
    lenient conversion and the strict one above (about 5 µs of the purchase route's no-op,
    docs/BENCHMARKS.md).

    Raises:
        Problem: 400 ``invalid_request`` for an empty body, a body that is not JSON, or one that
            does not strictly match ``annotation`` (naming the field).
    """
    return decode_strict(await request.body(), annotation)


def decode_strict(body: bytes, annotation: type[T]) -> T:
    """:func:`decode_body`'s decode of the bytes ``body``; raises the same :class:`Problem`.

    Only a body the one pass accepts skips the two-pass path; a refused one is answered by it
    (a generic decode, then the strict conversion), so every answer is what the routes taking
    ``data`` give: a syntax error further on wins over a wrong field the typed decode met first,
    and of a key repeated only the last value counts (the typed decode checks every one)."""
    if not body:
        raise field_error("body", _EMPTY)
    decoder = _decoders.get(annotation) or _decoders.setdefault(annotation, msgspec.json.Decoder(annotation))
    try:
        value: T = decoder.decode(body)
    except msgspec.DecodeError:  # ValidationError is one too
        return _two_pass(body, annotation)
    return value


def _two_pass(body: bytes, annotation: type[T]) -> T:
    try:
        raw = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise _not_json() from exc
    return _converted(raw, annotation)
