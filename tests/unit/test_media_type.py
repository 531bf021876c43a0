"""Which Content-Type says JSON (the 415 guard, service/api/media.py)."""

from __future__ import annotations

import pytest

from service.api.media import is_json_media_type


@pytest.mark.parametrize(
    "value",
    [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON ; charset=UTF-8",
        "application/problem+json",
        "application/vnd.api+json; charset=utf-8",
    ],
)
def test_json_media_types(value: str) -> None:
    assert is_json_media_type(value)


@pytest.mark.parametrize(
    "value",
    [
        "",
        "text/plain",
        "application/xml",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "text/json",
        "application/+json",
        "application/jsonx",
        "application/json-seq",
    ],
)
def test_other_media_types(value: str) -> None:
    assert not is_json_media_type(value)
