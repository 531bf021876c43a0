"""scripts/ensure-tools --dry-run says what it would install, or that all is present, and changes
nothing. The script runs with a PATH of its own: stubs for the tools it looks for and an apt-get
that records its calls."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "ensure-tools"
BASH = shutil.which("bash") or "/bin/bash"
TOOLS = ("wrk", "chromium", "promtool", "shellcheck", "faketime", "nft", "socat")


def _run(bin_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": str(bin_dir), "STUB_LOG": str(bin_dir / "calls.log")}
    return subprocess.run([BASH, str(SCRIPT), *args], env=env, capture_output=True, text=True, check=False)


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    """A PATH with ``id`` and a recording ``apt-get``, none of the tools."""
    (tmp_path / "id").symlink_to(shutil.which("id") or "/usr/bin/id")
    apt_get = tmp_path / "apt-get"
    apt_get.write_text('#!/bin/sh\necho "apt-get $*" >> "$STUB_LOG"\n')
    apt_get.chmod(0o755)
    return tmp_path


def test_dry_run_with_every_tool_present_says_so(bin_dir: Path) -> None:
    for tool in TOOLS:
        (bin_dir / tool).symlink_to(bin_dir / "apt-get")
    done = _run(bin_dir, "--dry-run")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ensure-tools: all present (wrk chromium promtool shellcheck faketime nft socat)\n"
    assert not (bin_dir / "calls.log").exists()


def test_dry_run_lists_what_it_would_install_and_installs_nothing(bin_dir: Path) -> None:
    (bin_dir / "wrk").symlink_to(bin_dir / "apt-get")
    done = _run(bin_dir, "--dry-run")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "ensure-tools: dry run, would install chromium prometheus shellcheck faketime nftables socat:"
    packages = "chromium prometheus shellcheck faketime nftables socat"
    install = f"env DEBIAN_FRONTEND=noninteractive apt-get install -y -q {packages}"
    assert lines[-1].endswith(install)
    assert not (bin_dir / "calls.log").exists()


def test_an_unknown_option_is_a_usage_error(bin_dir: Path) -> None:
    done = _run(bin_dir, "--dryrun")
    assert done.returncode == 64 and "usage:" in done.stderr
