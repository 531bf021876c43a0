"""pyproject's dependencies have floors and major upper bounds; requirements.lock pins every one
of them within its range; the Docker image installs from the lock."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _lock() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"not an exact pin: {line}"
            pins[canonicalize_name(name)] = version.strip()
    return pins


def test_every_dependency_has_a_floor_and_a_major_upper_bound():
    project = _project()
    requirements = [
        *project["dependencies"],
        *(r for extra in project["optional-dependencies"].values() for r in extra),
    ]
    for text in requirements:
        operators = {spec.operator for spec in Requirement(text).specifier}
        assert ">=" in operators and "<" in operators, text


def test_the_lock_pins_every_runtime_dependency_inside_its_range():
    pins = _lock()
    for text in _project()["dependencies"]:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} missing from requirements.lock"
        assert requirement.specifier.contains(pins[name]), (text, pins[name])
    assert "pydantic" in {canonicalize_name(Requirement(t).name) for t in _project()["dependencies"]}


def test_matplotlib_is_the_charts_extra_not_a_runtime_dependency():
    """Only ``flashsale sale --report`` draws charts: the API's image does not carry matplotlib;
    the test extra has it, for the sale's tests check the charts."""
    project = _project()
    names = {
        extra: {canonicalize_name(Requirement(t).name) for t in reqs}
        for extra, reqs in project["optional-dependencies"].items()
    }
    assert "matplotlib" not in {canonicalize_name(Requirement(t).name) for t in project["dependencies"]}
    assert "matplotlib" in names["charts"] and "matplotlib" in names["test"]
    assert "matplotlib" not in _lock()


def test_the_docker_image_installs_the_lock():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "-r requirements.lock" in dockerfile and "--no-deps ." in dockerfile
