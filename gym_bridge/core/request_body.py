"""What gym_bridge's three HTTP servers (serve-model, `serve`'s `/run`, the capture endpoint) accept as a body.

One reader for all three: at most `max_bytes` (the declared Content-Length and the bytes that arrive both count),
valid JSON, nested at most `MAX_ROW_DEPTH` levels (a `/run` body is a row; a chat body may nest as deep). It
knows no web framework: a server hands it the body's chunks and answers a `BodyError` in its own error shape.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable
from typing import Any

from gym_bridge.core.errors import UserError
from gym_bridge.core.task import MAX_ROW_DEPTH

TOO_DEEP = f"request body is nested too deeply: more than {MAX_ROW_DEPTH} levels of objects and arrays"


class BodyError(UserError):
    """A body a server cannot read: `status` 413 (too large) or 400 (not JSON, not an object, nested too deeply)."""

    def __init__(self, status: int, message: str, *, field: str = "body") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        """Where the problem is: `body`, or the path of the value nested too deeply (`meta[0][0]...`)."""


async def read_json(chunks: AsyncIterable[bytes], *, content_length: str | None, max_bytes: int) -> Any:
    """The JSON value of a request body; raises BodyError (413 past `max_bytes`, declared or sent; 400 for
    what is not JSON or nests more than `MAX_ROW_DEPTH` levels)."""
    if content_length is not None and (not content_length.isdigit() or int(content_length) > max_bytes):
        raise BodyError(413, f"request body is larger than {max_bytes} bytes")
    body = bytearray()
    async for chunk in chunks:
        body += chunk
        if len(body) > max_bytes:
            raise BodyError(413, f"request body is larger than {max_bytes} bytes")
    try:
        value = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BodyError(400, f"request body is not valid JSON: {error}") from None
    except RecursionError:
        raise BodyError(400, TOO_DEEP) from None
    too_deep = _too_deep(value)
    if too_deep is not None:
        raise BodyError(400, f"{TOO_DEEP} (at {too_deep})", field=too_deep)
    return value


def json_object(value: Any) -> dict[str, Any]:
    """`value` when it is a JSON object; raises BodyError (400) otherwise."""
    if not isinstance(value, dict):
        raise BodyError(400, "request body must be a JSON object")
    return value


def _too_deep(value: Any) -> str | None:
    """The path (`a.b[0]`) of the first object or array more than `MAX_ROW_DEPTH` levels down (the body itself is
    level 1), as `parse_task` names row fields; None when there is none. Walks without recursion."""
    pending: list[tuple[Any, int, str]] = [(value, 1, "")]
    while pending:
        node, depth, path = pending.pop()
        if depth > MAX_ROW_DEPTH:
            return path
        if isinstance(node, dict):
            pending.extend((child, depth + 1, f"{path}.{key}" if path else str(key))
                           for key, child in node.items() if isinstance(child, (dict, list)))
        elif isinstance(node, list):
            pending.extend((child, depth + 1, f"{path}[{index}]") for index, child in enumerate(node) if isinstance(child, (dict, list)))
    return None
