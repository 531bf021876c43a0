"""The domain speaks the failure vocabulary only (docs/ARCHITECTURE.md, "Failure vocabulary"):
no module under ``service/domain`` names a driver's exception in an ``except`` clause or imports
a driver's exception module, and none names ``OSError`` (or its aliases and connection errors):
the adapters translate socket errors too (``service.failures``), so ``StoreFailure`` is the one
spelling of a store failure.

Read from the source with ``ast``, as the layer test reads imports, so a new ``except
RedisError`` fails here before it reaches review.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DRIVERS = ("redis", "sqlalchemy", "asyncmy", "aiormq", "aio_pika", "pamqp")
# A socket error, by any of its names. TimeoutError stays allowed: asyncio.timeout raises it.
SOCKET_ERRORS = frozenset(
    {"OSError", "IOError", "EnvironmentError", "socket.error", "ConnectionError", "ConnectionResetError"}
    | {"ConnectionRefusedError", "ConnectionAbortedError", "BrokenPipeError"}
)
EXCEPTION_MODULES = ("redis.exceptions", "sqlalchemy.exc", "asyncmy.errors", "aiormq.exceptions", "aio_pika.exceptions")


def _is_driver(module: str) -> bool:
    return module.split(".", 1)[0] in DRIVERS


def _imported(tree: ast.Module) -> dict[str, str]:
    """Local name -> where it comes from (``module.name``, or the module for ``import x``)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    first = alias.name.split(".", 1)[0]
                    names[first] = first
    return names


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (base := _dotted(node.value)) is not None:
        return f"{base}.{node.attr}"
    return None


def _caught(handler: ast.ExceptHandler) -> list[ast.expr]:
    if handler.type is None:
        return []
    if isinstance(handler.type, ast.Tuple):
        return [element.value if isinstance(element, ast.Starred) else element for element in handler.type.elts]
    return [handler.type]


def _driver_failures(source: str, where: str) -> list[str]:
    tree = ast.parse(source)
    names = _imported(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            if any(module in EXCEPTION_MODULES for module in modules):
                found.append(f"{where}:{node.lineno}: imports {node.module}")
        elif isinstance(node, ast.Import):
            found += [f"{where}:{node.lineno}: imports {a.name}" for a in node.names if a.name in EXCEPTION_MODULES]
        elif isinstance(node, ast.ExceptHandler):
            for caught in _caught(node):
                dotted = _dotted(caught)
                if dotted is None:
                    continue
                head, _, rest = dotted.partition(".")
                origin = names.get(head, head) + (f".{rest}" if rest else "")
                if origin in SOCKET_ERRORS:
                    found.append(f"{where}:{node.lineno}: except {dotted} (a socket error: catch StoreFailure)")
                elif _is_driver(origin):
                    found.append(f"{where}:{node.lineno}: except {dotted} ({origin})")
    return found


def test_the_domain_catches_no_driver_exception() -> None:
    found = [
        line
        for path in sorted((ROOT / "service" / "domain").rglob("*.py"))
        for line in _driver_failures(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    ]
    assert found == []


def test_the_check_sees_a_planted_driver_exception() -> None:
    source = (
        "from redis.exceptions import RedisError\n"
        "import sqlalchemy.exc as sa_exc\n"
        "from aiormq import exceptions\n"
        "try:\n    pass\nexcept (RedisError, OSError):\n    pass\n"
        "try:\n    pass\nexcept sa_exc.DBAPIError:\n    pass\n"
        "try:\n    pass\nexcept exceptions.AMQPError:\n    pass\n"
        "try:\n    pass\nexcept TimeoutError:\n    pass\n"
    )
    found = _driver_failures(source, "planted.py")
    assert [line.split(": ", 1)[1] for line in found] == [
        "imports redis.exceptions",
        "imports sqlalchemy.exc",
        "imports aiormq",
        "except RedisError (redis.exceptions.RedisError)",
        "except OSError (a socket error: catch StoreFailure)",
        "except sa_exc.DBAPIError (sqlalchemy.exc.DBAPIError)",
        "except exceptions.AMQPError (aiormq.exceptions.AMQPError)",
    ]
