"""Every repository path a tracked ``.py``, ``.lua`` or ``.md`` file names exists: a path that
starts at a top-level folder of the repository (``service/domain/stock/realign.py``,
``tests/integration/cluster/``) and, in Markdown, a relative link (``[x](TESTING.md#faults)``).
A file moved without its mentions fails here (the code map in docs/ARCHITECTURE.md, the headers
of the Lua scripts, the runbooks). ``tests/support.own_queues`` (a module and a name in it)
counts when the module exists.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = (".py", ".lua", ".md")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _tracked() -> list[str]:
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [name for name in listed.split("\0") if name]


def _path_pattern(tops: Iterable[str]) -> re.Pattern[str]:
    """A path that starts at one of the top-level folders ``tops``, not inside a longer word or
    path (``.venv/lib/service/...``, ``https://.../service/...``), ending in a name or ``/``."""
    alternatives = "|".join(re.escape(top) for top in sorted(tops, key=len, reverse=True))
    return re.compile(rf"(?<![\w./:-])((?:{alternatives})/[\w./-]*[\w/])")


def _exists(root: Path, ref: str) -> bool:
    if (root / ref).exists():
        return True
    folder, _, name = ref.rpartition("/")
    module = name.split(".", 1)[0]  # tests/support.own_queues: a name in tests/support.py
    return module != name and (root / folder / f"{module}.py").exists()


def stale_references(root: Path, files: Iterable[str], tops: Iterable[str]) -> list[str]:
    """``file:line: path`` for each repository path ``files`` name that does not exist under ``root``."""
    pattern = _path_pattern(tops)
    found = []
    for name in files:
        if not name.endswith(SCANNED):
            continue
        text = (root / name).read_text(encoding="utf-8")
        refs = [(match.start(), match.group(1).rstrip(".")) for match in pattern.finditer(text)]
        if name.endswith(".md"):
            for match in _LINK.finditer(text):
                target = match.group(1).split("#", 1)[0]
                if target and "://" not in target and not target.startswith("mailto:"):
                    resolved = (root / name).parent.joinpath(target).resolve()
                    refs.append((match.start(), str(resolved.relative_to(root.resolve()))))
        for start, ref in refs:
            if any(mark in ref for mark in "*<>{}$") or _exists(root, ref):
                continue  # a glob or a placeholder (tests/integration/<feature>/) names no one file
            found.append(f"{name}:{text.count(chr(10), 0, start) + 1}: {ref}")
    return found


def _tops(files: Iterable[str]) -> set[str]:
    return {name.split("/", 1)[0] for name in files if "/" in name}


def test_every_named_repository_path_exists() -> None:
    files = _tracked()
    this = str(Path(__file__).resolve().relative_to(ROOT))  # its planted paths are missing on purpose
    assert stale_references(ROOT, [name for name in files if name != this], _tops(files)) == []


def test_the_check_catches_a_planted_reference(tmp_path: Path) -> None:
    (tmp_path / "service" / "domain").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    (tmp_path / "service" / "domain" / "sold_out.py").write_text('"""See docs/GUIDE.md."""\n')
    (tmp_path / "docs" / "GUIDE.md").write_text(
        "Kept in `service/domain/sold_out.py` and `service/domain/sold_out.attribute`.\n"
        "Moved: `service/domain/realign.py`, [the guide](MISSING.md#top), [here](GUIDE.md).\n"
        "Not paths: https://example.com/service/x.py, tests/integration/<feature>/, [web](https://x.org).\n"
    )
    (tmp_path / "reserve.lua").write_text("-- the bucket (service/domain/buckets.py)\n")
    files = ["service/domain/sold_out.py", "docs/GUIDE.md", "reserve.lua"]
    assert stale_references(tmp_path, files, _tops(files)) == [
        "docs/GUIDE.md:2: service/domain/realign.py",
        "docs/GUIDE.md:2: docs/MISSING.md",
        "reserve.lua:1: service/domain/buckets.py",
    ]
