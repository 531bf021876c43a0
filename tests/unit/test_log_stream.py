"""Logging writes to the stderr of the moment: a stream swapped out and closed after
configure_logging never turns a log call into an exception (service/log_setup.py)."""

from __future__ import annotations

import io
import logging
import sys

import pytest
import structlog

from service.log_setup import configure_logging


def test_a_log_call_after_stderr_was_swapped_and_closed_writes_to_the_new_one(monkeypatch: pytest.MonkeyPatch) -> None:
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure_logging("INFO")
    first.close()
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    structlog.get_logger("t").warning("after_swap", cause="test")
    logging.getLogger("t.std").warning("std_after_swap")
    assert '"event": "after_swap"' in second.getvalue()
    assert "std_after_swap" in second.getvalue()
