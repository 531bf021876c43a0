"""What is wrong with the ``FLASHSALE_*`` variables as given, in one line naming each variable
(docs/CONFIGURATION.md shows it): a name no setting has, a value that is no JSON where a dict
or list setting needs it, and a value its setting refuses (:func:`config_error`). The first two
read the environment and ``.env`` as pydantic-settings does (names in any case; the environment
wins).

An unknown name would otherwise be ignored without a word: ``FLASHSALE_REDIS_URL`` (one
underscore) and the command runs on the default Redis. :func:`service.settings.get_settings`
refuses it, naming the closest known name.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from typing import get_origin

from pydantic import BaseModel, ValidationError

ENV_PREFIX = "FLASHSALE_"
ENV_NESTED_DELIMITER = "__"

OTHER_VARIABLES = frozenset(
    {"FLASHSALE_SERVE_PID", "FLASHSALE_FAULTS_OUT", "FLASHSALE_TEST_ARTIFACTS", "FLASHSALE_FUZZ_EXAMPLES"}
)
"""Names of the prefix that are no settings: ``flashsale serve`` tells its workers its pid
(``service.api.no_shard``); the fault suite's report file, the tests' screenshot folder and the
token fuzz test's example count."""


class ConfigError(Exception):
    """A setting is unusable. ``str()`` is one line naming the variable and what is wrong."""


def variable_name(location: tuple[str | int, ...]) -> str:
    """The environment variable of a settings field: ``("db", "url")`` -> ``FLASHSALE_DB__URL``."""
    return ENV_PREFIX + ENV_NESTED_DELIMITER.join(str(part).upper() for part in location)


def config_error(exc: ValidationError) -> ConfigError:
    """One line per invalid field, each naming its variable, the problem and the value given."""
    lines = []
    for error in exc.errors():
        given = error.get("input")
        names = [str(part) for part in error["loc"]]
        if isinstance(given, dict) or any("secret" in name for name in names):
            shown = ""  # never echo a secret
        elif names[-1] == "url" and isinstance(given, str):
            shown = f" (got '{given.split('://', 1)[0]}://...')"  # URLs may carry passwords
        else:
            shown = f" (got {given!r})"
        lines.append(f"{variable_name(error['loc'])}: {error['msg']}{shown}")
    return ConfigError("; ".join(lines))


class SettingsVariables:
    """The variables of a settings ``model``: ``prefix`` + the field names, groups joined with
    ``delimiter`` (``FLASHSALE_REDIS__URL``)."""

    def __init__(self, model: type[BaseModel], prefix: str, delimiter: str) -> None:
        self._model = model
        self._prefix = prefix
        self._delimiter = delimiter
        self.names: set[str] = set()
        """Every field's variable; a group's own name too (pydantic-settings takes a JSON object)."""
        self._kinds: dict[str, str] = {}
        self._open: set[str] = set()  # a dict field's name + delimiter: any key may follow
        self._collect(model, prefix)

    def _collect(self, model: type[BaseModel], prefix: str) -> None:
        for field, info in model.model_fields.items():
            name = f"{prefix}{field.upper()}"
            self.names.add(name)
            annotation = info.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                self._collect(annotation, name + self._delimiter)
            elif (origin := get_origin(annotation)) in (dict, list):
                self._kinds[name] = "object" if origin is dict else "array"
                if origin is dict:
                    self._open.add(name + self._delimiter)

    def unknown(self, given: Iterable[str], allowed: Iterable[str] = ()) -> list[str]:
        """The names among ``given`` that carry the prefix but name no field, no key of a dict
        field, none of :data:`OTHER_VARIABLES` and none of ``allowed`` (``*``: every name is
        allowed), in any case, as given; sorted, each once."""
        allowed = {name.upper() for name in allowed}
        if "*" in allowed:
            return []
        known = self.names | OTHER_VARIABLES | allowed
        return sorted(
            {
                name
                for name in given
                if (upper := name.upper()).startswith(self._prefix)
                and upper not in known
                and not upper.startswith(tuple(self._open))
            }
        )

    def closest(self, name: str) -> str:
        """The known variable most like ``name`` (difflib's ratio; the first in order on a tie)."""
        upper = name.upper()
        return max(sorted(self.names), key=lambda known: difflib.SequenceMatcher(None, upper, known).ratio())

    def unknown_line(self, unknown: Iterable[str]) -> str:
        """One line naming each unknown variable and the closest known name."""
        return "; ".join(f"{name}: no such setting (did you mean {self.closest(name)}?)" for name in unknown)

    def undecodable(self, problem: str, given: Mapping[str, str | None]) -> str:
        """The line for a value pydantic-settings could not decode as JSON (a dict or list
        setting), whose own error (``problem``) names only the group: the first such variable
        in ``given``, or ``problem``. The value is not echoed (it may be a secret)."""
        for name, value in given.items():
            kind = self._kinds.get(name.upper())
            if kind is None or value is None:
                continue
            try:
                json.loads(value)
            except ValueError as error:
                return f"{name.upper()}: must be a JSON {kind}: {error}"
        return problem
