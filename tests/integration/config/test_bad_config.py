"""Bad configuration ends in one clear line: the variable, what is wrong; exit code 2, no
traceback (``--debug`` shows it). ``serve`` and ``consume`` ask their stores once at start: wrong
credentials end them so; a store that is merely down does not (they wait for it:
tests/integration/availability/test_start_while_down.py). A running API answers a read on a lost
MySQL with 503, not 500."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from service.api.app import create_app
from service.environment_errors import ConfigError
from service.settings import DEV_CHANNEL_SECRETS, DEV_JWT_SECRET
from tests.support import serving
from toolkit.sale.isolation import environment, free_port

pytestmark = pytest.mark.slow  # starts CLI processes

FLASHSALE = str(Path(sys.executable).with_name("flashsale"))


def _closed_port() -> int:
    return free_port()  # nothing listens there


def _run(settings, args: list[str], **overrides: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHSALE_")}
    env.update(environment(settings))
    env.update(overrides)
    return subprocess.run([FLASHSALE, *args], env=env, capture_output=True, text=True, timeout=60, check=False)


def _assert_one_line(result: subprocess.CompletedProcess[str], variable: str, *words: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("flashsale: configuration error: ")
    assert variable in lines[0], lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    assert "Traceback" not in result.stderr


COMMANDS = [["migrate"], ["product", "set", "5", "--stock", "1"], ["realign"], ["sweep"]]  # one-shot commands


@pytest.mark.parametrize(
    ("command", "variable", "value", "words"),
    [
        (["migrate"], "FLASHSALE_LOG_LEVEL", "VERBOSE", ("'VERBOSE'", "INFO")),
        (["token", "--user", "u"], "FLASHSALE_AUTH__JWT_SECRET", "short", ("at least 32",)),
        (["realign"], "FLASHSALE_REDIS__KEY_PREFIX", "bad prefix!", ("pattern",)),
        (["migrate"], "FLASHSALE_DB__URL", "postgresql://u:pw@127.0.0.1/x", ("mysql+asyncmy://",)),
        (["product", "set", "5", "--stock", "1"], "FLASHSALE_DB__URL", "mysql+aiomysql://root@h/x", ("mysql+asyncmy",)),
        (["consume"], "FLASHSALE_AMQP__PREFETCH", "many", ("integer",)),
    ],
    ids=["log level", "short secret", "key prefix", "postgresql url", "driver not installed", "prefetch"],
)
def test_an_invalid_setting_is_one_line(settings, command, variable, value, words):
    result = _run(settings, command, **{variable: value})
    _assert_one_line(result, variable, *words)
    assert "pw@" not in result.stderr and (variable != "FLASHSALE_AUTH__JWT_SECRET" or "short" not in result.stderr)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_mysql_at_a_closed_port_is_one_line(settings, command):
    url = f"mysql+asyncmy://root:pw@127.0.0.1:{_closed_port()}/nothing_here"
    result = _run(settings, command, FLASHSALE_DB__URL=url)
    _assert_one_line(result, "FLASHSALE_DB__URL", "cannot reach MySQL")
    assert "pw" not in result.stderr


def _wrong_password(url: str) -> str:
    """``url`` (the run's server) with a password the server refuses."""
    parts = urlsplit(url)
    user = parts.username or "root"
    where = f"{parts.hostname}:{parts.port}" if parts.port else parts.hostname
    return urlunsplit(parts._replace(netloc=f"{user}:not-the-password@{where}"))


@pytest.mark.parametrize("store", ["amqp", "db"])
@pytest.mark.parametrize("command", [["serve", "--port", "0", "--workers", "2"], ["consume"]], ids=["serve", "consume"])
def test_serve_and_consume_refuse_wrong_credentials_at_start(settings, command, store):
    """A store that refuses the credentials will not change its mind: one line, exit 2 (a store
    that does not answer is waited for instead)."""
    variable = f"FLASHSALE_{store.upper()}__URL"
    result = _run(settings, command, **{variable: _wrong_password(getattr(settings, store).url)})
    _assert_one_line(result, variable, "cannot reach")
    assert "not-the-password" not in result.stderr


def test_debug_shows_the_traceback(settings):
    result = _run(settings, ["--debug", "migrate"], FLASHSALE_LOG_LEVEL="VERBOSE")
    assert result.returncode != 0 and "Traceback" in result.stderr and "FLASHSALE_LOG_LEVEL" in result.stderr


def test_version(settings):
    result = _run(settings, ["--version"])
    assert result.returncode == 0 and result.stdout.strip() == "flashsale 0.1.0"


async def test_a_read_on_a_lost_mysql_is_503(settings):
    lost = settings.model_copy(
        update={"db": settings.db.model_copy(update={"url": f"mysql+asyncmy://root@127.0.0.1:{_closed_port()}/x"})}
    )
    async with serving(create_app(lost), timeout=30) as client:
        response = await client.get("/api/v1/products/1")
        assert response.status_code == 503, response.text
        assert response.json()["code"] == "unavailable" and response.headers["retry-after"] == "1"
        ready = await client.get("/api/v1/health/ready")
        assert ready.status_code == 503 and ready.json()["mysql"] is False


DEV_SECRETS = {
    "FLASHSALE_AUTH__JWT_SECRET": DEV_JWT_SECRET,
    "FLASHSALE_PAYMENT__CHANNEL_SECRETS": json.dumps(DEV_CHANNEL_SECRETS),
}


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["token", "--user", "u"]], ids=["serve", "token"])
def test_development_secrets_are_refused_outside_development_mode(settings, command):
    result = _run(settings, command, **DEV_SECRETS)
    _assert_one_line(result, "FLASHSALE_AUTH__JWT_SECRET", "FLASHSALE_PAYMENT__CHANNEL_SECRETS", "FLASHSALE_ENV")


def test_development_mode_accepts_them(settings):
    token = _run(settings, ["token", "--user", "u"], FLASHSALE_ENV="development", **DEV_SECRETS)
    assert token.returncode == 0 and token.stdout.count(".") == 2
    # serve gets past the secrets and stops at the next check: the store that refuses it
    serve = _run(
        settings,
        ["serve", "--port", "0"],
        FLASHSALE_ENV="development",
        FLASHSALE_DB__URL=_wrong_password(settings.db.url),
        **DEV_SECRETS,
    )
    _assert_one_line(serve, "FLASHSALE_DB__URL", "cannot reach MySQL")


def test_the_app_refuses_development_secrets(settings):
    dev = settings.model_copy(
        update={
            "auth": settings.auth.model_copy(update={"jwt_secret": DEV_JWT_SECRET}),
            "payment": settings.payment.model_copy(update={"channel_secrets": DEV_CHANNEL_SECRETS}),
        }
    )
    with pytest.raises(ConfigError, match="FLASHSALE_ENV"):
        create_app(dev)
    create_app(dev.model_copy(update={"env": "development"}))  # explicit development mode: built, not served


def _unknown_user(url: str) -> str:
    """``url`` (the run's server) with a user the server does not know: ``nobody``, whom MariaDB
    10.11 refuses with 1698 (as root on unix_socket on a fresh Debian install), MySQL with 1045."""
    parts = urlsplit(url)
    where = f"{parts.hostname}:{parts.port}" if parts.port else parts.hostname
    return urlunsplit(parts._replace(netloc=f"nobody@{where}"))


@pytest.mark.parametrize(
    "command", [["migrate"], ["realign"], ["serve", "--port", "0"]], ids=["migrate", "realign", "serve"]
)
def test_a_mysql_user_that_does_not_exist_is_one_line(settings, command):
    result = _run(settings, command, FLASHSALE_DB__URL=_unknown_user(settings.db.url))
    _assert_one_line(result, "FLASHSALE_DB__URL", "cannot reach MySQL", "Access denied")


@pytest.mark.parametrize(
    ("variable", "value", "kind"),
    [
        ("FLASHSALE_PAYMENT__CHANNEL_SECRETS", "{mockpay: not-json}", "JSON object"),
        ("FLASHSALE_AMQP__RETRY_DELAYS", "1,2", "JSON array"),
        ("FLASHSALE_PAYMENT__CHANNEL_URLS", '{"mockpay": ', "JSON object"),
    ],
    ids=["secrets", "retry delays", "channel urls"],
)
def test_a_malformed_json_setting_names_its_variable(settings, variable, value, kind):
    result = _run(settings, ["token", "--user", "u"], **{variable: value})
    _assert_one_line(result, variable, kind)
    assert "not-json" not in result.stderr  # a secret is never echoed


def test_channel_pay_with_the_simulator_down_is_one_line(settings):
    dead = f"http://127.0.0.1:{_closed_port()}/mockpay"
    result = _run(settings, ["channel", "pay", "FS1"], FLASHSALE_PAYMENT__CHANNEL_URLS=json.dumps({"mockpay": dead}))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: mockpay at {dead} (FLASHSALE_PAYMENT__CHANNEL_URLS) did not answer: "
        "ConnectError('[Errno 111] Connection refused')"
    ]
