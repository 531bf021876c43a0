"""The import graph: edge -> composition root -> use cases -> adapters -> base, one way, no cycles.

Read from the source with ``ast`` (imports inside functions count too), so a new module that
imports upwards fails here before anyone has to draw the graph again.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("service", "consumers", "db", "lua")

# Lower rank = lower layer. A module may import its own layer or any layer below it.
LAYERS: list[tuple[int, tuple[str, ...]]] = [
    (4, ("service.api", "service.cli", "service.sale", "service.bench", "service.channel", "consumers")),  # edge
    (3, ("service.bootstrap", "service.startup")),  # composition root
    (2, ("service.domain",)),  # use cases and rules
    (1, ("service.adapters", "db")),  # Redis, RabbitMQ, MySQL
    (0, ("service.settings", "service.log_setup", "service.runtime", "service.failures", "lua", "service")),  # base
]


def _rank(module: str) -> int:
    for rank, prefixes in LAYERS:
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _graph() -> dict[str, set[str]]:
    modules = {
        _module_name(path): path
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if "migrations" not in path.parts
    }
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
                imported.update(n if n in modules else node.module for n in names)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
        graph[name] = {m for m in imported if m in modules and m != name}
    return graph


def test_imports_flow_downwards_only() -> None:
    upward = [
        f"{module} -> {target}"
        for module, targets in _graph().items()
        for target in targets
        if _rank(target) > _rank(module)
    ]
    assert upward == []


def test_the_channel_simulator_is_an_outside_party() -> None:
    """``service.channel`` (the payment channel simulator) knows the service only by its settings
    (the channels' secrets) and its HTTP contract: no domain, adapter, db or composition root."""
    foreign = [
        (m, t)
        for m, ts in _graph().items()
        if m.startswith("service.channel")
        for t in ts
        if not (t.startswith("service.channel") or t == "service.settings")
    ]
    assert foreign == []


def test_db_never_reads_the_service_settings() -> None:
    """``db`` knows of the service only the failure vocabulary it translates MySQL's errors into
    (``service.failures``, a base module that imports nothing of the service)."""
    graph = _graph()
    assert [(m, t) for m, ts in graph.items() if m.startswith("db") for t in ts if t.startswith("service")] == [
        ("db.engine", "service.failures")
    ]
    assert graph["service.failures"] == set()


def test_no_import_cycles() -> None:
    graph = _graph()
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                cycles.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == []
