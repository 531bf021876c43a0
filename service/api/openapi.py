"""The OpenAPI document tells what the server does: every error response, security, bodies.

Litestar documents a handler's success response and a 400 in its own ``{status_code, detail,
extra}`` shape; every real error here is ``application/problem+json`` with a ``code``
(``service/api/problems.py``). :func:`document_contract` walks the app's routes once, when the
app is built, and for each operation:

- lists every error it can answer, per status, with the ``code`` values of that status: the
  codes the handler declares (``opt=problems(...)``), plus those every route of its kind can
  answer: ``400 invalid_request`` (parameters or a body), ``404 not_found`` (an integer path
  parameter the router cannot match), ``401 unauthorized`` (a token is needed), ``403 forbidden``
  (the admin guard), ``415 unsupported_media_type`` (a JSON body), ``503 unavailable`` (it
  uses the stores);
- states security only where a token is needed (health, product info and the payment
  notification need none);
- documents a body the handler reads itself (``opt={"request_schema": Struct}``).

A route added later gets the generic part without doing anything; its own codes it declares.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Litestar
from litestar.openapi.spec import (
    Components,
    OpenAPIHeader,
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    Reference,
    RequestBody,
    Schema,
    SecurityScheme,
)
from litestar.routes import HTTPRoute

from service.api.auth import BEARER_CHALLENGE, admin_only, requires_token
from service.api.body import body_spec
from service.api.media import JSON_BODY_OPT
from service.api.problems import PROBLEM_MEDIA_TYPE, STATUS_BY_CODE, TITLES
from service.api.providers import SERVICES
from service.failures import UNAVAILABLE

PROBLEMS_OPT = "problems"
REQUEST_SCHEMA_OPT = "request_schema"
SECURITY_SCHEME = "BearerToken"
_BEARER = SecurityScheme(
    type="http",
    scheme="Bearer",
    name="Authorization",
    bearer_format="JWT",
    description="An HS256 JWT: sub is the user id, role admin marks admins (service/api/auth.py).",
)


def problems(*codes: str) -> dict[str, tuple[str, ...]]:
    """``opt`` of a handler that can answer these domain ``codes`` (see ``STATUS_BY_CODE``)."""
    unknown = [code for code in codes if code not in STATUS_BY_CODE]
    if unknown:
        raise ValueError(f"codes without a status in STATUS_BY_CODE: {unknown}")
    return {PROBLEMS_OPT: codes}


_PROBLEM = Schema(
    type=OpenAPIType.OBJECT,
    required=["type", "title", "status", "detail", "code"],
    properties={
        "type": Schema(type=OpenAPIType.STRING),
        "title": Schema(type=OpenAPIType.STRING),
        "status": Schema(type=OpenAPIType.INTEGER),
        "detail": Schema(type=OpenAPIType.STRING),
        "code": Schema(type=OpenAPIType.STRING),
        "queue": Schema(type=OpenAPIType.STRING, description="admission_required: the waiting room to join"),
        "errors": Schema(
            type=OpenAPIType.ARRAY,
            items=Schema(
                type=OpenAPIType.OBJECT,
                required=["field", "message"],
                properties={"field": Schema(type=OpenAPIType.STRING), "message": Schema(type=OpenAPIType.STRING)},
            ),
        ),
    },
    description="RFC 9457 problem details with a stable machine-readable code.",
)
_RETRY_AFTER = OpenAPIHeader(schema=Schema(type=OpenAPIType.STRING), description="Seconds to wait before retrying.")
_WWW_AUTHENTICATE = OpenAPIHeader(
    schema=Schema(type=OpenAPIType.STRING), required=True, description=f"RFC 6750 challenge, e.g. {BEARER_CHALLENGE}."
)


def _json_schema(value: dict[str, Any]) -> Schema:
    """The subset of JSON Schema ``msgspec.json.schema`` emits for flat structs, as a Litestar Schema."""
    names = {
        "type": "type",
        "pattern": "pattern",
        "minLength": "min_length",
        "maxLength": "max_length",
        "minimum": "minimum",
        "maximum": "maximum",
        "enum": "enum",
        "required": "required",
        "title": "title",
        "description": "description",
        "format": "format",
    }
    fields: dict[str, Any] = {names[key]: item for key, item in value.items() if key in names}
    if isinstance(fields.get("type"), str):
        fields["type"] = OpenAPIType(fields["type"])
    if "properties" in value:
        fields["properties"] = {name: _json_schema(sub) for name, sub in value["properties"].items()}
    return Schema(**fields)


def _request_body(struct: type[msgspec.Struct]) -> RequestBody:
    generated = msgspec.json.schema(struct)
    schema = generated["$defs"][struct.__name__] if "$defs" in generated else generated
    return RequestBody(content={"application/json": OpenAPIMediaType(schema=_json_schema(schema))}, required=True)


def _codes(route: HTTPRoute, handler: Any, operation: Operation, secured: bool) -> dict[int, list[str]]:
    by_status: dict[int, list[str]] = {}

    def add(status: int, code: str) -> None:
        if code not in by_status.setdefault(status, []):
            by_status[status].append(code)

    takes_json = body_spec(handler) is not None or bool(handler.opt.get(JSON_BODY_OPT))
    if operation.parameters or takes_json:
        add(400, "invalid_request")
    if any(parameter.type is int for parameter in route.path_parameters.values()):
        add(404, "not_found")
    if secured:
        add(401, "unauthorized")
    if admin_only in handler.resolve_guards():
        add(403, "forbidden")
    if takes_json:
        add(415, "unsupported_media_type")
    if not SERVICES.isdisjoint(handler.parsed_fn_signature.parameters):  # 503 while the worker connects
        add(503, UNAVAILABLE)
    for code in handler.opt.get(PROBLEMS_OPT, ()):
        add(STATUS_BY_CODE[code], code)
    return by_status


def _problem_response(status: int, codes: list[str]) -> OpenAPIResponse:
    headers: dict[str, OpenAPIHeader | Reference] = {}
    if status == 401:
        headers["WWW-Authenticate"] = _WWW_AUTHENTICATE
    if status in (429, 503):
        headers["Retry-After"] = _RETRY_AFTER
    schema = Schema(
        all_of=[Reference(ref="#/components/schemas/Problem")],
        properties={
            "status": Schema(type=OpenAPIType.INTEGER, const=status),
            "code": Schema(type=OpenAPIType.STRING, enum=codes),
        },
    )
    return OpenAPIResponse(
        description=f"{TITLES.get(status, 'Error')}: {', '.join(codes)}",
        headers=headers or None,
        content={PROBLEM_MEDIA_TYPE: OpenAPIMediaType(schema=schema)},
    )


def document_contract(app: Litestar) -> None:
    """Complete ``app``'s OpenAPI document (see the module): problem responses per status with
    their codes, per-operation security, bodies read by the handler itself. Call once, after the
    app is built and before it serves."""
    openapi = app.openapi_schema
    components = openapi.components if isinstance(openapi.components, Components) else Components()
    components.schemas = {**(components.schemas or {}), "Problem": _PROBLEM}
    components.security_schemes = {**(components.security_schemes or {}), SECURITY_SCHEME: _BEARER}
    openapi.components = components
    openapi.security = None
    for route in app.routes:
        if not isinstance(route, HTTPRoute) or openapi.paths is None or route.path_format not in openapi.paths:
            continue
        path_item = openapi.paths[route.path_format]
        for method, (handler, _) in route.route_handler_map.items():
            operation = getattr(path_item, method.lower(), None)
            if not isinstance(operation, Operation):
                continue
            secured = requires_token(handler, route.path)
            operation.security = [{SECURITY_SCHEME: []}] if secured else []
            if (struct := handler.opt.get(REQUEST_SCHEMA_OPT)) is not None:
                operation.request_body = _request_body(struct)
            declared = {int(status) for status in (handler.responses or {})}
            responses = {
                status: response
                for status, response in (operation.responses or {}).items()
                if int(status) < 400 or int(status) in declared
            }
            for status, codes in sorted(_codes(route, handler, operation, secured).items()):
                if status not in declared:
                    responses[str(status)] = _problem_response(status, codes)
            operation.responses = responses
