"""After dropping to `[node] user`, a node that could not import what it needs next says which
directory is out of the user's reach and how to let the user in, instead of failing at its next
import with a traceback. The usual case: Pigeon's virtualenv in a checkout under /root, the
system's Python (and its standard library) open to everyone."""

from __future__ import annotations

import importlib
import os
import sys
import zipfile
from pathlib import Path

import aiohttp
import pytest

from pigeon.node.privileges import interpreter_problem


def _closed(monkeypatch: pytest.MonkeyPatch, closed: Path) -> None:
    """`closed` and what is inside it out of this process's reach (as for a user that may not
    enter it), everything else open."""
    opened = os.access

    def access(path: str | os.PathLike[str], mode: int, **kwargs: object) -> bool:
        real = os.path.realpath(path)
        if real == str(closed) or real.startswith(f"{closed}{os.sep}"):
            return False
        return opened(path, mode)

    monkeypatch.setattr(os, "access", access)


def _site_packages() -> Path:
    site = Path(aiohttp.__file__).parent.parent
    stdlib = os.path.dirname(os.__file__)
    if str(site).startswith(stdlib + os.sep):
        pytest.skip(f"the packages ({site}) are inside the standard library here")
    return site


def test_a_node_of_one_process_names_its_packages_out_of_the_users_reach_and_the_way_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    site = _site_packages()
    closed = Path(os.path.realpath(site)).parent  # the virtualenv's lib/pythonX.Y, as /root would be
    _closed(monkeypatch, closed)
    said = interpreter_problem("pigeon", workers=False)
    assert said is not None
    assert said.startswith(f"the interpreter {sys.executable}"), said
    assert f", or its modules in {site}, is out of reach of the [node] user 'pigeon': " in said, said
    assert "the node loads modules from it as it runs, so that user must be able to read it" in said, said
    assert f"not under {closed}; or let that user through: setfacl -m u:pigeon:x {closed})" in said, said


def test_workers_are_refused_when_their_packages_are_out_of_the_users_reach(monkeypatch: pytest.MonkeyPatch) -> None:
    site = _site_packages()
    _closed(monkeypatch, Path(os.path.realpath(site)))
    said = interpreter_problem("pigeon")
    assert said is not None
    assert f"the workers' interpreter {sys.executable}" in said, said
    assert f", or its modules in {site}, is out of reach of the [node] user 'pigeon': " in said, said
    assert f"(let that user read it: setfacl -m u:pigeon:rx {os.path.realpath(site)})" in said, said


def test_nothing_is_said_when_everything_is_within_reach() -> None:
    assert interpreter_problem("pigeon", workers=False) is None
    assert interpreter_problem("pigeon") is None


def test_modules_imported_from_a_zip_file_on_the_path_need_it_readable_not_executable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "bundle.zip"
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.writestr("pigeon_zipped_probe.py", "VALUE = 1\n")
    archive.chmod(0o644)
    monkeypatch.syspath_prepend(str(archive))
    monkeypatch.delitem(sys.modules, "pigeon_zipped_probe", raising=False)
    importlib.import_module("pigeon_zipped_probe")
    try:
        assert interpreter_problem("pigeon", workers=False) is None
    finally:
        del sys.modules["pigeon_zipped_probe"]
