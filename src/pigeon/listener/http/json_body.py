"""What a JSON request body must be besides what its schema says: declared as JSON, and with
no member of an object named twice.

A body sent as a form (`curl --data`'s default) or as text/plain was read as JSON all the
same: a client that did not mean JSON learnt nothing. And `{"domain": "a", "domain": "b"}`
took the last value without a word (RFC 8259 leaves it to the reader): which one a client
meant is anyone's guess, so neither is taken.
"""

from __future__ import annotations

import json
from typing import Any, Final

from aiohttp import web

_UTF8: Final = frozenset({"utf-8", "utf8"})


def require_json(request: web.Request) -> None:
    """415 (with a JSON error naming the header) unless the body is declared
    `application/json`, in UTF-8 if a charset is named."""
    charset = (request.charset or "utf-8").lower()
    if request.content_type == "application/json" and charset in _UTF8:
        return
    given = request.headers.get("Content-Type", "")
    message = "send the body as JSON with 'Content-Type: application/json' (UTF-8), not "
    message += repr(given[:60]) if given else "without a Content-Type"
    body = json.dumps({"error": message, "field": "Content-Type"})
    raise web.HTTPUnsupportedMediaType(text=body, content_type="application/json")


class RepeatedMember(ValueError):
    """An object names a member twice (raised by `unique_members`)."""


def unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`json.loads`'s `object_pairs_hook` that refuses (`RepeatedMember`) an object naming a member twice."""
    members: dict[str, Any] = {}
    for key, value in pairs:
        if key in members:
            raise RepeatedMember(key)
        members[key] = value
    return members


class _Members(list[tuple[str, Any]]):
    """An object's members in their order, as `json.loads` gives them to `object_pairs_hook`."""


def repeated_member(body: bytes) -> str | None:
    """The JSON path (`$.recipients[0].email`) of the first member an object of `body` names
    a second time, if any. A body that is no JSON has none: its decoder says what is wrong."""
    try:
        tree = json.loads(body, object_pairs_hook=_Members)
    except (ValueError, RecursionError):
        return None
    stack: list[tuple[str, Any]] = [("$", tree)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, _Members):
            seen: set[str] = set()
            for key, _ in value:
                if key in seen:
                    return f"{path}.{key[:40]}"
                seen.add(key)
            stack.extend((f"{path}.{key[:40]}", item) for key, item in reversed(value))
        elif isinstance(value, list):
            stack.extend((f"{path}[{index}]", item) for index, item in reversed(list(enumerate(value))))
    return None


def repeated_refusal(path: str) -> str:
    """What a 400 for a member named twice says."""
    return f"{path} is given twice: give each member once"
