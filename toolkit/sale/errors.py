"""How ``flashsale sale`` fails: :class:`SetupError` (exit status 2) and the stderr console for
warnings and errors (stdout is the report's)."""

from __future__ import annotations

from rich.console import Console

stderr = Console(stderr=True)


class SetupError(Exception):
    """The sale could not be set up (exit status 2); the message says what and where."""


def where(url: str) -> str:
    """``url`` without its credentials, for messages."""
    return url.rsplit("@", 1)[-1]
