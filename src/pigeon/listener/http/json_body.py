"""What a JSON request body must be besides what its schema says: declared as JSON, and with
no member of an object named twice.

A body sent as a form (`curl --data`'s default) or as text/plain was read as JSON all the
same: a client that did not mean JSON learnt nothing. And `{"domain": "a", "domain": "b"}`
took the last value without a word (RFC 8259 leaves it to the reader): which one a client
meant is anyone's guess, so neither is taken. And a string holding a lone surrogate escape
(`"\\ud800"`) is no Unicode text: msgspec refused it as "Input data was truncated" or "invalid
utf-16 surrogate pair", naming no member, so the path of the string is found and said. And
a number too large to hold (`1e400`, an integer of thousands of digits) is valid JSON that
msgspec refuses as "Number out of range", naming a map's member as `[...]`: its path is found
and said, with what is taken.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterator
from typing import Any, Final

from aiohttp import web

from pigeon.listener.http.body import coding_refusal

_UTF8: Final = frozenset({"utf-8", "utf8"})


def require_json(request: web.Request) -> None:
    """415 (with a JSON error naming the header) unless the body is declared
    `application/json`, in UTF-8 if a charset is named, and comes in a content coding that is
    decoded here, if any (`body.CODINGS`)."""
    charset = (request.charset or "utf-8").lower()
    if request.content_type == "application/json" and charset in _UTF8:
        if (refused := coding_refusal(request)) is not None:
            raise refused
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


MAX_VALUES: Final = 1_000_000
"""JSON values (objects, arrays, strings, numbers...) one request body may hold. Decoding and
checking a value costs the event loop time and the worker memory whatever the body's bytes:
64 MiB of `{},` are 21 million objects, and 61 KB of gzip make them. A request of
`[http] max_recipients` recipients, each with its metadata and substitutions, has a few dozen
values each: ten thousand recipients are far below this."""
_SMALL: Final = 256 * 1024
"""Bytes of body under which a refusal's JSON path is found by walking the decoded body (which
builds a path for every value); past it, a repeated member is named by its key alone (`$..key`)."""
_SKIPPED_STRING: Final = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_LONE_SURROGATE_ESCAPE: Final = re.compile(rb"\\[uU][dD][89a-fA-F][0-9a-fA-F]{2}")


def too_many_values(body: bytes) -> str | None:
    """What a 400 says of a body holding more than `MAX_VALUES` JSON values, or None. Counted
    by the bytes that start or separate values, outside strings, at the speed of `bytes.count`
    (the strings are taken out only when the rough count, strings included, is over)."""

    def rough(text: bytes) -> int:
        return text.count(b",") + text.count(b"{") + text.count(b"[") + 1

    if rough(body) <= MAX_VALUES:
        return None
    if rough(_SKIPPED_STRING.sub(b'""', body)) <= MAX_VALUES:
        return None
    return f"more than {MAX_VALUES} JSON values in one request: send them in more requests"


class _Members(list[tuple[str, Any]]):
    """An object's members in their order, as `json.loads` gives them to `object_pairs_hook`."""


def _walk(body: bytes) -> Iterator[tuple[str, Any]]:
    """Every value of `body` with its JSON path (`$.recipients[0].email`), in document order,
    objects as `_Members`; nothing for a body that is no JSON (its decoder says what is wrong)."""
    try:
        tree = json.loads(body, object_pairs_hook=_Members)
    except (ValueError, RecursionError):
        return
    stack: list[tuple[str, Any]] = [("$", tree)]
    while stack:
        path, value = stack.pop()
        yield path, value
        if isinstance(value, _Members):
            stack.extend((f"{path}.{key[:40]}", item) for key, item in reversed(value))
        elif isinstance(value, list):
            stack.extend((f"{path}[{index}]", item) for index, item in reversed(list(enumerate(value))))


def repeated_member(body: bytes) -> str | None:
    """The JSON path (`$.recipients[0].email`) of the first member an object of `body` names
    a second time, if any. Found at the speed of `json.loads`: only a body that has one is
    walked for its path (a small one: a large one's is `$..key`)."""
    repeated: list[str] = []

    def check(pairs: list[tuple[str, Any]]) -> None:
        # None: the tree is not kept, only checked. (`dict` finds a repeat at C speed.)
        if len(pairs) > 1 and not repeated and len(dict(pairs)) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    repeated.append(key)
                    return
                seen.add(key)

    try:
        json.loads(body, object_pairs_hook=check)
    except (ValueError, RecursionError):
        return None
    if not repeated:
        return None
    if len(body) > _SMALL:
        return f"$..{repeated[0][:40]}"
    for path, value in _walk(body):
        if isinstance(value, _Members):
            seen: set[str] = set()
            for key, _ in value:
                if key in seen:
                    return f"{path}.{key[:40]}"
                seen.add(key)
    return None


def repeated_refusal(path: str) -> str:
    """What a 400 for a member named twice says."""
    return f"{path} is given twice: give each member once"


def _lone_surrogate_in(text: str) -> bool:
    # `json.loads` joins a valid pair into one character: what is left in the surrogate block is alone.
    return any("\ud800" <= char <= "\udfff" for char in text)


def lone_surrogate(body: bytes) -> tuple[str, bool] | None:
    """Where the first string of `body` holding a lone surrogate escape is, if any: its JSON
    path (`$.content.subject`), and whether it is a member's name (then the path is of the
    object naming it) rather than a value. Only a body with such an escape is decoded (and a
    large one is not walked for the path: `$`)."""
    if _LONE_SURROGATE_ESCAPE.search(body) is None:
        return None
    if len(body) > _SMALL:
        try:  # a lone surrogate, decoded, cannot be encoded as UTF-8: found at C speed
            json.dumps(json.loads(body), ensure_ascii=False).encode()
        except UnicodeEncodeError:
            return "$", False
        except (ValueError, RecursionError):
            return None
        return None
    for path, value in _walk(body):
        if isinstance(value, str) and _lone_surrogate_in(value):
            return path, False
        if isinstance(value, _Members) and any(_lone_surrogate_in(key) for key, _ in value):
            return path, True
    return None


def lone_surrogate_refusal(path: str, *, name: bool) -> str:
    """What a 400 for a string holding a lone surrogate says (`name`: a member's name in the
    object at `path`, rather than the value at `path`)."""
    what = f"a member name in {path}" if name else path
    return (
        f"{what} holds a lone surrogate escape (\\uD800-\\uDFFF without its pair), which is not valid "
        "Unicode text: send the text as UTF-8, or a character beyond U+FFFF as both halves of its pair"
    )


_OUT_OF_RANGE: Final = re.compile(r"(?:Number|Integer value) out of range(?: - at `(\$[^`]*)`)?")
_PLAIN_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


def member_path(at: str, name: str) -> str:
    """The JSON path of member `name` of the object at `at`: `$.a.b`, or `$.a["b c"]` for a
    name that is not letters, digits, "-" and "_"."""
    return f"{at}.{name}" if _PLAIN_NAME.fullmatch(name) else f"{at}[{json.dumps(name[:64], ensure_ascii=False)}]"


def out_of_range_text() -> str:
    """What a 400 for a number too large to hold says."""
    digits = sys.get_int_max_str_digits() or 4300  # (0: no limit; msgspec's is Python's)
    return (
        f"a number out of range: an integer has at most {digits} digits, and a number with a fraction or an"
        " exponent is at most about 1.8e308 either way; send it as a string"
    )


class _TooLarge:
    """A number of the body that no int or float holds, as `json.loads` is given it."""


def number_out_of_range(body: bytes, error: str) -> str | None:
    """The JSON path of the number too large to hold that msgspec refused (its `error`, "Number
    out of range" or "Integer value out of range", naming no member of a map: `$.a[...]`), or
    None if `error` says something else. The first such number of `body`, in document order (the
    one msgspec, reading in that order, stopped at); else, as far as msgspec named it (`$.a`)."""
    said = _OUT_OF_RANGE.fullmatch(error)
    if said is None:
        return None
    named = said.group(1) or "$"
    known = named.partition("[...]")[0]
    if known == named:
        return named
    found = _first_too_large(body)
    return found if found is not None and found.startswith(known) else known


def _first_too_large(body: bytes) -> str | None:
    too_large = _TooLarge()

    def integer(text: str) -> object:
        try:
            int(text)
        except ValueError:  # over Python's digits, as msgspec's int is
            return too_large
        return None

    def number(text: str) -> object:
        return too_large if math.isinf(float(text)) else None

    try:  # (values are not kept: only where the one too large is)
        tree = json.loads(body, object_pairs_hook=_Members, parse_int=integer, parse_float=number)
    except (ValueError, RecursionError):
        return None
    # Depth first, in document order; a path is made only for the value found (a body may hold a million).
    stack: list[tuple[Any, tuple[Any, str | int] | None]] = [(tree, None)]
    while stack:
        value, steps = stack.pop()
        if value is too_large:
            names: list[str | int] = []
            while steps is not None:
                steps, step = steps
                names.append(step)
            path = "$"
            for step in reversed(names):
                path = f"{path}[{step}]" if isinstance(step, int) else member_path(path, step)
            return path
        if isinstance(value, _Members):
            stack.extend((item, (steps, key)) for key, item in reversed(value))
        elif isinstance(value, list):
            stack.extend((item, (steps, index)) for index, item in reversed(list(enumerate(value))))
    return None


# --- finding a value by its path, however deep what lies around it --------------------------
_SPACE: Final = re.compile(rb"[ \t\r\n]*")
_STRING: Final = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_SCALAR: Final = re.compile(rb"[^,}\]\s]+")
_STRUCTURE: Final = re.compile(rb'["{}\[\]]')
_STEP: Final = re.compile(r"\.([A-Za-z0-9_-]+)|\[(\d+)\]")


def span_at(body: bytes, path: str) -> tuple[int, int] | None:
    """Where the value at `path` (`$.recipients[0].metadata`, as msgspec names one) is in the
    JSON `body`: its first byte and the one past its last; None if there is none, or the body
    is not JSON that far. Read by scanning, not decoding: a value nested 5,000 levels deep
    beside it is skipped over, where a decoder stops at Python's recursion limit."""
    try:
        at = _space(body, 0)
        end = _end_of_value(body, at)
        for name, index in _STEP.findall(path):
            if name:
                found = next(((s, e) for key, s, e in members(body, at) if key == name), None)
            else:
                found = next(((s, e) for n, (s, e) in enumerate(_elements(body, at)) if n == int(index)), None)
            if found is None:
                return None
            at, end = found
        return at, end
    except (ValueError, IndexError):
        return None


def members(body: bytes, at: int) -> Iterator[tuple[str, int, int]]:
    """The members of the JSON object starting at `at`: each name, and where its value is (as
    `span_at` says). ValueError where `body` is no JSON object there."""
    if body[at : at + 1] != b"{":
        raise ValueError("not an object")
    at = _space(body, at + 1)
    if body[at : at + 1] == b"}":
        return
    while True:
        name = _STRING.match(body, at)
        if name is None:
            raise ValueError("no member name")
        at = _space(body, name.end())
        if body[at : at + 1] != b":":
            raise ValueError("no colon")
        start = _space(body, at + 1)
        end = _end_of_value(body, start)
        yield json.loads(name.group()), start, end
        at = _space(body, end)
        if body[at : at + 1] != b",":
            return
        at = _space(body, at + 1)


def _elements(body: bytes, at: int) -> Iterator[tuple[int, int]]:
    if body[at : at + 1] != b"[":
        raise ValueError("not an array")
    at = _space(body, at + 1)
    if body[at : at + 1] == b"]":
        return
    while True:
        end = _end_of_value(body, at)
        yield at, end
        at = _space(body, end)
        if body[at : at + 1] != b",":
            return
        at = _space(body, at + 1)


def _space(body: bytes, at: int) -> int:
    found = _SPACE.match(body, at)
    return found.end() if found is not None else at


def _end_of_value(body: bytes, at: int) -> int:
    """One past the last byte of the JSON value starting at `at`: nesting counted, not recursed into."""
    first = body[at : at + 1]
    if first == b'"':
        string = _STRING.match(body, at)
        if string is None:
            raise ValueError("unterminated string")
        return string.end()
    if first not in (b"{", b"["):
        scalar = _SCALAR.match(body, at)
        if scalar is None:
            raise ValueError("no value")
        return scalar.end()
    depth = 0
    while True:
        found = _STRUCTURE.search(body, at)
        if found is None:
            raise ValueError("unterminated")
        if found.group() == b'"':
            string = _STRING.match(body, found.start())
            if string is None:
                raise ValueError("unterminated string")
            at = string.end()
            continue
        depth += 1 if found.group() in (b"{", b"[") else -1
        at = found.end()
        if depth == 0:
            return at
