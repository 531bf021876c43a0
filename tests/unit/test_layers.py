"""The import graph: edge -> composition root -> use cases -> adapters -> domain model -> base,
one way, no cycles.

Read from the source with ``ast`` (imports inside functions count too), so a new module that
imports upwards fails here before anyone has to draw the graph again. Within a layer, the
packages import one another one way too (e.g. ``service.cli`` may use ``consumers``, then
``consumers`` may not use ``service.cli``): no cycle in the graph of packages, where a module
cycle need not exist for two packages to be tangled.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("service", "consumers", "db", "lua", "toolkit")

# Lower rank = lower layer. A module may import its own layer or any layer below it.
LAYERS: list[tuple[int, tuple[str, ...]]] = [
    (5, ("service.api", "service.cli", "toolkit.sale", "toolkit.bench", "toolkit.channel", "consumers")),  # edge
    (4, ("service.bootstrap", "service.startup", "service.teardown")),  # composition root
    (3, ("service.domain",)),  # use cases and rules
    (2, ("service.adapters", "db")),  # Redis, RabbitMQ, MySQL
    (1, ("service.model",)),  # the domain's vocabulary: plain types the adapters answer in
    (0, ("service.settings", "service.log_setup", "service.runtime", "service.failures", "lua", "service")),  # base
]


def _rank(module: str) -> int:
    """The rank of the longest prefix that names ``module`` (``service.model`` before
    ``service.domain``, ``service.domain`` before ``service``)."""
    matches = [
        (len(prefix), rank)
        for rank, prefixes in LAYERS
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    if not matches:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS")
    return max(matches)[1]


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


def _package(module: str) -> str:
    """The node of ``module`` in the package graph: the longest prefix of :data:`LAYERS` that it
    is or lies under (``service.cli.main`` -> ``service.cli``), else the module itself (a base
    module such as ``service.metrics``, caught only by the catch-all ``service``)."""
    prefixes = [p for _, group in LAYERS for p in group if p != "service"]
    found = [p for p in prefixes if module == p or module.startswith(p + ".")]
    return max(found, key=len) if found else module


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` (module -> modules it imports) collapsed to packages (:func:`_package`); a
    package's imports of itself are left out."""
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        node = _package(module)
        packages.setdefault(node, set()).update(_package(t) for t in targets)
        packages[node].discard(node)
    for targets in list(packages.values()):
        for target in targets:
            packages.setdefault(target, set())
    return packages


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle a depth-first walk of ``graph`` meets, each as ``[a, b, ..., a]``."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    found: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                found.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_imports_flow_downwards_only() -> None:
    upward = [
        f"{module} -> {target}"
        for module, targets in _graph().items()
        for target in targets
        if _rank(target) > _rank(module)
    ]
    assert upward == []


def test_the_channel_simulator_is_an_outside_party() -> None:
    """``toolkit.channel`` (the payment channel simulator) knows the service only by its settings
    (the channels' secrets) and its HTTP contract: no domain, adapter, db or composition root. It
    logs as every process does (``service.log_setup``, which imports nothing of the service)."""
    graph = _graph()
    foreign = [
        (m, t)
        for m, ts in graph.items()
        if m.startswith("toolkit.channel")
        for t in ts
        if not (t.startswith("toolkit.channel") or t in ("service.settings", "service.log_setup"))
    ]
    assert graph["service.log_setup"] == set()
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
    assert cycles(_graph()) == []


def test_no_cycles_between_packages() -> None:
    """Upward imports are refused above, so a package cycle can only join packages of one
    layer: e.g. ``service.cli`` <-> ``consumers``, ``service.cli`` <-> ``toolkit.bench``."""
    assert cycles(package_graph(_graph())) == []


def test_a_planted_same_layer_package_cycle_is_caught() -> None:
    """Two edge packages tangled through different modules: no module cycle, one package cycle."""
    planted = {
        "service.cli.main": {"consumers.realign"},  # the CLI runs the realign job
        "consumers.realign": {"service.cli.render", "service.settings"},  # which prints with the CLI's helper
        "service.cli.render": {"service.domain.stock.realign"},
        "service.domain.stock.realign": set(),
        "service.settings": set(),
    }
    assert cycles(planted) == []
    packages = package_graph(planted)
    assert packages["service.cli"] == {"consumers", "service.domain"}
    assert packages["consumers"] == {"service.cli", "service.settings"}
    assert cycles(packages) == [["consumers", "service.cli", "consumers"]]
    del planted["consumers.realign"]  # and without the way back, none
    assert cycles(package_graph(planted)) == []


def test_tests_never_import_tools() -> None:
    """``tools/`` holds one-off experiments, not shipped and not kept for the tests: what a test
    needs lives in ``tests/`` (e.g. ``tests/redis_cluster.py``), and tools may import from there."""
    found = []
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            found += [(path.relative_to(ROOT).as_posix(), n) for n in names if n == "tools" or n.startswith("tools.")]
    assert found == []
