"""``flashsale sale --waiting-room`` end to end on the real services: a small crowd through the
waiting room holds the invariants of every sale and the room's four; the same crowd without the
room (``--crowd``, same ``--seed``) reports the same fairness figures (the figures themselves:
tests/unit/test_sale_fairness.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SEED = "wr-sale-test"
STOCK = 50
BUYERS = 200


def _sale(*mode: str) -> dict:
    argv = [str(Path(sys.executable).with_name("flashsale")), "sale", "--json", *mode, "--seed", SEED]
    argv += ["--stock", str(STOCK), "--users", str(BUYERS)]
    result = subprocess.run([*argv, "--consumers", "1"], check=False, capture_output=True, text=True, timeout=400)
    assert result.stdout, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def through_the_room() -> dict:
    return _sale("--waiting-room")


def test_a_crowd_through_the_waiting_room_holds_every_invariant(through_the_room):
    report = through_the_room
    failed = {name: check for name, check in report["invariants"].items() if not check["ok"]}
    assert report["ok"] is True, failed
    assert len(report["invariants"]) == 13  # the trail's, the five of every sale and the room's seven
    assert report["realignment"]["mysql_sold"] == STOCK
    fair = report["fairness"]
    assert fair["waiting_room"] is True and fair["buyers"] == BUYERS
    assert fair["units"] == STOCK and fair["buyers_with_units"] == STOCK and fair["max_units_one_buyer"] == 1
    assert fair["buyers_by_behaviour"] == {"honest": 120, "impatient": 40, "scripted": 40}
    # the scripts' purchases without an admission were all refused, and they were sent
    admissions = report["invariants"]["no_purchase_without_admission"]
    assert admissions["accepted_without_admission"] == 0
    assert admissions["purchases_sent_without_admission"].get("admission_required", 0) > 0
    refused = {"admission_required", "sale_not_active", "sold_out", "too_many_requests"}  # before the opening
    assert set(admissions["purchases_sent_without_admission"]) <= refused
    once = report["invariants"]["admitted_once_at_a_time"]
    assert once["joins"] > BUYERS  # the scripts joined many times, each with one ticket
    told = report["invariants"]["sold_out_told_in_time"]
    assert told["sold_out"] is True and told["never_told"] == 0
    assert told["last_told_after_seconds"] <= told["bound_seconds"]


def test_the_same_crowd_without_the_room_reports_the_same_figures(through_the_room):
    report = _sale("--crowd")
    assert report["run"]["crowd_seed"] == through_the_room["run"]["crowd_seed"] == SEED
    assert report["ok"] is True, report["invariants"]
    assert len(report["invariants"]) == 6  # no room, no room invariants
    fair = report["fairness"]
    assert fair["waiting_room"] is False
    assert fair["buyers_by_behaviour"] == through_the_room["fairness"]["buyers_by_behaviour"]
    assert set(fair) == set(through_the_room["fairness"])
    assert fair["units"] == STOCK
