"""The monitoring set-up of compose.yaml, offline: Prometheus's alert rules (promtool, Debian's
``prometheus`` package: check and unit tests), its config, and the Grafana dashboard, whose
queries must name the metrics the code exports (and cover every family)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from service import metrics

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "ops" / "prometheus"
GRAFANA = ROOT / "ops" / "grafana"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is missing (scripts/ensure-tools installs prometheus)"
)


def _families() -> dict[str, set[str]]:
    """Family name -> the sample names Prometheus sees for it."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    families = {}
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            name = value._name  # without the _total suffix
            families[name] = {name + suffix for suffix in suffixes[value._type]}
    return families


def _names_in(expression: str) -> set[str]:
    return set(re.findall(r"\bflashsale_[a-z_]+", expression))


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=PROMETHEUS, capture_output=True, text=True, check=False, timeout=60)


@needs_promtool
def test_the_alert_rules_are_valid_and_fire_on_their_series():
    checked = _promtool("check", "rules", "alerts.yml")
    assert checked.returncode == 0 and "SUCCESS: 4 rules found" in checked.stdout, checked.stdout + checked.stderr
    tested = _promtool("test", "rules", "alerts_test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr


@needs_promtool
def test_the_prometheus_config_is_valid():
    checked = _promtool("check", "config", "prometheus.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_alerts_cover_drift_dead_letters_lag_and_publish_failures_with_real_metrics():
    rules = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"][0]["rules"]
    exported = set().union(*_families().values())
    assert {rule["alert"] for rule in rules} == {
        "FlashsaleStockDrift",
        "FlashsaleDeadLetters",
        "FlashsaleConsumerLagGrowing",
        "FlashsalePublishFailures",
    }
    for rule in rules:
        assert _names_in(rule["expr"]) and _names_in(rule["expr"]) <= exported, rule["alert"]


def test_the_dashboard_queries_every_family_and_nothing_else():
    dashboard = json.loads((GRAFANA / "dashboards" / "flashsale.json").read_text())
    datasource = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    uid = datasource["datasources"][0]["uid"]
    families = _families()
    exported = set().union(*families.values())
    used: set[str] = set()
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == uid and panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = _names_in(target["expr"])
            assert names and names <= exported, (panel["title"], names - exported)
            used |= names
        grid = panel["gridPos"]
        mine = {
            (x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
    unused = [family for family, samples in families.items() if not samples & used]
    assert unused == []
    provider = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "flashsale.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def test_compose_runs_prometheus_and_grafana_on_the_repository_config():
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    for service, mounts in (
        ("prometheus", ["./ops/prometheus:/etc/prometheus:ro"]),
        (
            "grafana",
            [
                "./ops/grafana/provisioning:/etc/grafana/provisioning:ro",
                "./ops/grafana/dashboards:/var/lib/grafana/dashboards:ro",
            ],
        ),
    ):
        for mount in mounts:
            assert mount in services[service]["volumes"]
            assert (ROOT / mount.split(":")[0]).is_dir()
    scrape = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())["scrape_configs"]
    targets = json.dumps(scrape)
    for service in ("api:8000", "consumer", "realign:9100", "sweep:9100"):
        assert service in targets
    assert compose["x-flashsale-env"]["FLASHSALE_METRICS__PORT"] == "9100"
