"""In the modules mypyc compiles (setup.py COMPILED), no `except` handler and no `finally`
block awaits, and `async with` is only `asyncio.timeout()`.

Compiled, a coroutine keeps the exception it handles in the thread's sys.exc_info(), not in a
frame of its own as Python does, and:

* a `finally` block that awaits decides, once its body is done, whether to raise again by
  reading sys.exc_info(): when some other task left an exception there, a `finally` that ran
  for no exception raises that one;
* an exception that runs through such a `finally` stays in sys.exc_info() for good, for every
  other task to meet;
* a handler that awaits sets sys.exc_info() back, once done, to what it held when the handler
  began, which may by then be stale (an exception thrown into the task, handled since).

Found from outside: after one failed STARTTLS handshake (`ClientConnection.open` tried the
clear from inside its `except _HandshakeFailed`), the handshake's SSLError stayed behind, and
every later delivery task raised it at the end of its `finally` (`Dispatcher._work` closed its
connection there), "Task exception was never retrieved" at each idle close. The pure-Python
build said nothing. (tests/integration/test_delivery_after_a_failed_handshake.py shows it on
the build installed; this test holds the rule for either build.)

`asyncio.timeout()`'s `__aexit__` never suspends, so its implicit handler awaits nothing.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
COMPILED = re.findall(r'"(src/pigeon/[a-z_/]+\.py)"', (ROOT / "setup.py").read_text())


def _suspensions(nodes: list[ast.stmt]) -> list[int]:
    """The lines of the awaits in `nodes`, nested functions left out (they run elsewhere)."""
    found: list[int] = []
    todo: list[ast.AST] = list(nodes)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.Await, ast.AsyncWith, ast.AsyncFor)):
            found.append(node.lineno)
        elif isinstance(node, ast.comprehension) and node.is_async:
            found.append(node.iter.lineno)
        todo.extend(ast.iter_child_nodes(node))
    return sorted(found)


def _is_asyncio_timeout(item: ast.withitem) -> bool:
    call = item.context_expr
    return (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "timeout"
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id == "asyncio"
    )


def problems(source: str, name: str) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Try, ast.TryStar)):
            for handler in node.handlers:
                if lines := _suspensions(handler.body):
                    found.append(f"{name}:{handler.lineno}: the except handler awaits (line {lines[0]})")
            if lines := _suspensions(node.finalbody):
                found.append(f"{name}:{node.lineno}: the finally block awaits (line {lines[0]})")
        elif isinstance(node, ast.AsyncWith) and not all(_is_asyncio_timeout(item) for item in node.items):
            found.append(f"{name}:{node.lineno}: async with other than asyncio.timeout()")
    return found


def test_the_list_of_compiled_modules_is_read() -> None:
    assert "src/pigeon/delivery/dispatcher.py" in COMPILED and "src/pigeon/delivery/session.py" in COMPILED


@pytest.mark.parametrize("module", COMPILED)
def test_no_handler_or_finally_block_of_a_compiled_module_awaits(module: str) -> None:
    assert problems((ROOT / module).read_text(), module) == []


@pytest.mark.parametrize(
    "code",
    [
        "async def f():\n    try:\n        pass\n    except E:\n        await g()\n",
        "async def f():\n    try:\n        pass\n    finally:\n        await g()\n",
        "async def f():\n    try:\n        pass\n    finally:\n        if x:\n            async with g():\n"
        "                pass\n",
        "async def f():\n    try:\n        pass\n    except E:\n        return [y async for y in g()]\n",
        "async def f():\n    async with lock:\n        pass\n",
    ],
)
def test_the_check_finds_each_kind(code: str) -> None:
    assert problems(code, "m.py") != []


def test_the_check_lets_the_allowed_forms_pass() -> None:
    code = (
        "async def f():\n"
        "    try:\n        await g()\n    except E:\n        def h():\n            pass\n"
        "    finally:\n        x = 1\n"
        "    async with asyncio.timeout(5):\n        await g()\n"
    )
    assert problems(code, "m.py") == []
