"""Bounded rendering: Jinja2 templates from API clients, with a budget for every render.

The sandbox stops a template from reaching Python's internals, not from working forever:
`{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}` is a
legal template that would hold the event loop for hours and make 10 GB of text. So every
render has three budgets, and the first one spent ends it with `RenderLimit`:

- output: at most `max_output` characters, counted as `generate()` streams them;
- loop steps: at most `MAX_LOOP_STEPS` items drawn from `range()` over the whole render
  (nested loops multiply, the budget does not), and no `*` or `**` whose result would be
  larger than the output budget;
- time: at most `MAX_RENDER_SECONDS`, checked at every loop step and every piece of output.

Loops over the request's own data (a recipient's list of items) are bounded by the request
size and need no budget.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator, Mapping
from typing import Any, Final

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_LOOP_STEPS: Final = 100_000
MAX_RENDER_SECONDS: Final = 1.0
_MAX_EXPONENT: Final = 1000
_BUDGET: Final = "_pigeon_budget"  # the render's budget in its context (the sandbox hides "_" names)


class RenderLimit(Exception):
    """A render spent one of its budgets; the message names the limit."""


class _Budget:
    """One render's budgets."""

    def __init__(self, max_output: int) -> None:
        self.max_output = max_output
        self.steps = MAX_LOOP_STEPS
        self.deadline = time.monotonic() + MAX_RENDER_SECONDS

    def step(self) -> None:
        self.steps -= 1
        if self.steps < 0:
            raise RenderLimit(f"more than {MAX_LOOP_STEPS} loop steps (range items) in one render")
        self.tick()

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise RenderLimit(f"rendering took longer than {MAX_RENDER_SECONDS:g}s")

    def range(self, *args: int) -> Iterator[int]:
        for number in range(*args):
            self.step()
            yield number


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with `*` and `**` checked against the render's output budget."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        budget = context.get(_BUDGET)
        limit = budget.max_output if isinstance(budget, _Budget) else MAX_LOOP_STEPS
        if operator == "**":
            if isinstance(right, int | float) and abs(right) > _MAX_EXPONENT:
                raise RenderLimit(f"exponent above {_MAX_EXPONENT}")
            return left**right
        for sequence, count in ((left, right), (right, left)):
            repeats = isinstance(sequence, str | bytes | list | tuple) and isinstance(count, int)
            if repeats and len(sequence) * count > limit:
                raise RenderLimit(f"a repeated value of more than {limit} characters (the output limit)")
        return left * right


@functools.cache
def environment(autoescape: bool) -> ImmutableSandboxedEnvironment:
    """The sandbox templates are compiled in. Strict: an undefined variable is an error for
    that recipient, not an empty string."""
    return _BoundedEnvironment(autoescape=autoescape, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def render(template: jinja2.Template, variables: Mapping[str, Any], *, max_output: int) -> str:
    """`template` rendered with `variables`, within the budgets above (`RenderLimit` if not)."""
    budget = _Budget(max_output)
    pieces: list[str] = []
    size = 0
    # `range` in the render's own context: it counts against this render's budget.
    for piece in template.generate({**variables, "range": budget.range, _BUDGET: budget}):
        size += len(piece)
        if size > max_output:
            raise RenderLimit(f"output over {max_output} characters (the message size limit)")
        budget.tick()
        pieces.append(piece)
    return "".join(pieces)
