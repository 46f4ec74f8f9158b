"""Running as `[node] user`: bind the listeners as root, then become that user for good.

Pigeon started as root binds every listener first (port 25 needs root or CAP_NET_BIND_SERVICE),
makes the spool and log directories and gives them (and whatever an earlier root run left in
them) to the user, then sets its groups, gid and uid. It drops before the event loop starts
and before any worker is started, so no process of the node runs as root once mail flows;
the workers inherit the SMTP sockets instead of binding their own.

Sharp edges: what is read after the drop (the config file, re-read by every worker and on
SIGHUP, the TLS certificate and key, the users file) must be readable by the user; listen
addresses change only with a restart, since the user cannot bind port 25 again.
"""

from __future__ import annotations

import contextlib
import grp
import logging
import os
import pwd
import stat
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pigeon.config.schema import NodeConfig

_log = logging.getLogger(__name__)


class PrivilegeError(Exception):
    """Pigeon cannot run as the configured user; the message says what to change."""


class IdentityError(PrivilegeError):
    """`[node] user` or `group` names no one on this system: a configuration error, found at
    load (`config.load`), naming the key (`key`) with `reason`."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"[node] {key}: {reason}")
        self.key = key
        self.reason = reason


@dataclass(frozen=True, slots=True)
class RunAs:
    """The identity to take: a user's name, uid and gid, and its home."""

    user: str
    uid: int
    gid: int
    home: str


def identity(node: NodeConfig) -> RunAs | None:
    """The user and group `[node]` names, looked up in the system's databases."""
    if node.user is None:
        if node.group is not None:
            raise IdentityError("group", "set [node] user as well (group alone changes nothing)")
        return None
    try:
        entry = pwd.getpwnam(node.user)
    except KeyError:
        raise IdentityError(
            "user",
            f"no user called {node.user!r} on this system "
            f"(create one: useradd --system --home-dir /var/lib/pigeon --shell /usr/sbin/nologin {node.user})",
        ) from None
    gid = entry.pw_gid
    if node.group is not None:
        try:
            gid = grp.getgrnam(node.group).gr_gid
        except KeyError:
            raise IdentityError("group", f"no group called {node.group!r} on this system") from None
    return RunAs(node.user, entry.pw_uid, gid, entry.pw_dir)


def plan(node: NodeConfig) -> RunAs | None:
    """Whom to become: the configured user when started as root, None when nothing is to change.

    Raises `PrivilegeError` when started as a third user, who cannot switch: running on as that
    user would leave files the configured one cannot read.
    """
    run_as = identity(node)
    uid = os.geteuid()
    if run_as is None:
        if uid == 0:
            _log.warning(
                "running as root: every process of this node keeps full privileges; "
                'set [node] user = "pigeon" (a system user) to drop them after binding the ports'
            )
        return None
    if uid == run_as.uid and (os.getegid() == run_as.gid or uid != 0):
        return None
    if uid != 0:
        raise PrivilegeError(
            f"[node] user = {run_as.user!r}: started as uid {uid}, which cannot switch users; "
            f"start pigeon as root (it drops to {run_as.user} after binding its ports) or as {run_as.user}"
        )
    return run_as


def give_directories(directories: Iterable[Path], run_as: RunAs) -> None:
    """Make each directory (mode 0700) and give it, and everything in it, to the user.

    Missing parents are made as root with mode 0755, so the user can reach its directories.
    Files an earlier run as root left behind change owner too, or the user could not open them.
    Raises `PrivilegeError` when a directory is a symbolic link or belongs to a third user.
    """
    for directory in directories:
        make_directory(directory)
        _chown_tree(directory, run_as)


def make_directory(directory: Path) -> None:
    """Make `directory` as `give_directories` does (mode 0700, missing parents 0755), if it is
    not there: OSError if it cannot be."""
    for parent in reversed(directory.parents):
        if not parent.exists():
            parent.mkdir(mode=0o755)
    if not directory.exists():
        directory.mkdir(mode=0o700)


# Opening a directory entry this way fails (ELOOP, ENOTDIR) unless the entry itself is a
# directory at the moment of the open: a symlink swapped in is never followed, a FIFO never
# blocks the open.
_OPEN_DIRECTORY: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# The spool is a few levels deep; anything deeper was not made by Pigeon and is left alone,
# which also bounds the descriptors the walk holds (one per level).
_MAX_DEPTH: Final = 16


def _chown_tree(top: Path, run_as: RunAs) -> None:
    """Give `top` and what is in it to the user, as root, in a directory the user controls.

    The user can rename, swap and link entries while this runs, so nothing here follows a
    path name more than one component deep: each directory is opened by its parent's
    descriptor without following symlinks, and each entry changes owner by (directory
    descriptor, name) without following symlinks. Whatever the user swaps in, only entries
    of the spool itself change owner.
    """
    try:
        top_fd = os.open(top, _OPEN_DIRECTORY)
    except OSError as error:
        raise PrivilegeError(f"{top}: cannot open it as a directory ({error.strerror}); "
                             "it must be a real directory, not a symbolic link") from None  # fmt: skip
    try:
        owner = os.fstat(top_fd).st_uid
        if owner not in (0, run_as.uid):
            raise PrivilegeError(
                f"{top}: belongs to uid {owner}, neither root nor {run_as.user}; "
                f"give it to {run_as.user} (chown -R {run_as.user} {top}) or choose another path"
            )
        if owner != run_as.uid or os.fstat(top_fd).st_gid != run_as.gid:
            os.fchown(top_fd, run_as.uid, run_as.gid)
        _chown_entries(top_fd, str(top), run_as, depth=1)
    finally:
        os.close(top_fd)


def _chown_entries(directory_fd: int, shown: str, run_as: RunAs, depth: int) -> None:
    for name in os.listdir(directory_fd):
        try:
            status = os.stat(name, dir_fd=directory_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue  # gone since the listing
        is_directory = stat.S_ISDIR(status.st_mode)
        if (status.st_uid, status.st_gid) != (run_as.uid, run_as.gid):
            if not is_directory and status.st_nlink > 1:
                # Another name of this file may live outside the spool: giving it away would
                # give that away too.
                _log.warning("%s/%s: has %d links; not giving it to %s", shown, name, status.st_nlink, run_as.user)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.chown(name, run_as.uid, run_as.gid, dir_fd=directory_fd, follow_symlinks=False)
        if not is_directory:
            continue
        if depth >= _MAX_DEPTH:
            _log.warning("%s/%s: deeper than %d levels; left as it is", shown, name, _MAX_DEPTH)
            continue
        try:
            child_fd = os.open(name, _OPEN_DIRECTORY, dir_fd=directory_fd)
        except OSError:
            continue  # swapped for a symlink or other file since the stat: not ours to walk into
        try:
            _chown_entries(child_fd, f"{shown}/{name}", run_as, depth + 1)
        finally:
            os.close(child_fd)


def interpreter_problem(user: str | None, *, workers: bool = True) -> str | None:
    """Why this process cannot go on as the user it runs as, `[node] user` when given: the
    interpreter, or a directory it imports modules from, out of that user's reach. Asked after
    the drop, with the kernel's own rules (`os.access`: every directory on the way, ACLs).

    With `workers`, for a supervisor about to start each worker again as that user: it must
    also execute the interpreter (an execve that fails says only "Permission denied"). Without,
    for a node of one process: it imports as it runs (the node itself, the Redis client, a
    DKIM or TLS library, the standard library's codecs), each when first needed, and an import
    that fails then would be a traceback instead of this.
    """
    who, that = (f"the [node] user {user!r}", "that user") if user is not None else (f"uid {os.getuid()}", "it")
    interpreter = sys.executable
    real = os.path.realpath(interpreter)
    if real != interpreter:
        interpreter += f" ({real})"
    stdlib = os.path.dirname(os.__file__)
    needed = [(sys.executable, os.X_OK)] if workers else []
    for entry in _import_directories(stdlib):  # a zip file on the path is read, not entered
        needed.append((entry, os.R_OK | os.X_OK if not entry.endswith((".zip", ".pyz")) else os.R_OK))
    for path, mode in needed:
        if os.access(path, mode):
            continue
        if path == sys.executable:
            part = ""
        elif path == stdlib:
            part = f", or its standard library {path},"
        else:
            part = f", or its modules in {path},"
        if workers:
            what = f"the workers' interpreter {interpreter}{part} is out of reach of {who}: {that} must be able to "
            what += "read and execute it"
        else:
            what = f"the interpreter {interpreter}{part} is out of reach of {who}: the node loads modules from "
            what += f"it as it runs, so {that} must be able to read it"
        name = user if user is not None else str(os.getuid())
        blocked = _closed_on_the_way(path)
        if blocked is not None:
            fix = (
                f"put Python, Pigeon and its virtualenv where {that} can: not under {blocked}; "
                f"or let {that} through: setfacl -m u:{name}:x {blocked}"
            )
        else:
            fix = f"let {that} read it: setfacl -m u:{name}:rx {os.path.realpath(path)}"
        return f"{what}, and to enter every directory on its way ({fix})"
    return None


def problem_as(run_as: RunAs, *, workers: bool) -> str | None:
    """`interpreter_problem` as `run_as` finds it, asked by a child process that becomes that
    user (the kernel's own rules: its groups, ACLs) while this one stays root: a start asks it
    before it makes or gives anything, so one that stops on it leaves no spool or log directory
    given to the user behind; `pigeon serve --check`, which becomes no one, asks it too.
    Raises `PrivilegeError` when the child cannot become the user or answer."""
    reading, writing = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child (coverage does not follow it): answers, then exits
        status = 1
        try:
            os.close(reading)
            os.initgroups(run_as.user, run_as.gid)
            os.setgid(run_as.gid)
            os.setuid(run_as.uid)
            problem = interpreter_problem(run_as.user, workers=workers)
            with os.fdopen(writing, "wb") as answer:
                answer.write((problem or "").encode())
            status = 0
        finally:
            os._exit(status)  # nothing of the parent's (its atexit, its buffers) runs twice
    os.close(writing)
    with os.fdopen(reading, "rb") as answer:
        said = answer.read().decode()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise PrivilegeError(
            f"[node] user = {run_as.user!r}: cannot check as that user that it can reach the interpreter "
            f"{sys.executable} (a process that became it exited with status {os.waitstatus_to_exitcode(status)})"
        )
    return said or None


def check_problem(node: NodeConfig, *, workers: bool) -> str | None:
    """For `pigeon serve --check`: what a start of this process's user would stop on because
    `[node] user` cannot reach the interpreter (`problem_as`), as root starting a node that
    drops to it. Nothing to ask started as the user itself (it runs this interpreter) or as a
    third user (who cannot switch: which user starts the node, the check cannot know)."""
    run_as = identity(node)
    if run_as is None or os.geteuid() != 0 or run_as.uid == 0:
        return None
    return problem_as(run_as, workers=workers)


def groups_of(node: NodeConfig) -> frozenset[int] | None:
    """The groups the node's processes will have, started by this process's user: those of
    `[node] user` as root drops to it; None: this process's own (it runs as them)."""
    run_as = identity(node)
    if run_as is None or os.geteuid() != 0:
        return None
    return frozenset(os.getgrouplist(run_as.user, run_as.gid))


def _import_directories(stdlib: str) -> list[str]:
    """The directories of `sys.path` this process imported modules from (the standard
    library's first): where it, and a worker started with the same path, will import from."""
    entries = sorted({os.path.abspath(entry or os.curdir) for entry in sys.path}, key=len, reverse=True)
    used = {stdlib}
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if name == "__main__" or not isinstance(origin, str):
            continue  # the script that started it (in the virtualenv's bin): not imported again
        found = next((entry for entry in entries if origin.startswith(entry.rstrip(os.sep) + os.sep)), None)
        if found is not None:
            used.add(found)
    in_order = [os.path.abspath(entry or os.curdir) for entry in sys.path]
    return [stdlib, *(entry for entry in dict.fromkeys(in_order) if entry in used and entry != stdlib)]


def _closed_on_the_way(path: str) -> str | None:
    """The first directory on the way to `path` (symbolic links followed) that this process
    may not enter, if any."""
    for directory in reversed(Path(os.path.realpath(path)).parents):
        if not os.access(directory, os.X_OK):
            return str(directory)
    return None


def drop(run_as: RunAs) -> None:
    """Become the user for good: supplementary groups, gid, then uid (the order matters: once
    the uid is not 0, the groups can no longer change)."""
    os.initgroups(run_as.user, run_as.gid)
    os.setgid(run_as.gid)
    os.setuid(run_as.uid)
    if run_as.uid != 0:
        try:
            os.setuid(0)
        except PermissionError:
            pass
        else:  # pragma: no cover - the kernel refuses this after setuid() from root
            raise PrivilegeError(f"dropped to {run_as.user} but could become root again; refusing to run")
    os.environ.update(HOME=run_as.home, USER=run_as.user, LOGNAME=run_as.user)
    _log.info("running as %s (uid %d, gid %d)", run_as.user, run_as.uid, run_as.gid)
