"""Bounded rendering: Jinja2 templates from API clients, with a budget for every render.

The sandbox stops a template from reaching Python's internals, not from working forever:
`{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}` is a
legal template that would hold the event loop for hours and make 10 GB of text. So every
render has budgets, and the first one spent ends it with `RenderLimit`:

- time: at most `MAX_RENDER_SECONDS`, checked at every call (macros included), filter,
  operator, loop step and piece of output, so no path through a template escapes it;
- size: no value (string, list) longer than the output limit, estimated *before* an
  operation that could make one (`*`, `+`, `~`, `%`, padding, `join`, `replace`, format
  widths, `split`, `list`, slices, `tojson` and the other filters that write a value out)
  and checked after every call, filter, operator, slice and literal;
- memory: at most `_MADE_FACTOR` times the output limit (and at least `_MADE_FLOOR`) in
  *bytes* of values made in all, as Python holds them: a multiple of the output limit, as
  the other budgets are, since a message that size must be made. A value is weighed by
  `sys.getsizeof` (1, 2 or 4 bytes a character, 8 a list item, 28 or more an int) with what
  only it holds: the strings of a list `split` made count, the items of a list `sort`
  reordered do not (they were charged where they were made, or came with the request).
  "Only it" is read from CPython's reference counts, so a value a variable or the request
  holds is not charged again however often a template uses it. Estimated before what could
  make much more than it is given (the operations above, `list` of a text, `tojson` of a
  list holding one string a million times, an escaped value in HTML); charged after every
  call, filter, operator, slice, list or dict literal (made again at each loop step) and
  block text (`{% set %}` blocks, macros, `{% filter %}`: their pieces are joined every
  `_CHECK_EVERY`); and, for a generator (`map`, `batch`, `select`), item by item as drawn,
  with the time checked, so `list()` over one cannot run long either. The output's pieces
  are joined every `_CHECK_EVERY` too, and the output is held once more at the end: one
  render holds at most about `_MADE_FACTOR` + 2 times `max_output` bytes (100 MiB for the
  default 25 MiB message size; an output of emoji, 4 bytes a character, holds more), where
  a template could make a worker allocate gigabytes before;
- integers: at most `MAX_INT_DIGITS` digits, estimated before `*` and `**` (a big power
  takes hours), and few enough to be printed (Python refuses more than 4300);
- loop steps: at most `MAX_LOOP_STEPS` items drawn from `range()` over the whole render;
- output: at most `max_output` characters, counted as `generate()` streams them.

`lipsum()` is refused: it makes text at a cost the template chooses. Any other failure inside
a render (recursion too deep, a value Python refuses) is the template's, not the server's.

A raw message is rendered with `header=True`: until its output has ended the header section
(its first empty line), a value put out by `{{ }}` (through whatever filters, macros or
`{% set %}` it came), or made by a `{% filter %}` block, must hold no line break or control
character, or `HeaderBreak` ends the render. A recipient's name of "Bob\nBcc: x" would otherwise
start a header field of its own (and be DKIM-signed), and "\r\n\r\n" would end the header
early. The template's own text is not a value: a literal header, a header it folds itself, a
`{% raw %}` section, a string literal in `{{ "..." }}` (folded into text when compiled) all
stay as they are. Conservative edge: a value rendered into a macro's or `{% set %}` block's
text while the header is still open is checked even when that text ends up in the body.
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import math
import re
import sys
import time
import types
from collections.abc import Callable, ItemsView, Iterable, Iterator, Mapping, Sized
from typing import Any, Final

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_LOOP_STEPS: Final = 100_000
MAX_RENDER_SECONDS: Final = 1.0
MAX_INT_DIGITS: Final = 4000
_MAX_INT_BITS: Final = int(MAX_INT_DIGITS * math.log2(10))
_MADE_FACTOR: Final = 2
_MADE_FLOOR: Final = 8 * 1024 * 1024
"""The bytes of values a render may make, whatever the output limit: a node with a 100 kB
message limit still renders a loop over a few thousand substitutions."""
_POINTER: Final = 8
"""What an item of a list, tuple or generator's consumer takes besides the item itself."""
_OWNED_REFS: Final = 3
"""`sys.getrefcount` of a value only one thing holds, seen from a `for` over that thing: its
holder, the loop variable and the call's argument. A value with more holders was made before,
and is charged where it was."""
_FRESH_REFS: Final = 2
"""`sys.getrefcount` of a value just returned, seen from `_Budget.result`: its parameter and
the call's argument."""
_CHECK_EVERY: Final = 4096
"""Items a walk weighs between two looks at the clock and the budget."""
_CONTAINERS: Final = (list, tuple, dict, set, frozenset)
_SIZED: Final = (list, tuple, dict, bytes)
_NUMBERS: Final = (int, float)
_END: Final = object()
_MACRO: Final = jinja2.runtime.Macro
_NUMBER = re.compile(r"\d+")


class RenderLimit(Exception):
    """A render spent one of its budgets; the message names the limit."""


class HeaderBreak(Exception):
    """A value with a line break or control character was rendered into the header section.
    `value` is the text put out (as `str()` made it), `character` the first offending one."""

    def __init__(self, value: str, character: str) -> None:
        super().__init__(f"{_character_name(character)} in a value rendered into the header section")
        self.value, self.character = value, character


# What RFC 5322 allows in no header field body (2.2, 3.2.2: VCHAR and WSP, UTF-8 by RFC 6532):
# C0 controls but TAB, DEL, C1 controls (NEL, U+0085, among them), and the Unicode line and
# paragraph separators, which some parsers (Python's `str.splitlines`) take for line ends.
NOT_IN_HEADER: Final = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
_NAMES: Final = {
    "\r": "CR",
    "\n": "LF",
    "\0": "NUL",
    "\x85": "NEL",
    "\u2028": "LINE SEPARATOR",
    "\u2029": "PARAGRAPH SEPARATOR",
}


def _character_name(character: str) -> str:
    return _NAMES.get(character, f"control character U+{ord(character):04X}")


class _Budget:
    """One render's budgets."""

    def __init__(self, max_output: int) -> None:
        self.max_output = max_output
        self.made_limit = max(_MADE_FACTOR * max_output, _MADE_FLOOR)
        self.made = self.made_limit
        """Bytes of values the render may still make."""
        self.steps = MAX_LOOP_STEPS
        self.deadline = time.monotonic() + MAX_RENDER_SECONDS
        self.in_header = False
        """Whether the output so far is still in a header section: values are checked."""

    def step(self) -> None:
        self.steps -= 1
        if self.steps < 0:
            raise RenderLimit(f"more than {MAX_LOOP_STEPS} loop steps (range items) in one render")
        self.tick()

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise RenderLimit(f"rendering took longer than {MAX_RENDER_SECONDS:g}s")

    def size(self, characters: int, width: int = 1, of: Iterable[Any] = ()) -> None:
        """Before making a value of about `characters` (or items) of `width` bytes each, or
        as many as a character of the strings it is made `of` takes (`_width`): refuse one
        over the output limit, or over the bytes left to make."""
        if characters > self.max_output:
            raise RenderLimit(f"a value of more than {self.max_output} characters (the output limit)")
        if characters * max(width, _POINTER) > self.made:  # (else no need to look at the strings)
            self.afford(characters * max([width, *map(_width, of)]))

    def afford(self, size: int) -> None:
        """Before making values of about `size` bytes: refuse them if over the bytes left.
        (They are charged once made, by `result`.)"""
        if size > self.made:
            raise self.spent()

    def charge(self, size: int) -> None:
        """`size` bytes of values made."""
        self.made -= size
        if self.made < 0:
            raise self.spent()

    def spent(self) -> RenderLimit:
        """The error for a render that made more than it may."""
        return RenderLimit(
            f"more than {self.made_limit} bytes of values made in one render "
            f"({_MADE_FACTOR} times the output limit, at least {_MADE_FLOOR >> 20} MiB)"
        )

    def bits(self, bits: int) -> None:
        if bits > _MAX_INT_BITS:
            raise RenderLimit(f"a number of more than {MAX_INT_DIGITS} digits")

    def result(self, value: Any) -> Any:
        """`value`, once checked and charged: made by a call whose cost could not be estimated
        before. Pass it straight from the call that made it: a value held by anything else
        (a variable, a list) was made before, and is not charged again."""
        self.tick()
        if isinstance(value, str):  # the common case, first
            if len(value) > self.max_output:
                raise RenderLimit(f"a value of more than {self.max_output} characters (the output limit)")
            if sys.getrefcount(value) <= _FRESH_REFS:  # else made before (an item `first` gave back)
                self.made -= sys.getsizeof(value)
                if self.made < 0:
                    raise self.spent()
            return value
        if isinstance(value, int):
            self.bits(value.bit_length())
        elif isinstance(value, _SIZED) and len(value) > self.max_output:
            raise RenderLimit(f"a value of more than {self.max_output} characters (the output limit)")
        elif _is_lazy(value):
            return _Drawn(self, value)
        if sys.getrefcount(value) <= _FRESH_REFS:
            self.charge(_weight(self, value))
        return value


def _is_lazy(value: Any) -> bool:
    """Whether `value` makes its items as they are drawn (a generator, `map`, a dict view's
    iterator), where `list()` or a `join` could draw millions without a look at the clock."""
    return isinstance(value, Iterator) and not isinstance(value, _Range | _Drawn)


def _weight(budget: _Budget, value: Any) -> int:
    """Bytes `value` takes, with what only it holds (items nothing else holds, recursively)."""
    size = sys.getsizeof(value)
    if not isinstance(value, _CONTAINERS):
        return size
    stack = [value]
    seen = 0
    while stack:
        holder = stack.pop()
        for items in (holder, holder.values()) if isinstance(holder, dict) else (holder,):
            for item in items:
                if sys.getrefcount(item) <= _OWNED_REFS:
                    size += sys.getsizeof(item)
                    if isinstance(item, _CONTAINERS):
                        stack.append(item)
                seen += 1
                if seen % _CHECK_EVERY == 0:
                    budget.afford(size)
                    budget.tick()
    return size


class _Drawn(Iterator[Any]):
    """An iterator whose items are checked as drawn: the time, and the bytes of each new one
    (with the place its consumer, a list or a join, keeps for it)."""

    __slots__ = ("_budget", "_items")

    def __init__(self, budget: _Budget, items: Iterator[Any]) -> None:
        self._budget, self._items = budget, items

    def __next__(self) -> Any:
        item = next(self._items)
        budget = self._budget
        budget.tick()
        # Held by `item` and the argument, and perhaps by the generator that made it (the
        # list `batch` fills): new. An item of an existing list has one holder more.
        budget.charge(_POINTER + (sys.getsizeof(item) if sys.getrefcount(item) <= _OWNED_REFS else 0))
        return item


_current: contextvars.ContextVar[_Budget] = contextvars.ContextVar("render_budget")


_budget: Final[Callable[[], _Budget]] = _current.get
"""The running render's budget. Outside a render (Jinja folding constants while it compiles)
there is none, and the `LookupError` makes Jinja leave the work to the render. (The context
variable's own method: this is called for every call, filter and operator.)"""


class _Capture(list[str]):
    """The text of a block a template keeps (`{% set %}...{% endset %}`, a macro, `caller()`,
    `{% filter %}`), a piece at a time: every `_CHECK_EVERY` pieces are joined, once their
    length is known to be within the budget, and charged. Millions of pieces (a number or an
    emoji written at each step of a loop over a text, 50 to 80 bytes each) would hold far
    more than their characters, and a few thousand of one long value far more than the
    output limit."""

    _joined = 0
    """How many items at the start are joined pieces (set once there are: a block's text
    rarely has thousands of pieces, and a list made without an `__init__` is made faster)."""

    def append(self, piece: str) -> None:
        super().append(piece)
        if len(self) - self._joined >= _CHECK_EVERY:
            self._join()

    def extend(self, pieces: Iterable[str]) -> None:
        super().extend(pieces)
        if len(self) - self._joined >= _CHECK_EVERY:
            self._join()

    def _join(self) -> None:
        pieces = self[self._joined :]
        del self[self._joined :]
        super().append(_joined(pieces))
        self._joined += 1


def _joined(pieces: Iterable[str]) -> str:
    """`pieces` joined (a captured block's text: Jinja's `concat`), once their length is known
    to be within the budget, and charged."""
    budget = _current.get(None)
    if budget is None:
        return "".join(pieces)  # compiling
    if type(pieces) is not _Capture:
        pieces = list(pieces)
    length = sum(map(len, pieces))
    if length > budget.max_output or length * _POINTER > budget.made:  # (else surely within)
        budget.size(length, of=pieces)
    text = "".join(pieces)
    budget.made -= sys.getsizeof(text)
    if budget.made < 0:
        raise budget.spent()
    return text


class _Range(Iterator[int]):
    """`range()`: each item drawn is a loop step. Its items are not charged as made: the
    loop steps bound them (100,000 ints of 28 bytes), and a list of them is charged."""

    __slots__ = ("_budget", "_numbers")

    def __init__(self, *args: int) -> None:
        self._budget, self._numbers = _budget(), iter(range(*args))

    def __next__(self) -> int:
        number = next(self._numbers)
        self._budget.step()
        return number


def _no_lipsum(*args: Any, **kwargs: Any) -> str:
    raise RenderLimit("lipsum() is not available: it makes as much text as asked, at a cost no budget sees")


def _finalizer(autoescape: bool) -> Callable[[Any], Any]:
    """What every `{{ }}` output (and `{% filter %}` block) goes through before it is made
    text, in an environment that escapes (`autoescape`) or not: refused if writing it out (and
    escaping it) would make more than the output limit, or if it would put a line break or
    control character into the header section."""

    def finalize(value: Any) -> Any:
        try:
            budget = _current.get()
        except LookupError:
            return value  # compiling: a literal (`{{ "a" }}`) is the template's own text
        if isinstance(value, str):
            # Escaping makes up to 5 characters of one: counted for a long text only (in C).
            if autoescape and len(value) > _CHECK_EVERY and not hasattr(value, "__html__"):
                budget.size(_escaped_length(value), of=(value,))
        elif not isinstance(value, _NUMBERS):  # a list, a dict: written out whole
            written, width = _written_size(budget, value)
            budget.size(5 * written if autoescape else written, width)
        if budget.in_header:
            text = value if isinstance(value, str) else str(value)
            if (found := NOT_IN_HEADER.search(text)) is not None:
                raise HeaderBreak(text, found.group())
        return value

    return finalize


@jinja2.pass_context
def _loop_steps(context: jinja2.runtime.Context, iterable: Iterable[Any]) -> Iterator[Any]:
    """What a `{% for %}` iterates: each step checks the time."""
    budget = _budget()
    for item in iterable:
        budget.tick()
        yield item


def _length(value: Any) -> int:
    return len(value) if isinstance(value, str | list | tuple | bytes) else 0


def _width(value: Any) -> int:
    """Bytes a character of `value` takes (1, 2 or 4, as Python keeps it), or 8 for the
    place of an item of a list or tuple."""
    if isinstance(value, str):
        if value.isascii():
            return 1
        # A non-ASCII string is 72 bytes and a character more than its length (the NUL).
        return max(1, min(4, (sys.getsizeof(value) - 72) // (len(value) + 1)))
    return _POINTER if isinstance(value, list | tuple) else 1


_NEW_STRING: Final = 80
"""The most a short string made by splitting (a non-Latin-1 character) takes, with its place."""
_LINE_BREAKS: Final = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_SPACES: Final = (  # what `str.isspace` takes (`split()` splits at)
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
    "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_ESCAPES: Final = {"&": 4, "<": 3, ">": 3, '"': 4, "'": 4}
"""What HTML escaping adds for each character it escapes (`&amp;` is 4 more than `&`)."""


def _parts(text: str, separators: str) -> int:
    """The most parts `text` splits into at any of `separators` (each searched in C)."""
    return 1 + sum(text.count(c) for c in separators if c.isascii() or not text.isascii())


def _split_size(budget: _Budget, text: str, name: str, args: tuple[Any, ...]) -> None:
    """Before `split`, `rsplit` or `splitlines`: the list of strings it would make."""
    if (len(text) + 1) * _NEW_STRING + len(text) * _width(text) <= budget.made:
        return  # however it splits, within the budget: no need to count
    if name == "splitlines":
        parts = _parts(text, _LINE_BREAKS)
    elif args and isinstance(args[0], str) and args[0]:
        parts = text.count(args[0]) + 1
    else:
        parts = _parts(text, _SPACES)
    budget.size(parts, _NEW_STRING)
    budget.afford(parts * _NEW_STRING + len(text) * _width(text))


def _escaped_length(text: str) -> int:
    """The length of `text` HTML-escaped (markupsafe's `escape`), counted in C."""
    return len(text) + sum(text.count(c) * extra for c, extra in _ESCAPES.items())


def _joined_size(budget: _Budget, items: Iterable[Any]) -> tuple[int, int]:
    """The characters, and the widest character's bytes, of `items` written out one after
    another (`join`, `~`): a string as itself, anything else as `_written_size` says."""
    length, width = 0, 1
    for item in items:
        if isinstance(item, str):
            length += len(item)
        else:
            written, made_of = _written_size(budget, item)
            length, width = length + written, max(width, made_of)
    return length, width


def _written_size(budget: _Budget, value: Any, how: str = "str", indent: int = 1) -> tuple[int, int]:
    """About how many characters `value` takes written out (`str()`, or `repr()` for
    "repr", JSON for "json"), and how many bytes each: the most it could, each string with
    its escapes, as often as it is held (`[[s] * 1000] * 1000` writes `s` a million times).
    Each item is counted on a line of its own, `indent` more a level (pprint's 1, tojson's
    `indent`). Refuses (`RenderLimit`) as soon as that is over the output limit."""
    if isinstance(value, str) and how == "str":
        return len(value), _width(value)
    total, width, seen = 0, 1, 0
    # A stack of iterators, not of items: a list of millions of items is walked, not copied.
    stack: list[tuple[Iterator[Any], int]] = [(iter((value,)), 0)]
    while stack:
        items, margin = stack[-1]
        item = next(items, _END)
        if item is _END:
            stack.pop()
            continue
        if isinstance(item, str):
            width = max(width, _width(item))
            if how == "json":
                plain = item.isascii() and item.isprintable() and not any(c in item for c in "<>&'\"\\")
                factor = 1 if plain else 6 if item.isascii() else 12
            else:
                factor = 1 if item.isprintable() else 4 if item.isascii() else 10
            total += len(item) * factor + 4 + margin  # quotes, a separator, its line's indent
        elif isinstance(item, bytes):
            total += len(item) * 4 + 3 + margin  # b'\xff'
        elif isinstance(item, bool | None | int | float):
            total += (item.bit_length() * 3 // 10 + 3 if isinstance(item, int) else 26) + margin
        elif isinstance(item, dict | Mapping):
            total += 2 + margin
            stack.append((itertools.chain.from_iterable(item.items()), margin + indent))
        elif isinstance(item, list | tuple | set | frozenset):
            total += 2 + margin
            stack.append((iter(item), margin + indent))
        elif isinstance(item, jinja2.utils.Namespace):
            stack.append((iter((item._Namespace__attrs,)), margin + indent))  # (what its repr writes)
        else:
            total += 100  # another object: its repr names it
        seen += 1
        if seen % _CHECK_EVERY == 0 or total > budget.max_output:
            budget.size(total, width)
            budget.tick()
    return total, width


def _formatted_size(budget: _Budget, fmt: str, args: Any) -> tuple[int, int, list[str]]:
    """About how long `fmt % args` or `fmt.format(*args)` is (and `_Budget.size`'s `width`
    and `of` for it),
    refusing widths and precisions over the output limit, whether written in `fmt` or passed
    as `*` arguments."""
    values = list(args.values()) if isinstance(args, Mapping) else list(args) if isinstance(args, tuple) else [args]
    numbers = [int(n) for n in _NUMBER.findall(fmt)] + [v for v in values if isinstance(v, int)]
    widest = max(numbers, default=0)
    budget.size(widest)
    longest, width, texts = widest, 1, [fmt]
    for value in values:
        if isinstance(value, str):
            longest = max(longest, len(value))
            texts.append(value)
        elif not isinstance(value, int | float):
            length, made_of = _written_size(budget, value)
            longest, width = max(longest, length), max(width, made_of)
    return len(fmt) + (fmt.count("%") + fmt.count("{")) * longest, width, texts


def _checked_str_method(budget: _Budget, method: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Estimates for the string methods that make more than they are given."""
    text = method.__self__
    name = method.__name__
    if name == "join":
        items = list(args[0]) if args and not isinstance(args[0], list | tuple | str) else args[0] if args else []
        budget.size(len(text) * max(len(items) - 1, 0) + sum(_length(i) for i in items), of=(text, *items))
        return (items, *args[1:])
    if name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        found = text.count(args[0]) if args[0] else len(text) + 1
        if len(args) > 2 and isinstance(args[2], int) and args[2] >= 0:
            found = min(found, args[2])
        budget.size(len(text) + found * max(len(args[1]) - len(args[0]), 0), of=(text, args[1]))
    elif name == "expandtabs" and args and isinstance(args[0], int):
        budget.size(len(text) + text.count("\t") * args[0], of=(text,))
    elif name in ("format", "format_map"):
        budget.size(*_formatted_size(budget, text, args[0] if name == "format_map" and args else args))
    elif name in ("center", "ljust", "rjust", "zfill") and args and isinstance(args[0], int):
        budget.size(args[0], of=(text, *args[1:]))
    elif name in ("split", "rsplit", "splitlines"):
        _split_size(budget, text, name, args)
    elif name == "encode":
        budget.afford(len(text) * 4)
    return args


def _bounded_filter(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` (a default filter) with the time checked, its cost estimated where it can
    make more than it is given, and its result checked."""

    @functools.wraps(function)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        budget.tick()
        for value in (*args, *kwargs.values()):
            if isinstance(value, int) and not isinstance(value, bool) and value > budget.max_output:
                raise RenderLimit(f"{name}: more than {budget.max_output} characters (the output limit)")
        # Some filters take the context or environment first: the value comes after.
        skip = 1 if args and isinstance(args[0], jinja2.runtime.Context | nodes.EvalContext | jinja2.Environment) else 0
        if name == "join" and len(args) > skip and not isinstance(args[skip], list | tuple | str):
            args = (*args[:skip], list(args[skip]), *args[skip + 1 :])  # to know its length
        _estimate_filter(budget, name, list(args[skip:]), kwargs)
        return budget.result(function(*args, **kwargs))

    return bounded


_WRITTEN: Final = {"string": "str", "pprint": "repr", "tojson": "json", "xmlattr": "repr", "urlencode": "str"}
"""Filters that write a value out, and how (`_written_size`)."""
_COPIES: Final = frozenset({"list", "sort", "reverse", "unique", "dictsort", "items", "batch", "slice", "groupby"})
"""Filters that make a list (or a generator of its items) as long as the value."""


_ESTIMATED: Final = frozenset(
    {"indent", "wordwrap", "replace", "format", "join", "batch", "slice", "center", "e", "escape", "forceescape"}
    | {"urlize", "sum", *_WRITTEN, *_COPIES}
)


def _estimate_filter(budget: _Budget, name: str, args: list[Any], kwargs: dict[str, Any]) -> None:
    if name not in _ESTIMATED:
        return  # (most filters make no more than they are given: checked once made)
    value = args[0] if args else None
    text = value if isinstance(value, str) else ""
    if name == "indent":
        indent = args[1] if len(args) > 1 else kwargs.get("width", 4)
        budget.size(
            len(text) + (text.count("\n") + 1) * (indent if isinstance(indent, int) else _length(indent)),
            of=(text, indent),
        )
    elif name == "wordwrap":
        columns = args[1] if len(args) > 1 else kwargs.get("width", 79)
        wrap = args[4] if len(args) > 4 else kwargs.get("wrapstring") or "\n"
        lines = len(text) // max(columns if isinstance(columns, int) else 1, 1) + text.count("\n") + 1
        budget.size(len(text) + lines * _length(wrap), of=(text, wrap))
    elif name == "replace" and len(args) >= 3:
        old, new = args[1], args[2]
        found = text.count(str(old)) if str(old) else len(text) + 1
        budget.size(len(text) + found * max(_length(new) - _length(old), 0), of=(text, new))
    elif name == "format" and args:
        budget.size(*_formatted_size(budget, text, tuple(args[1:]) or kwargs))
    elif name == "join" and args:
        items = value if isinstance(value, list | tuple | str) else []
        glue = args[1] if len(args) > 1 else kwargs.get("d", "")
        length, width = _joined_size(budget, items)
        budget.size(
            _length(glue) * len(items) + length,
            width,
            of=(glue, *items) if isinstance(items, list | tuple) else (glue, items),
        )
    elif name in ("batch", "slice") and len(args) > 1 and isinstance(args[1], int):
        budget.size(args[1])
    elif name == "center" and len(args) > 1 and isinstance(args[1], int):
        budget.size(args[1], of=(text,))
    if name in _WRITTEN and value is not None:
        indent = args[1] if len(args) > 1 else kwargs.get("indent")  # (tojson's)
        indent = indent if isinstance(indent, int) and indent > 0 else _length(indent) or 1
        length, width = _written_size(budget, value, _WRITTEN[name], indent + 1)
        budget.size(length * 5 if name == "xmlattr" else length, width)  # (xmlattr escapes)
        if name == "urlencode":  # every character may become %XX, four times for one of 4 UTF-8 bytes
            budget.afford(12 * _written_size(budget, value)[0])
    elif name in ("e", "escape", "forceescape") and value is not None and not hasattr(value, "__html__"):
        length, width = _written_size(budget, value)
        budget.size(_escaped_length(value) if isinstance(value, str) else 5 * length, width)
    elif name == "urlize":  # each word a link: escaped twice (href and text), and the tags
        budget.afford((11 * len(text) + 128) * _width(text))
    elif name in _COPIES and isinstance(value, Sized) and not isinstance(value, Mapping | str):
        # A copy of the list, or of a dict's items (a tuple each).
        extra = 64 if isinstance(value, ItemsView) else 0
        budget.size(len(value), _POINTER + extra)
    elif name in _COPIES and isinstance(value, Mapping):
        budget.size(len(value), _POINTER + 64)
    elif name == "reverse" and isinstance(value, str):
        budget.size(len(value), of=(value,))
    elif name in _COPIES and isinstance(value, str):
        # A list of its characters: a string each, unless Latin-1 (Python keeps those once).
        budget.size(len(value), _POINTER + (_NEW_STRING if _width(value) > 1 else 0))
    elif name == "sum" and isinstance(value, list | tuple) and all(isinstance(i, list | tuple) for i in value):
        budget.size(sum(len(i) for i in value), _POINTER)


class _BoundedCodeGenerator(CodeGenerator):
    """Compiles `~` to a checked join and makes every `{% for %}` check the time per step."""

    def visit_Template(self, node: nodes.Template, frame: Frame | None = None) -> None:
        for loop in node.find_all(nodes.For):
            steps = nodes.EnvironmentAttribute("loop_steps", lineno=loop.lineno)
            loop.iter = nodes.Call(steps, [loop.iter], [], None, None, lineno=loop.lineno)
        super().visit_Template(node, frame)

    def visit_FilterBlock(self, node: nodes.FilterBlock, frame: Frame) -> None:
        # As Jinja's own, with the result finalized: a filter's arguments can bring values
        # (`{% filter replace("X", name) %}`) that no `{{ }}` puts out.
        filter_frame = frame.inner()
        filter_frame.symbols.analyze_node(node)
        self.enter_frame(filter_frame)
        self.buffer(filter_frame)
        self.blockvisit(node.body, filter_frame)
        self.start_write(frame, node)
        self.write("environment.finalize(")
        self.visit_Filter(node.filter, filter_frame)
        self.write(")")
        self.end_write(frame)
        self.leave_frame(filter_frame)

    def visit_Getitem(self, node: nodes.Getitem, frame: Frame) -> None:
        # Jinja writes a slice as Python's `x[a:b]`, which no budget sees: `s[::-1]` copies.
        if not isinstance(node.arg, nodes.Slice):
            return super().visit_Getitem(node, frame)  # (environment.getitem: makes nothing)
        self.write("environment.sliced(")
        self.visit(node.node, frame)
        self.write(", slice(")
        for part in (node.arg.start, node.arg.stop, node.arg.step):
            if part is None:
                self.write("None")
            else:
                self.visit(part, frame)
            self.write(", ")
        self.write("))")
        return None

    def visit_List(self, node: nodes.List, frame: Frame) -> None:
        # A literal made at every loop step (`ns.l + [[i, i, i, ...]]`) is charged too.
        self.write("environment.literal(")
        super().visit_List(node, frame)
        self.write(")")

    def visit_Dict(self, node: nodes.Dict, frame: Frame) -> None:
        self.write("environment.literal(")
        super().visit_Dict(node, frame)
        self.write(")")

    def buffer(self, frame: Frame) -> None:
        # As Jinja's own, with a list that joins its pieces as they come (`_Capture`).
        frame.buffer = self.temporary_identifier()
        self.writeline(f"{frame.buffer} = environment.capture()")

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        # As Jinja's own, with the join function and the parts handed to `concat`.
        self.write("environment.bounded_concat(")
        if frame.eval_ctx.volatile:
            self.write("(markup_join if context.eval_ctx.volatile else str_join)")
        else:
            self.write("markup_join" if frame.eval_ctx.autoescape else "str_join")
        self.write(", (")
        for part in node.nodes:
            self.visit(part, frame)
            self.write(", ")
        self.write("))")


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with every call, filter and growing operator checked against the budget."""

    code_generator_class = _BoundedCodeGenerator
    concat = staticmethod(_joined)
    capture = _Capture
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.globals["lipsum"] = _no_lipsum
        self.globals["range"] = _Range
        self.filters = {name: _bounded_filter(name, function) for name, function in self.filters.items()}
        self.loop_steps = _loop_steps

    def bounded_concat(self, join: Callable[[Iterable[Any]], str], parts: tuple[Any, ...]) -> str:
        """`~`: the parts joined, once their length is known to be within the budget."""
        budget = _budget()
        budget.tick()
        length, width = _joined_size(budget, parts)
        budget.size(length, width, of=[p for p in parts if isinstance(p, str)])
        return budget.result(join(parts))  # type: ignore[no-any-return]  # (a str)

    def sliced(self, value: Any, part: slice) -> Any:
        """`value[a:b:c]`, once its length is known to be within the budget."""
        budget = _budget()
        budget.tick()
        if isinstance(value, str | list | tuple):
            budget.size(len(range(*part.indices(len(value)))), of=(value,))
        return budget.result(value[part])

    def literal(self, value: Any) -> Any:
        """A list or dict written in the template: charged as made (its items were, if new)."""
        _budget().charge(sys.getsizeof(value))
        return value

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        budget = _budget()
        budget.tick()
        if operator == "**":
            if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
                budget.bits(left.bit_length() * right)
            return budget.result(left**right)
        if operator == "*":
            if isinstance(left, int) and isinstance(right, int):
                budget.bits(left.bit_length() + right.bit_length())
            for sequence, count in ((left, right), (right, left)):
                if isinstance(sequence, str | list | tuple | bytes) and isinstance(count, int):
                    budget.size(len(sequence) * count, of=(sequence,))
            return budget.result(left * right)
        if operator == "+":
            budget.size(_length(left) + _length(right), of=(left, right))
            return budget.result(left + right)
        if isinstance(left, str):  # "%": string formatting
            budget.size(*_formatted_size(budget, left, right))
        return budget.result(left % right)

    def call(__self, __context: jinja2.runtime.Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        if __obj is _loop_steps:  # a `{% for %}`'s own steps: each checks the time, and keeps nothing
            return _loop_steps(__context, *args)
        budget = _budget()
        budget.tick()
        method = getattr(__obj, "__wrapped__", __obj)  # str.format comes wrapped by the sandbox
        if isinstance(method, types.BuiltinMethodType) and not isinstance(method.__self__, types.ModuleType):
            # Methods of values (str.center, int.to_bytes...): a count over the output limit
            # is always a value over it.
            for value in (*args, *kwargs.values()):
                if isinstance(value, int) and not isinstance(value, bool) and value > budget.max_output:
                    raise RenderLimit(f"a value of more than {budget.max_output} characters (the output limit)")
            if isinstance(method.__self__, str):
                args = _checked_str_method(budget, method, args)
        if type(__obj) is _MACRO:  # its text is checked and charged as it is joined
            return super().call(__context, __obj, *args, **kwargs)
        return budget.result(super().call(__context, __obj, *args, **kwargs))


class _NoName(jinja2.StrictUndefined):
    """`name` for a recipient without one: false where it is tested (`{% if name %}`,
    `name or "you"`), replaced by `default` and not `defined`, but, written out, it refuses
    the recipient as any undefined variable does: "Hello ," is the mail not to send."""

    __slots__ = ()

    def __bool__(self) -> bool:  # type: ignore[override]  # (StrictUndefined's raises: not this one's)
        return False


NO_NAME_HINT: Final = (
    "'name' is undefined: the recipient has no name (give it one, or write {{ name | default(\"...\") }})"
)


def no_name() -> jinja2.Undefined:
    """The value of `name` for a recipient without one (`_NoName`)."""
    return _NoName(hint=NO_NAME_HINT, name="name")


@functools.cache
def environment(autoescape: bool) -> ImmutableSandboxedEnvironment:
    """The sandbox templates are compiled in. Strict: an undefined variable is an error for
    that recipient, not an empty string."""
    return _BoundedEnvironment(
        autoescape=autoescape,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        finalize=_finalizer(autoescape),
    )


def render(
    template: jinja2.Template,
    variables: Mapping[str, Any],
    *,
    max_output: int,
    header: bool = False,
    header_only: bool = False,
) -> str:
    """`template` rendered with `variables`, within the budgets above (`RenderLimit` if not).

    `header`: the output is a message, which starts with its header section (`HeaderBreak`
    for a value with a line break there); `header_only` also stops the render at its end."""
    budget = _Budget(max_output)
    budget.in_header = header or header_only
    token = _current.set(budget)
    pieces: list[str] = []
    # Every `_CHECK_EVERY` pieces are joined: a piece is a string of its own (80 bytes for
    # one emoji drawn from a text), and millions would hold far more than their characters.
    chunks: list[str] = []
    join_every = _CHECK_EVERY
    size = 0
    # The last characters put out (a line end before the first: an output that starts with
    # an empty line has no header), enough to see an empty line made of two pieces.
    tail = "\n"
    try:
        for piece in template.generate(variables):
            size += len(piece)
            if size > max_output:
                raise RenderLimit(f"output over {max_output} characters (the message size limit)")
            budget.tick()
            pieces.append(piece)
            if len(pieces) == join_every:
                chunks.append("".join(pieces))
                pieces.clear()
            if budget.in_header:
                seen = tail + piece
                # Line ends read as `compose` reads them: CRLF, LF or CR, mixed.
                if "\n\n" in seen.replace("\r\n", "\n").replace("\r", "\n"):
                    budget.in_header = False
                    if header_only:
                        break
                tail = seen[-3:]
    except RecursionError:
        raise RenderLimit("calls or expressions nested too deeply") from None
    except MemoryError:
        raise RenderLimit("out of memory") from None
    finally:
        _current.reset(token)
    return "".join(chunks + pieces) if chunks else "".join(pieces)
