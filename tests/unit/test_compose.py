"""compose.yaml stays valid for people with Docker (checked offline against the Compose spec)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_compose_file_matches_the_compose_spec():
    check = Path(sys.executable).with_name("check-jsonschema")
    result = subprocess.run(
        [str(check), "--builtin-schema", "vendor.compose-spec", str(ROOT / "compose.yaml")],
        check=False,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_runs_every_deployable():
    text = (ROOT / "compose.yaml").read_text()
    for command in (
        '"flashsale", "migrate"',
        '"flashsale", "serve"',
        '"flashsale", "consume"',
        '"flashsale", "realign"',
        '"flashsale", "sweep"',
        '"flashsale", "channel", "serve"',
    ):
        assert command in text


def test_compose_has_no_secret_and_reads_the_env_file_the_readme_names():
    import yaml

    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    text = (ROOT / "compose.yaml").read_text()
    assert "SECRET" not in "".join(f"{k}={v}" for k, v in compose["x-flashsale-env"].items())
    for name, service in compose["services"].items():
        if service.get("build"):
            assert service["env_file"] == ["flashsale.env"], name
    assert "dev-only" not in text and "change-me" not in text
    readme = (ROOT / "README.md").read_text()
    assert "flashsale.env" in readme and "FLASHSALE_ENV" in readme


def test_the_api_has_a_healthcheck_on_readiness():
    import yaml

    api = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]["api"]
    assert "/api/v1/health/ready" in " ".join(api["healthcheck"]["test"])


def test_every_long_running_process_is_restarted():
    """granian exits when a worker crashes twice within ~5 s (its crash-loop guard, no setting):
    the supervisor brings the API back, and the consumers and jobs the same way."""
    import yaml

    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    for name in ("api", "consumer", "realign", "sweep", "channel"):
        assert services[name].get("restart") == "unless-stopped", name
    assert services["migrate"]["restart"] == "no"
