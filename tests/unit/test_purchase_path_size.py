"""The purchase path reads as a recipe (docs/ARCHITECTURE.md, "Purchase path"): no function in it
is over 60 lines, docstring included, so each step fits on a screen."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PURCHASE_PATH = [
    *sorted((ROOT / "service" / "domain" / "purchase").glob("*.py")),
    ROOT / "service" / "api" / "controllers" / "orders.py",
    ROOT / "service" / "adapters" / "redis" / "reservations.py",
]
MAX_LINES = 60


def long_functions(source: str, where: str, limit: int = MAX_LINES) -> list[str]:
    """``where:line name (n lines)`` for each function of ``source`` longer than ``limit``."""
    return [
        f"{where}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > limit
    ]


def test_no_function_of_the_purchase_path_is_over_60_lines() -> None:
    found = [
        line
        for path in PURCHASE_PATH
        for line in long_functions(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    ]
    assert found == []


def test_the_check_sees_a_long_function() -> None:
    body = "".join(f"    x{n} = {n}\n" for n in range(60))
    assert long_functions(f"def short():\n    pass\n\nasync def long():\n{body}", "planted.py") == [
        "planted.py:4 long (61 lines)"
    ]
