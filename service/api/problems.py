"""Errors as RFC 9457 problem details (``application/problem+json``) with a stable ``code``.

Every error body has ``type``, ``title``, ``status``, ``detail`` and ``code``; validation errors
add ``errors``: a list of ``{"field", "message"}``.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import msgspec
import structlog
from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.plugins.problem_details import (
    ProblemDetailsConfig,
    ProblemDetailsException,
    ProblemDetailsPlugin,
)
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR
from litestar.types import ExceptionHandlersMap
from redis.exceptions import RedisError
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from service.domain.errors import DomainError, InvalidInput
from service.failures import UNAVAILABLE, UNAVAILABLE_RETRY_AFTER, StoreFailure, is_unavailable

log = structlog.get_logger(__name__)

PROBLEM_MEDIA_TYPE = "application/problem+json"
TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Payload Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
    428: "Precondition Required",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
_GENERIC_CODES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "too_many_requests",
    503: UNAVAILABLE,
}


class Problem(ProblemDetailsException):
    """An API error: HTTP ``status``, stable machine ``code``, human ``detail`` (RFC 9457)."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        errors: list[dict[str, str]] | None = None,
    ) -> None:
        extra: dict[str, Any] = {"code": code}
        if errors:
            extra["errors"] = errors
        super().__init__(
            detail=detail,
            status_code=status,
            headers=headers,
            extra=extra,
            type_=f"https://flashsale.dev/problems/{code}",
            title=TITLES.get(status, "Error"),
        )


def field_error(field: str, message: str, code: str = "invalid_request") -> Problem:
    """400 naming the offending field."""
    return Problem(400, code, f"{field}: {message}", errors=[{"field": field, "message": message}])


_FIELD_IN_MESSAGE = re.compile(r"(?:at `\$\.([A-Za-z_][\w.]*)`|field `([A-Za-z_]\w*)`)")


def _field_of(item: dict[str, Any]) -> str:
    """The offending field: msgspec names it in the message (``at `$.quantity```, ``field `x```)."""
    if match := _FIELD_IN_MESSAGE.search(str(item.get("message", ""))):
        return match.group(1) or match.group(2)
    key = item.get("key")
    return "body" if key in (None, "data") else str(key)


def validation_problem(message: str) -> Problem:
    """400 ``invalid_request`` from a msgspec validation message (``Expected `int`, got `str` - at
    `$.stock```), naming the field it points at."""
    field = _field_of({"message": message})
    text = message.rsplit(" - at `", 1)[0]
    return field_error(field, text)


def _from_http_exception(exc: HTTPException) -> ProblemDetailsException:
    status = exc.status_code
    if isinstance(exc, ValidationException):
        errors = [
            {"field": _field_of(item), "message": str(item.get("message", ""))}
            for item in (exc.extra if isinstance(exc.extra, list) else [])
            if isinstance(item, dict)
        ]
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors) or str(exc.detail)
        return Problem(400, "invalid_request", detail, errors=errors or None)
    if status >= 500:
        return Problem(status, "internal_error", "Internal server error.")
    headers = exc.headers
    if status == 401 and not (headers and "WWW-Authenticate" in headers):
        headers = {**(headers or {}), "WWW-Authenticate": 'Bearer realm="flashsale"'}  # RFC 9110 section 15.5.2
    return Problem(status, _GENERIC_CODES.get(status, "error"), str(exc.detail), headers=headers)


SIGNATURE_CHALLENGE = 'X-Signature realm="flashsale-payments", algorithm="HMAC-SHA256"'
"""``WWW-Authenticate`` of a 401 from a domain check: the payment notification's signature."""

STATUS_BY_CODE = {
    "invalid_request": 400,
    "invalid_idempotency_key": 400,
    "invalid_order_no": 400,
    "invalid_signature": 401,
    "product_not_found": 404,
    "order_not_found": 404,
    "not_in_queue": 404,
    "sold_out": 409,
    "limit_exceeded": 409,
    "sale_not_active": 409,
    "request_in_progress": 409,
    "order_not_cancellable": 409,
    "order_not_refundable": 409,
    "channel_txn_reused": 409,
    "token_invalid": 409,
    "order_queued": 409,
    "payment_in_progress": 409,
    "order_not_payable": 409,
    "refund_refused": 409,
    "waiting_room_off": 409,
    "channel_unavailable": 503,
    "idempotency_key_reused": 422,
    "token_required": 428,
    "admission_required": 428,
    "too_many_requests": 429,
    UNAVAILABLE: 503,
}
"""The one place where a domain error's ``code`` becomes an HTTP status (docs/API.md)."""


def problem_response(exc: DomainError, queue: str | None = None) -> Response[Any]:
    """A :class:`DomainError` as an RFC 9457 problem+json response: status by ``code``,
    ``Retry-After`` when the condition is transient, ``errors`` naming the field of an
    :class:`InvalidInput`, and ``queue``, when given, the URL of the waiting room to join
    (``admission_required``).

    The encoded body is cached per distinct error (a stampede's rejections are a handful of
    distinct bodies), so the sold-out answer costs no JSON encoding.

    Raises:
        KeyError: ``exc.code`` has no status in :data:`STATUS_BY_CODE` (a programming error).
    """
    field = exc.input_field if isinstance(exc, InvalidInput) else None
    message = exc.message if isinstance(exc, InvalidInput) else None
    status, body, headers = _encoded_problem(exc.code, exc.detail, exc.retry_after, field, message, queue)
    return Response(body, status_code=status, media_type=_PROBLEM_JSON, headers=headers)


_PROBLEM_JSON = "application/problem+json"


@functools.lru_cache(maxsize=1024)
def _encoded_problem(
    code: str, detail: str, retry_after: int | None, field: str | None, message: str | None, queue: str | None = None
) -> tuple[int, bytes, dict[str, str] | None]:
    status = STATUS_BY_CODE[code]
    problem = Problem(status, code, detail)
    body: dict[str, Any] = {
        "status": status,
        "type": problem.type_,
        "title": problem.title,
        "detail": detail,
        "code": code,
    }
    if field is not None and message is not None:
        body["errors"] = [{"field": field, "message": message}]
    if queue is not None:
        body["queue"] = queue
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    if status == 401:  # RFC 9110 section 15.5.2: a 401 names how to authenticate
        headers = {**(headers or {}), "WWW-Authenticate": SIGNATURE_CHALLENGE}
    return status, msgspec.json.encode(body), headers


def _domain_error(request: Request[Any, Any, Any], exc: DomainError) -> Response[Any]:
    """The exception handler for :class:`DomainError` (:func:`problem_response`). A code without
    a status is a programming error: 500, logged. An ``unavailable`` is logged with its cause,
    one line a second per cause (:class:`service.log_setup.StormThrottle`), so every stretch of
    ``503`` says why while it lasts."""
    if exc.code not in STATUS_BY_CODE:
        return _unexpected(request, exc)
    if exc.code == UNAVAILABLE:
        log.warning("unavailable_answered", path=request.url.path, cause=exc.detail, error=repr(_root(exc)))
    return problem_response(exc)


def _root(exc: BaseException) -> BaseException | None:
    """The first error of ``exc``'s chain of causes (None when it has none)."""
    cause = exc.__cause__
    while cause is not None and cause.__cause__ is not None:
        cause = cause.__cause__
    return cause


def _store_error(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """A store that did not answer outside the purchase path (a read on a lost MySQL or Redis,
    :func:`service.failures.is_unavailable`): 503 ``unavailable`` with ``Retry-After``, logged
    once per request; anything else is a 500. The driver errors are listed too: a store's
    client used without its adapter raises them (docs/ARCHITECTURE.md, "Failure vocabulary")."""
    if is_unavailable(exc):
        log.warning("store_unavailable", path=request.url.path, error=str(exc).splitlines()[0][:200])
        return Problem(
            503,
            UNAVAILABLE,
            "A store did not answer; retry shortly.",
            headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER)},
        ).to_response(request)
    return _unexpected(request, exc)


def _too_deep(request: Request[Any, Any, Any], exc: RecursionError) -> Response[Any]:
    """msgspec gives up on absurdly nested JSON with RecursionError: that is bad input."""
    return field_error("body", "JSON nested too deeply").to_response(request)


def _unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    log.exception("unhandled_error", path=request.url.path, error=repr(exc))
    return Problem(HTTP_500_INTERNAL_SERVER_ERROR, "internal_error", "Internal server error.").to_response(request)


def problem_details_plugin() -> ProblemDetailsPlugin:
    """Litestar's problem-details plugin, with every HTTP error mapped to a coded problem."""
    return ProblemDetailsPlugin(
        ProblemDetailsConfig(exception_to_problem_detail_map={HTTPException: _from_http_exception})
    )


ERROR_HANDLERS: ExceptionHandlersMap = {
    DomainError: _domain_error,
    RecursionError: _too_deep,
    StoreFailure: _store_error,
    DBAPIError: _store_error,
    PoolTimeoutError: _store_error,
    RedisError: _store_error,
    Exception: _unexpected,
}
"""Exception handlers of the app: domain errors, too-deep JSON, anything unexpected (500, logged)."""
