"""The one request-body reader of the three HTTP servers (issue 37 item 5): size (declared and sent), JSON, and the
one depth limit, a row's (the body itself is level 1), with the path of what nests too deeply."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gym_bridge.core.request_body import BodyError, json_object, read_json
from gym_bridge.core.task import MAX_ROW_DEPTH


async def _chunks(parts: list[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def read(parts: list[bytes], *, content_length: str | None = None, max_bytes: int = 100) -> Any:
    return asyncio.run(read_json(_chunks(parts), content_length=content_length, max_bytes=max_bytes))


def nested(levels: int) -> bytes:
    """A body `levels` deep: an object holding lists ({"a": [[...]]}: 1 + (levels - 1))."""
    return b'{"a": ' + b"[" * (levels - 1) + b"]" * (levels - 1) + b"}"


def test_a_body_is_read_across_its_chunks() -> None:
    assert read([b'{"a": [1,', b" 2]}"], content_length="13") == {"a": [1, 2]}


@pytest.mark.parametrize("parts, content_length", [
    ([b"{}"], "101"),            # declared over the limit: refused before a byte is read
    ([b"{}"], "12x"),            # a Content-Length that is no number
    ([b"[" + b"1," * 60, b"1]"], None),  # 123 bytes sent without a declared length
])
def test_a_body_over_the_limit_is_a_413(parts: list[bytes], content_length: str | None) -> None:
    with pytest.raises(BodyError) as refused:
        read(parts, content_length=content_length)
    assert refused.value.status == 413 and "larger than 100 bytes" in refused.value.message


@pytest.mark.parametrize("body, message", [
    (b"{not json", "not valid JSON"),
    (b"\xff", "not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),  # past the JSON parser's recursion
])
def test_what_is_not_json_is_a_400_about_the_body(body: bytes, message: str) -> None:
    with pytest.raises(BodyError) as refused:
        read([body], max_bytes=1_000_000)
    assert refused.value.status == 400 and message in refused.value.message and refused.value.field == "body"


def test_the_depth_limit_is_a_rows_and_the_error_names_the_path() -> None:
    assert read([nested(MAX_ROW_DEPTH)], max_bytes=10_000)["a"] is not None  # 200 levels: read
    with pytest.raises(BodyError) as refused:
        read([nested(MAX_ROW_DEPTH + 1)], max_bytes=10_000)
    # the body (1), a (2), then a[0] (3) ... a + 199 x [0] (201 levels: one too many)
    assert refused.value.status == 400 and refused.value.field == "a" + "[0]" * (MAX_ROW_DEPTH - 1)
    assert f"more than {MAX_ROW_DEPTH} levels" in refused.value.message


def test_json_object_refuses_anything_else() -> None:
    assert json_object({"a": 1}) == {"a": 1}
    for value in ([1, 2], "x", 3, None):
        with pytest.raises(BodyError, match="must be a JSON object"):
            json_object(value)
