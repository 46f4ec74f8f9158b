"""In the modules mypyc compiles (setup.py COMPILED), a name an `except ... as NAME` of a
function first binds to a compiled exception class is bound to no other class after it.

Compiled, a function's local has one type, the type of its first binding: an exception caught
as `error` by `except SpoolError as error` makes `error` a SpoolError, and a later `except
SignerRefused as error` in the same function then fails at the binding, `TypeError:
pigeon.spool.spool.SpoolError object expected; got pigeon.dkim.signer.SignerRefused`, where
Python takes it. Found when the spool became compiled (its SpoolError then a native class):
a DKIM signer a policy named that could not sign closed the client's connection instead of
answering 451. Classes mypyc does not compile are typed `object`, and take anything: a name
first bound to one of them (`DnsFailure`, `OSError`) may be bound to any class after.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _compiled_sources() -> list[Path]:
    return [ROOT / path for path in re.findall(r'"(src/pigeon/[a-z_/]+\.py)"', (ROOT / "setup.py").read_text())]


def _exception_classes(sources: list[Path]) -> set[str]:
    """The exception classes the compiled modules define (compiled as native classes)."""
    trees = [ast.parse(source.read_text()) for source in sources]
    classes = {node.name: node for tree in trees for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    found: set[str] = set()

    def is_exception(name: str, seen: frozenset[str] = frozenset()) -> bool:
        if name in found or (name.endswith(("Error", "Exception")) and name not in classes):
            return True
        node = classes.get(name)
        if node is None or name in seen:
            return False
        return any(is_exception(ast.unparse(base).rpartition(".")[2], seen | {name}) for base in node.bases)

    for name in classes:
        if is_exception(name):
            found.add(name)
    return found


def test_a_handler_name_is_bound_to_one_exception_class_where_one_is_compiled() -> None:
    sources = _compiled_sources()
    native = _exception_classes(sources)
    assert {"SpoolError", "ConnectFailed", "ConnectionLost"} <= native  # (the scan sees them)
    mixed = []
    for source in sources:
        for function in ast.walk(ast.parse(source.read_text())):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            bound: dict[str, list[str]] = {}
            handlers = [node for node in ast.walk(function) if isinstance(node, ast.ExceptHandler)]
            for handler in sorted(handlers, key=lambda node: (node.lineno, node.col_offset)):
                if handler.name and handler.type is not None:
                    bound.setdefault(handler.name, []).append(ast.unparse(handler.type))
            for name, (first, *later) in bound.items():
                if first.rpartition(".")[2] in native and any(kind != first for kind in later):
                    where = f"{source.relative_to(ROOT)}:{function.lineno} {function.name}"
                    mixed.append(f"{where}: {name!r} is first bound to {first}, then to {later}")
    assert not mixed, "give each its own name:\n" + "\n".join(mixed)
