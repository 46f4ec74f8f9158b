"""`pigeon serve`: run a node until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import logging
import os
import resource
import socket
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from pigeon.cli.common import add_config_option
from pigeon.config.load import (
    ConfigError,
    cannot_make,
    directories,
    key_error,
    load,
    load_text,
    read_text,
    unwritable_directory,
)
from pigeon.config.patterns import host_port
from pigeon.config.schema import Config
from pigeon.node import handed, signals
from pigeon.node.lock import NodeLocked, take_node_lock
from pigeon.node.parent_death import ParentGone, follow_parent
from pigeon.node.privileges import (
    PrivilegeError,
    check_problem,
    drop,
    give_directories,
    groups_of,
    make_directory,
    plan,
    problem_as,
)
from pigeon.node.scheduling import apply_scheduling
from pigeon.node.sockets import Bound, ListenError, adopt, bind, record_http_address
from pigeon.redaction import RedactingFormatter, redact

EXAMPLES = """examples:
  pigeon serve                      # defaults: SMTP 127.0.0.1:2525, HTTP 127.0.0.1:8025, data in ./var
  pigeon serve -c /etc/pigeon.toml
  pigeon serve --check -c /etc/pigeon.toml   # check the file (and policy module), start nothing
"""


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "serve",
        help="run a Pigeon node",
        description="Run a Pigeon node in the foreground until SIGTERM or SIGINT.\n\n"
        'With [node] workers above 1 ("auto", the default: one per CPU it may use, but one)\n'
        "this process supervises that many worker processes.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_option(parser)
    parser.add_argument(
        "--check",
        action="store_true",
        help="load and check the configuration (and import the policy module) as a start would, print "
        '"ok" or the error, exit 0 or 2; start nothing',
    )
    # Used by the supervisor to start its workers; not for people.
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--control", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--smtp-fd", type=int, action="append", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--supervisor", type=int, help=argparse.SUPPRESS)  # its pid: stop when it dies
    # The config's texts come on stdin (`pigeon.node.handed`); -c still names the file they are
    # of (relative paths, messages, later SIGHUPs).
    parser.add_argument("--config-stdin", action="store_true", help=argparse.SUPPRESS)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    # The node is imported here, not with the module: every other command's start (`pigeon
    # queue summary`, `pigeon logs`) would otherwise wait a second for it. And only the part
    # this process runs (below): a worker needs no supervisor, a supervisor no node.
    from pigeon.listener.passwords import PasswordFileError
    from pigeon.policy.hooks import Policy, PolicyLoadError
    from pigeon.spool.spool import SpoolError

    if args.check:
        return _check(args)
    # SIGHUP, SIGTERM and SIGINT are held (`main`) until the loop handles them: see `pigeon.node.signals`.
    if args.supervisor is not None:
        try:
            follow_parent(args.supervisor)
        except (ParentGone, OSError) as error:
            return _cannot_start(args, str(error))
    start_text: str | None = None  # the supervisor's: the file's text it read
    reloaded_text: str | None = None  # a worker's: the text of the node's last reload, to take at once
    if args.worker is not None:
        # A worker runs the configuration the node runs, which its supervisor hands it: the file
        # may have changed since the node started (`pigeon.node.handed`).
        try:
            if args.config_stdin:
                if args.config is None:
                    return _cannot_start(args, "--config-stdin needs -c, the file the texts are of")
                texts = handed.read(sys.stdin.buffer)
                # The files a reload takes are read from the reloaded text (`Node._take_handed`),
                # before the worker serves: the start-time text's may be gone by now.
                config = load_text(texts.start, args.config, replaced_by_reload=texts.reloaded is not None)
                reloaded_text = texts.reloaded
            else:
                config = load(args.config)
        except ConfigError as error:
            return _cannot_start(args, f"configuration error: {redact(str(error))}", status=2)
        except (ValueError, OSError) as error:
            return _cannot_start(args, f"the configuration its supervisor handed it cannot be read: {error}")
    else:
        config, start_text = _load_with_text(args)
    if args.worker is None and config.node.worker_count > 1:
        # Imported before the privileges are dropped: the user the node runs as may not reach
        # the interpreter's own library, which the supervisor checks and says in words.
        import pigeon.node.supervisor  # noqa: F401
    role = f"w{args.worker}" if args.worker is not None else "main"
    # Every line through `redact`: a library's error may quote a configured URL, password and all.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(RedactingFormatter(f"%(asctime)s {role} %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=config.log.level.upper(), handlers=[handler])
    # Libraries log every line of the IMAP and Redis conversations at DEBUG, message contents
    # and passwords included (and aioimaplib routine replies at INFO): ours say what matters.
    for chatty in ("aioimaplib", "redis", "asyncpg"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    _raise_open_file_limit()
    # Before any thread or child starts: they inherit it.
    apply_scheduling(config.node.scheduling)
    listening: Bound | None = None
    if args.worker is None:
        try:
            # The lock stays open (held) until this process exits.
            _node_lock, listening = _claim(config, args.config, start_text)
        except ConfigError as error:  # a [spool] path or [log] path that cannot be made
            print(f"pigeon: cannot start: configuration error: {redact(str(error))}", file=sys.stderr)
            return 2
        except (PrivilegeError, NodeLocked, OSError) as error:
            print(f"pigeon: cannot start: {error}", file=sys.stderr)
            return 1
        try:
            record_http_address(config.spool.path, listening.http[0])  # (for the `pigeon` command)
        except OSError:
            pass  # a full disk: the node starts all the same, and the command reads the config
    # Spooled mail, logs and keys are nobody else's business: files private to this user.
    os.umask(0o077)
    if args.worker is None and config.redis.url is not None:
        # After the node lock: an entry of this spool's in Redis is then this node's, from a
        # run that died. Imported here: a node without Redis need not load its client.
        from pigeon.node.presence import check_name

        refused = check_name(config)
        if refused is not None:
            print(f"pigeon: cannot start: {refused}", file=sys.stderr)
            return 2
    if args.worker is None and config.policy.module is not None and config.node.worker_count != 1:
        # Loaded here once (as the user it will run as) so a broken module stops the start
        # with its reason, rather than every worker failing one by one. Misspelt hook names
        # are left to the node's worker 0 to warn about (it loads the module again, as it
        # does at every reload): said here too, each would be said twice. A node of one
        # process loads it once, as it starts (below): its module's code runs once.
        try:
            with signals.stoppable():  # its import may take long: a stop meanwhile stops it
                Policy.from_config(config.policy, warn=False, config_path=args.config).close()
        except PolicyLoadError as error:  # the module [policy] names: exit 2, as for the rest of the config
            print(f"pigeon: cannot start: {error}", file=sys.stderr)
            return 2
        except signals.Stopped as stopped:
            return _stopped_starting(stopped, config.policy.module)
    main: Coroutine[Any, Any, None]
    try:
        if args.worker is not None:
            from pigeon.node.node import Node

            inherited = Bound(smtp=adopt(args.smtp_fd), http=[]) if args.smtp_fd else None
            worker = Node(
                config,
                worker=args.worker,
                workers=args.workers,
                control_socket=args.control,
                config_path=args.config,
                listening=inherited,
                reloaded_text=reloaded_text,
            )
            main = worker.run()
        elif config.node.worker_count == 1:
            from pigeon.node.node import Node

            main = Node(config, config_path=args.config, listening=listening).run(notify=True)
        else:
            from pigeon.node.supervisor import Supervisor

            main = Supervisor(config, args.config, config.node.worker_count, listening, start_text).run()
        _run_loop(main)
    except signals.Stopped as stopped:  # during a worker's (or a lone node's) import of the policy
        return _stopped_starting(stopped, config.policy.module)
    except PolicyLoadError as error:  # the module [policy] names: exit 2, as for the rest of the config
        return _cannot_start(args, redact(str(error)), status=2)
    except ConfigError as error:  # what only the user it runs as can check (a DKIM key it cannot read)
        return _cannot_start(args, f"configuration error: {redact(str(error))}", status=2)
    except (SpoolError, PasswordFileError, OSError, RuntimeError) as error:
        return _cannot_start(args, redact(str(error)))
    except Exception as error:
        # A bug: the traceback follows, and the supervisor says at least what it was.
        _tell_supervisor(args, f"unexpected error: {redact(repr(error))}")
        raise
    return 0


def _check(args: argparse.Namespace) -> int:
    """`--check`: what a start checks before it takes anything (the whole configuration, the
    files it names, `[node] user`'s reach of the interpreter, the policy module's import) and
    what it can tell of the spool and log directories without making them (`unwritable_directory`),
    said, and nothing started: no lock, no listener, no spool. Every warning a start says of the
    configuration is said too (`config_warnings`), and of the policy module (`Policy.warnings`).
    Exit 0 (warnings or none), or 2 with the error, as a start refused for it would."""
    from pigeon.node.config_warnings import config_warnings
    from pigeon.node.exposure import Exposure
    from pigeon.policy.hooks import Policy, PolicyLoadError

    signals.started()  # (ending of its own accord: no start-up to bound)
    config, text = _load_with_text(args)
    try:
        # Before the policy module's import, as a start asks it: before it imports anything more.
        problem = check_problem(config.node, workers=config.node.worker_count > 1)
    except PrivilegeError as error:
        problem = str(error)
    if problem is not None:  # (a start exits 1 on it; the check's errors are all 2)
        print(f"pigeon: cannot start: {problem}", file=sys.stderr)
        return 2
    if (unwritable := unwritable_directory(config, args.config, text)) is not None:
        print(f"pigeon: configuration error: {redact(str(unwritable))}", file=sys.stderr)
        return 2
    policy_warnings: tuple[str, ...] = ()
    if config.policy.module is not None:
        try:
            policy = Policy.from_config(config.policy, config_path=args.config)
        except PolicyLoadError as error:
            print(f"pigeon: configuration error: {redact(str(error))}", file=sys.stderr)
            return 2
        policy.close()
        policy_warnings = policy.warnings
    # Files others may read, judged as for the user the node will run as (its groups).
    exposure = Exposure(groups_of(config.node))
    # In the order a start says them: the module's once it is loaded, after the configuration's.
    for warning in [*config_warnings(config, args.config, exposure, start=True), *policy_warnings]:
        print(f"pigeon: warning: {warning}", file=sys.stderr)
    print(f"{args.config if args.config is not None else 'the defaults (no -c)'}: ok")
    return 0


def _load_with_text(args: argparse.Namespace) -> tuple[Config, str | None]:
    """The configuration and the file's text it was loaded from (None: no file, the defaults),
    or exit 2 with the loader's message, as `pigeon.cli.common.load_config` does."""
    try:
        if args.config is None:
            return load(None), None
        text = read_text(args.config)
        # The node's own start (never a worker's): a [[source]] address it cannot bind stops it.
        return load_text(text, args.config, first_start=True), text
    except ConfigError as error:
        print(f"pigeon: configuration error: {redact(str(error))}", file=sys.stderr)
        raise SystemExit(2) from None


def _stopped_starting(stopped: signals.Stopped, module: str | None) -> int:
    """A stop while the policy module was being imported: an ordinary stop (exit 0)."""
    signals.started()  # ending of its own accord: the watch on the start-up has nothing to end
    logging.getLogger(__name__).info(
        "%s while importing the policy module %s: stopped during start-up", stopped, module
    )
    return 0


def _cannot_start(args: argparse.Namespace, reason: str, *, status: int = 1) -> int:
    """Say why on stderr (and, in a worker, to the supervisor); the exit status to return."""
    who = f"worker {args.worker}: " if args.worker is not None else ""
    print(f"pigeon: {who}cannot start: {reason}", file=sys.stderr)
    _tell_supervisor(args, reason)
    return status


def _tell_supervisor(args: argparse.Namespace, reason: str) -> None:
    """A worker's reason for exiting, where its supervisor reads it (`failure_path`): its
    message of the worker's exit then says why, not only the status."""
    if args.control is None:
        return
    from pigeon.node.supervisor import failure_path

    with contextlib.suppress(OSError):
        failure_path(args.control).write_text(reason + "\n", encoding="utf-8")


def _raise_open_file_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit: every SMTP connection is a descriptor, and the
    usual soft default (1024) is below `[smtp] max_connections`. Past it, accept() fails with
    EMFILE and new clients wait in the backlog unanswered. Workers inherit the raised limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as error:
            logging.getLogger(__name__).warning("open files limit stays at %d: %s", soft, error)


def _claim(config: Config, path: Path | None = None, text: str | None = None) -> tuple[int, Bound]:
    """Take the node lock, bind every listener and, started as root with `[node] user`, give
    the spool and log directories to the user and become it. Returns the lock's descriptor
    (held until exit) and the sockets bound, which this process serves or hands to its workers.
    The spool and log directories are made first (as root, then given to the user), and one
    that cannot be is a ConfigError naming its key (in the file `path`, of text `text`).

    The sockets are bound here, once, without SO_REUSEPORT: a second node on the same
    address fails to bind ("address in use") instead of sharing the port and taking half the
    connections, and the workers accept on the one socket they inherit. The lock comes first,
    so a second node on the same spool names the lock rather than a port; except as root with
    a user to become: root may lack the right to create files in the user's spool (systemd's
    capability set has no CAP_DAC_OVERRIDE), so the lock is taken as the user, after the binds."""
    run_as = plan(config.node)
    if run_as is not None:
        # Before anything is bound, made or given to the user: a start that stops on it leaves
        # nothing behind. Asked as the user, by a child that becomes it: what the node imports
        # from the drop on (all of it, with one process) must be within its reach, or an import
        # fails mid-start with a traceback instead of this.
        problem = problem_as(run_as, workers=config.node.worker_count > 1)
        if problem is not None:
            raise PrivilegeError(problem)
    listening = Bound(smtp=[], http=[])
    lock: int | None = None
    try:
        if run_as is None:
            _make_directories(config, path, text, make=lambda d: d.mkdir(mode=0o700, parents=True, exist_ok=True))
            lock = take_node_lock(config.spool.path)
        for endpoint in config.smtp.listen:
            # Listened on once served: not while the node waits for room on its spool's disk.
            listening.smtp += _bind("[smtp] listen", endpoint.host, endpoint.port, listen=False)
        listening.http += _bind("[http] listen", config.http.listen.host, config.http.listen.port, listen=False)
        if run_as is not None:
            _make_directories(config, path, text, make=make_directory)  # (as root: parents 0755)
            give_directories([config.spool.path, config.log.path], run_as)
            drop(run_as)
            lock = take_node_lock(config.spool.path)
    except BaseException:
        listening.close()
        if lock is not None:
            os.close(lock)
        raise
    assert lock is not None  # taken on either path
    return lock, listening


def _make_directories(config: Config, path: Path | None, text: str | None, *, make: Callable[[Path], None]) -> None:
    """Make the spool and log directories with `make`, or raise a ConfigError naming the key of
    the one that cannot be made (in the file `path`, of text `text`): a path under /proc, or in
    a directory closed to the user, must not stop the start with an errno alone (exit 1, and
    started again and again by systemd)."""
    for keys, directory in directories(config):
        try:
            make(directory)
        except OSError as error:
            raise key_error(path, text, keys, cannot_make(directory, error)) from None


def _bind(key: str, host: str, port: int, *, listen: bool = True) -> list[socket.socket]:
    try:
        return bind(host, port, listen=listen)
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            reason = "the port is in use (by another node, or another program)"
        else:
            reason = error.strerror or str(error)
        raise ListenError(f"{key} {host_port(host, port)}: cannot listen: {reason}") from None


def _run_loop(main: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio still works
        asyncio.run(main)
        return
    uvloop.run(main)
