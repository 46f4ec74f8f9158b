"""Bounded rendering: Jinja2 templates from API clients, with a budget for every render.

The sandbox stops a template from reaching Python's internals, not from working forever:
`{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}` is a
legal template that would hold the event loop for hours and make 10 GB of text. So every
render has budgets, and the first one spent ends it with `RenderLimit`:

- time: at most `MAX_RENDER_SECONDS`, checked at every call (macros included), filter,
  operator, loop step and piece of output, so no path through a template escapes it;
- size: no value (string, list) longer than the output limit, estimated *before* an
  operation that could make one (`*`, `+`, `~`, `%`, padding, `join`, `replace`, format
  widths) and checked after every call and filter; and at most `_MADE_FACTOR` times the
  output limit made in all, so many values under the limit cannot add up to gigabytes;
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
import math
import re
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
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
        self.made = _MADE_FACTOR * max_output
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

    def size(self, characters: int) -> None:
        """Before making a value of about `characters`: refuse one over the limits."""
        if characters > self.max_output:
            raise RenderLimit(f"a value of more than {self.max_output} characters (the output limit)")
        self.made -= characters
        if self.made < 0:
            raise RenderLimit(
                f"more than {_MADE_FACTOR * self.max_output} characters made in one render "
                f"({_MADE_FACTOR} times the output limit)"
            )

    def bits(self, bits: int) -> None:
        if bits > _MAX_INT_BITS:
            raise RenderLimit(f"a number of more than {MAX_INT_DIGITS} digits")

    def result(self, value: Any) -> Any:
        """`value`, once checked: made by a call whose cost could not be estimated before."""
        self.tick()
        if isinstance(value, int):
            self.bits(value.bit_length())
        elif isinstance(value, str | list | tuple | dict) and len(value) > self.max_output:
            raise RenderLimit(f"a value of more than {self.max_output} characters (the output limit)")
        return value


_current: contextvars.ContextVar[_Budget] = contextvars.ContextVar("render_budget")


def _budget() -> _Budget:
    """The running render's budget. Outside a render (Jinja folding constants while it
    compiles) there is none, and the error makes Jinja leave the work to the render."""
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError("not during a render") from None


def _range(*args: int) -> Iterator[int]:
    budget = _budget()
    for number in range(*args):
        budget.step()
        yield number


def _no_lipsum(*args: Any, **kwargs: Any) -> str:
    raise RenderLimit("lipsum() is not available: it makes as much text as asked, at a cost no budget sees")


def _finalize(value: Any) -> Any:
    """Every `{{ }}` output (and `{% filter %}` block), before it is made text: refused if it
    would put a line break or control character into the header section."""
    try:
        budget = _current.get()
    except LookupError:
        return value  # compiling: a literal (`{{ "a" }}`) is the template's own text
    if budget.in_header:
        text = value if isinstance(value, str) else str(value)
        if (found := NOT_IN_HEADER.search(text)) is not None:
            raise HeaderBreak(text, found.group())
    return value


@jinja2.pass_context
def _loop_steps(context: jinja2.runtime.Context, iterable: Iterable[Any]) -> Iterator[Any]:
    """What a `{% for %}` iterates: each step checks the time."""
    budget = _budget()
    for item in iterable:
        budget.tick()
        yield item


def _length(value: Any) -> int:
    return len(value) if isinstance(value, str | list | tuple) else 0


def _formatted_size(budget: _Budget, fmt: str, args: Any) -> int:
    """About how long `fmt % args` or `fmt.format(*args)` is, refusing widths and precisions
    over the output limit, whether written in `fmt` or passed as `*` arguments."""
    values = list(args.values()) if isinstance(args, Mapping) else list(args) if isinstance(args, tuple) else [args]
    numbers = [int(n) for n in _NUMBER.findall(fmt)] + [v for v in values if isinstance(v, int)]
    widest = max(numbers, default=0)
    budget.size(widest)
    longest = max([_length(v) for v in values] + [widest], default=0)
    return len(fmt) + (fmt.count("%") + fmt.count("{")) * longest


def _checked_str_method(budget: _Budget, method: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Estimates for the string methods that make more than they are given."""
    text = method.__self__
    name = method.__name__
    if name == "join":
        items = list(args[0]) if args and not isinstance(args[0], list | tuple | str) else args[0] if args else []
        budget.size(len(text) * max(len(items) - 1, 0) + sum(_length(i) for i in items))
        return (items, *args[1:])
    if name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        found = text.count(args[0]) if args[0] else len(text) + 1
        if len(args) > 2 and isinstance(args[2], int) and args[2] >= 0:
            found = min(found, args[2])
        budget.size(len(text) + found * max(len(args[1]) - len(args[0]), 0))
    elif name == "expandtabs" and args and isinstance(args[0], int):
        budget.size(len(text) + text.count("\t") * args[0])
    elif name in ("format", "format_map"):
        budget.size(_formatted_size(budget, text, args[0] if name == "format_map" and args else args))
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


def _estimate_filter(budget: _Budget, name: str, args: list[Any], kwargs: dict[str, Any]) -> None:
    text = args[0] if args and isinstance(args[0], str) else ""
    if name == "indent":
        width = args[1] if len(args) > 1 else kwargs.get("width", 4)
        budget.size(len(text) + (text.count("\n") + 1) * (width if isinstance(width, int) else _length(width)))
    elif name == "wordwrap":
        width = args[1] if len(args) > 1 else kwargs.get("width", 79)
        wrap = args[4] if len(args) > 4 else kwargs.get("wrapstring") or "\n"
        lines = len(text) // max(width if isinstance(width, int) else 1, 1) + text.count("\n") + 1
        budget.size(len(text) + lines * _length(wrap))
    elif name == "replace" and len(args) >= 3:
        old, new = args[1], args[2]
        found = text.count(str(old)) if str(old) else len(text) + 1
        budget.size(len(text) + found * max(_length(new) - _length(old), 0))
    elif name == "format" and args:
        budget.size(_formatted_size(budget, text, tuple(args[1:]) or kwargs))
    elif name == "join" and args:
        items = args[0] if isinstance(args[0], list | tuple | str) else []
        glue = args[1] if len(args) > 1 else kwargs.get("d", "")
        budget.size(_length(glue) * len(items) + sum(_length(i) for i in items))
    elif name in ("batch", "slice") and len(args) > 1 and isinstance(args[1], int):
        budget.size(args[1])


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
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.globals["lipsum"] = _no_lipsum
        self.globals["range"] = _range
        self.filters = {name: _bounded_filter(name, function) for name, function in self.filters.items()}
        self.loop_steps = _loop_steps

    def bounded_concat(self, join: Callable[[Iterable[Any]], str], parts: tuple[Any, ...]) -> str:
        """`~`: the parts joined, once their length is known to be within the budget."""
        budget = _budget()
        budget.tick()
        budget.size(sum(len(p) if isinstance(p, str) else len(str(p)) for p in parts))
        return join(parts)

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
                if isinstance(sequence, str | list | tuple) and isinstance(count, int):
                    budget.size(len(sequence) * count)
            return budget.result(left * right)
        if operator == "+":
            budget.size(_length(left) + _length(right))
            return budget.result(left + right)
        if isinstance(left, str):  # "%": string formatting
            budget.size(_formatted_size(budget, left, right))
        return budget.result(left % right)

    def call(__self, __context: jinja2.runtime.Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
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
        autoescape=autoescape, undefined=jinja2.StrictUndefined, keep_trailing_newline=True, finalize=_finalize
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
    return "".join(pieces)
