"""Loading the policy module and calling its hooks, each bounded and never fatal.

`[policy] module` names a Python module (a dotted name importable from sys.path, or a path
to a .py file). Its functions with the names in `HOOKS` are the hooks; each is looked up
once, when the module is loaded, so a hook the module does not define is `None` on the
`Policy` and its callers make neither the call nor the object it would have been given.

A hook may be a plain function or a coroutine function (`async def`):

* **async** hooks run as a task, bounded by `[policy] timeout`;
* **plain** hooks run inline on the event loop by default (`sync = "inline"`): a call costs
  about a microsecond, where a hop to a thread and back costs tens of microseconds and two
  context switches (`bench/policy.py` measures both). An inline hook cannot be interrupted,
  so it must be quick: one that outlasts the timeout is logged as slow, and its answer
  still counts. `sync = "thread"` runs plain hooks on a thread pool instead, bounded by the
  timeout like async ones (a timed-out thread runs on; its answer is ignored). A hook that
  waits on the network should be async, or run on threads.

A hook that raises, answers something it may not (see `pigeon.policy.answers`), or outlasts
the timeout becomes a `HookFailed`: the caller answers `451 4.3.0` (`421` at connect, where a
refusing greeting is 421 or 554 and carries no enhanced code; on delivery paths it defers the
message or keeps the attempt's own outcome), and a `PolicyFailure` record, whose `action` is
that reply, with the traceback goes to the event log. Nothing a hook does can stop the worker,
nor can an answer that breaks the checks made of it (a `__repr__` that raises): that is the
hook's failure too, never the caller's.

"Raises" is any BaseException, not only an Exception: a hook's `sys.exit()`, a
KeyboardInterrupt or GeneratorExit it raises, an `asyncio.CancelledError` of its own (a future
it awaited was cancelled, or it raised one) would otherwise end the event loop's run (the
first two: the worker exits, a message delivered but not yet recorded is sent again after the
restart) or leave the caller waiting on a cancelled call (a message in flight for good, a
client unanswered). They come from the hook: the node's SIGINT and SIGTERM are the loop's
handlers', never raised in Python code while it serves. Not converted: the cancellation of
the hook's task by Pigeon itself (a stop, the caller's own task cancelled; the timeout's is
its own `TimeoutError`), and a threaded call `close()` dropped before a thread took it (the
hook never ran): that cancellation goes on, as asked.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import difflib
import importlib
import importlib.util
import inspect
import itertools
import logging
import signal
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any, Final, Generic, Literal, TypeAlias, TypeVar

from pigeon.config.schema import PolicyConfig
from pigeon.logs.records import PolicyFailure
from pigeon.logs.writer import LogWriter
from pigeon.policy.answers import Changes, Defer, Fail, Reclassify, Refuse, Reroute, reply_lines
from pigeon.smtp.replies import Reply

_log = logging.getLogger(__name__)

HOOKS: Final = ("on_connect", "on_mail_from", "on_rcpt_to", "on_message", "before_delivery", "on_delivery_outcome")
# Names a hook's author may well have meant another by, which spelling alone does not find
# (found from outside: on_delivery_attempt was taken for on_delivery_outcome).
_MEANT: Final = {
    "on_delivery_attempt": "before_delivery",
    "before_delivery_attempt": "before_delivery",
    "on_delivery": "before_delivery",
    "on_attempt": "before_delivery",
    "after_delivery": "on_delivery_outcome",
    "on_outcome": "on_delivery_outcome",
    "on_data": "on_message",
    "on_ehlo": "on_connect",
    "on_helo": "on_connect",
}
_ANSWERS: Final[dict[str, tuple[type, ...]]] = {
    "on_connect": (Refuse,),
    "on_mail_from": (Refuse,),
    "on_rcpt_to": (Refuse,),
    "on_message": (Refuse, Changes),
    "before_delivery": (Defer, Fail, Reroute),
    "on_delivery_outcome": (Reclassify,),
}
_HOOK_PREFIXES: Final = ("on_", "before_", "after_")  # (in lower case) of a name meant for a hook
_ACTIONS: Final = {"before_delivery": "deferred", "on_delivery_outcome": "kept"}  # others: the reply
POLICY_ERROR: Final = Reply(451, "4.3.0", ("policy error; try again later",))
POLICY_TIMEOUT: Final = Reply(451, "4.3.0", ("policy check timed out; try again later",))
# Characters of a failure's error text, and of its traceback, kept in its PolicyFailure record and
# its log line (found from outside: an exception whose str() was 5 MB made a 10 MB record line and
# 5 MB on stderr, at every message). The start says what it was; the rest is cut, with "...".
_ERROR_KEPT: Final = 2048
_TRACE_KEPT: Final = 8192
_SHOWN: Final = 200  # characters of an answer's repr in the error naming it
_file_modules = itertools.count(1)

A = TypeVar("A")


class PolicyLoadError(RuntimeError):
    """The policy module cannot be used; the message says why, on one line, with the file and line
    that raised. Its `__cause__`, if any, is the error, with a traceback from the module on."""


@dataclass(frozen=True, slots=True)
class PolicyModule:
    """A policy module imported and its hooks looked up (`Policy.prepare`), not yet in force,
    with the `[policy]` settings it was prepared for (a reload may have changed them)."""

    module: ModuleType | None  # None: no module (`[policy] module` unset, maybe by this reload)
    hooks: dict[str, Hook[Any] | None]
    spec: str | None
    sync: Literal["inline", "thread"]
    runner: _Runner
    warnings: tuple[str, ...] = ()  # what to say of the module (`Policy.prepare`'s `warn`)


@dataclass(frozen=True, slots=True)
class HookFailed:
    """A hook raised, answered what it may not, or timed out. `reply` is the client's answer."""

    reply: Reply


Verdict: TypeAlias = "A | HookFailed | None"
"""A hook's answer: one it may give, None (go on), or HookFailed."""


def at_greeting(reply: Reply) -> Reply:
    """`reply` as a greeting may refuse: a greeting is 220, 421 or 554 (RFC 5321 3.1, 4.2.3), so
    another refusal goes as the one of its class."""
    if reply.code in (421, 554):
        return reply
    return Reply(421 if reply.code < 500 else 554, reply.enhanced, reply.lines)


def refusal(verdict: Refuse | HookFailed) -> Reply:
    """The reply to a hook's `Refuse` (its enhanced code X.7.1 unless it gave one), or to its failure."""
    if isinstance(verdict, HookFailed):
        return verdict.reply
    enhanced = verdict.enhanced_code
    return Reply(verdict.code, enhanced, reply_lines(verdict.text, verdict.code, enhanced))


class _Runner:
    """What every hook of one policy shares: the timeout, the thread pool, the event log."""

    __slots__ = ("executor", "log", "tasks", "threads", "timeout")

    def __init__(self, timeout: float, threads: int | None, log: LogWriter | None) -> None:
        self.timeout = timeout
        self.threads = threads
        self.executor = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="policy") if threads else None
        self.log = log
        self.tasks: set[asyncio.Task[Any]] = set()  # running hook calls: asyncio keeps only weak references


class Hook(Generic[A]):
    """One hook of the module. Call it with the object it is given; it answers at once (a
    verdict) or, when it must wait (async, or on a thread), with a future of one."""

    __slots__ = ("_allowed", "_runner", "function", "mode", "name")

    def __init__(
        self, name: str, function: Callable[[Any], Any], mode: Literal["inline", "async", "thread"], runner: _Runner
    ) -> None:
        self.name = name
        self.function = function
        self.mode = mode
        self._runner = runner
        self._allowed = _ANSWERS[name]

    def __call__(
        self, argument: object, *, session: str | None = None, message_id: str | None = None
    ) -> Verdict[A] | asyncio.Future[Verdict[A]]:
        try:
            return self._call(argument, session, message_id)
        except Exception as error:
            # Not the hook's own raise (that is caught where it is called) but what its answer
            # made of the checks here, a `__repr__` that raises say: the hook's failure all the
            # same (found from outside: it reached the callers, a client got no reply to MAIL
            # and a delivered message was sent again at every retry).
            return self._broken(error, session, message_id)

    def _call(
        self, argument: object, session: str | None, message_id: str | None
    ) -> Verdict[A] | asyncio.Future[Verdict[A]]:
        if self.mode == "inline":
            started = time.perf_counter()
            try:
                answer = self.function(argument)
            except BaseException as error:  # a plain call: no cancellation of ours can land in it
                return self.failed(error, session, message_id)
            elapsed = time.perf_counter() - started
            if elapsed > self._runner.timeout:
                _log.warning(
                    "policy hook %s took %.3fs inline, over [policy] timeout: it held up the worker all that time; "
                    'make it async or set [policy] sync = "thread"',
                    self.name,
                    elapsed,
                )
            if answer is None:
                return None
            if inspect.isawaitable(answer):  # a plain function that hands back a coroutine
                return self._spawn(answer, session, message_id)
            return self._check(answer, session, message_id)
        if self.mode == "async":
            try:
                awaitable = self.function(argument)
            except BaseException as error:
                return self.failed(error, session, message_id)
            return self._spawn(awaitable, session, message_id)
        loop = asyncio.get_running_loop()
        return self._spawn(loop.run_in_executor(self._runner.executor, self.function, argument), session, message_id)

    def _spawn(
        self, awaitable: Awaitable[Any], session: str | None, message_id: str | None
    ) -> asyncio.Future[Verdict[A]]:
        task = asyncio.get_running_loop().create_task(self._guarded(awaitable, session, message_id))
        tasks = self._runner.tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return task

    async def _guarded(self, awaitable: Awaitable[Any], session: str | None, message_id: str | None) -> Verdict[A]:
        """`_bounded`, whose own failure (not the hook's: its answer's checks) is the hook's too:
        the future its caller waits on always ends with a verdict, or cancelled."""
        try:
            return await self._bounded(awaitable, session, message_id)
        except Exception as error:
            return self._broken(error, session, message_id)

    async def _bounded(self, awaitable: Awaitable[Any], session: str | None, message_id: str | None) -> Verdict[A]:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        # Where the hook waits when its time is up, taken just before the timeout cancels it
        # (found from outside: a PolicyFailure of "timed out" named no line, so an operator
        # could not tell which await of the hook hung, a Redis call or another).
        waiting: list[str] = []
        timeout = self._runner.timeout

        def look() -> None:
            # The chain of coroutines the hook awaits, outermost first (a task's own stack
            # shows only the frame it is suspended in, this one's).
            frames: list[tuple[FrameType, int]] = []
            awaited: object = awaitable
            while (frame := getattr(awaited, "cr_frame", None)) is not None and len(frames) < 50:
                frames.append((frame, frame.f_lineno))
                awaited = getattr(awaited, "cr_await", None)
            waiting.extend(traceback.format_list(traceback.StackSummary.extract(iter(frames))))

        look_at = loop.call_later(max(0.0, timeout - 0.002), look)
        try:
            async with asyncio.timeout(timeout) as scope:
                answer = await awaitable
        except TimeoutError as error:
            if scope.expired():
                return self.failed(None, session, message_id, waiting="".join(waiting) or None)
            return self.failed(error, session, message_id)
        except BaseException as error:
            if not _raised_by_hook(error, loop, task):
                raise
            if self.mode == "thread" and isinstance(awaitable, asyncio.Future) and awaitable.cancelled():
                raise  # a call still queued for a thread when `close()` dropped it: the hook never ran
            return self.failed(error, session, message_id)
        finally:
            look_at.cancel()
        return self._check(answer, session, message_id)

    def _check(self, answer: object, session: str | None, message_id: str | None) -> Verdict[A]:
        if answer is None or isinstance(answer, self._allowed):
            return answer  # type: ignore[return-value]
        allowed = ", ".join(kind.__name__ for kind in self._allowed)
        error = TypeError(f"{self.name} returned {shown(answer)}; it may return None or {allowed} (pigeon.policy)")
        return self.failed(error, session, message_id, show_traceback=False)

    def _broken(self, error: Exception, session: str | None, message_id: str | None) -> HookFailed:
        """The hook failed in a way the checks here did not foresee: recorded as its failure
        (`failed`), or, if even that fails, logged as it can be; the caller's answer is the
        same either way."""
        try:
            return self.failed(error, session, message_id)
        except Exception:
            _log.exception("policy hook %s failed, and its failure could not be recorded", self.name)
            reply = at_greeting(POLICY_ERROR) if self.name == "on_connect" else POLICY_ERROR
            return HookFailed(reply)

    def failed(
        self,
        error: BaseException | None,
        session: str | None,
        message_id: str | None,
        *,
        show_traceback: bool = True,
        waiting: str | None = None,
    ) -> HookFailed:
        """Log the failure (`error` None: a timeout; `waiting`: where the hook waited then, as
        a traceback's lines) and say what the client gets."""
        reply = POLICY_TIMEOUT if error is None else POLICY_ERROR
        if self.name == "on_connect":
            reply = at_greeting(reply)
            action = str(reply.code)  # as the greeting goes: without an enhanced code (RFC 2034 3)
        else:
            action = _ACTIONS.get(self.name, f"{reply.code} {reply.enhanced}")
        if error is None:
            text = f"timed out after {self._runner.timeout:g}s ([policy] timeout)"
            trace = f"The hook was waiting here (most recent call last):\n{waiting}" if waiting else None
        else:
            text = _cut("".join(traceback.format_exception_only(error)).strip(), _ERROR_KEPT)
            trace = "".join(traceback.format_exception(error)) if show_traceback else None
        whole = trace is not None and len(trace) <= _TRACE_KEPT
        if trace is not None:
            trace = _cut(trace, _TRACE_KEPT)
        where = f" (session {session})" if session else (f" (message {message_id})" if message_id else "")
        _log.error("policy hook %s failed%s: %s; %s", self.name, where, text, action)
        if whole:  # as a traceback, not a message: a message's line breaks are escaped
            _log.debug("policy hook %s traceback", self.name, exc_info=error)
        elif trace is not None:  # (one too long to show whole: the part the record keeps)
            _log.debug("policy hook %s traceback: %s", self.name, trace)
        log = self._runner.log
        if log is not None:
            log.write(
                PolicyFailure(
                    timestamp=time.time(),
                    hook=self.name,
                    error=text,
                    action=action,
                    traceback=trace,
                    session=session,
                    id=message_id,
                )
            )
        return HookFailed(reply)


def shown(value: object) -> str:
    """`repr(value)` for an error that names it: cut to a few hundred characters, and never
    raising (a hook's answer is any object of the hook's: its `__repr__` may raise, or be huge)."""
    try:
        text = repr(value)
    except Exception as error:
        kind = type(value)
        return f"<{kind.__module__}.{kind.__qualname__} object (its repr() raised {type(error).__name__})>"
    return _cut(text, _SHOWN)


def _cut(text: str, limit: int) -> str:
    """`text`, cut to `limit` characters with "..." where it is longer."""
    return text if len(text) <= limit else text[:limit] + "..."


def _raised_by_hook(error: BaseException, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any] | None) -> bool:
    """Whether `error`, out of a hook call `task` awaited on `loop`, is the hook's failure, not an
    end Pigeon asked of the task: a CancelledError while the task is being cancelled is that
    cancellation (a stop, or the caller's task cancelled: asyncio cancels the task it awaits),
    and a GeneratorExit thrown in from outside one of the task's steps is the task's coroutine
    being closed (collected unfinished). Anything else the hook raised itself, a CancelledError
    too (one of its own futures cancelled, or raised), or a thread's call handed back."""
    if isinstance(error, asyncio.CancelledError):
        return task is None or task.cancelling() == 0
    if isinstance(error, GeneratorExit):
        return task is not None and asyncio.current_task(loop) is task
    return True


class Policy:
    """The hooks of the policy module; each is None when the module does not define it.

    Every part of Pigeon that calls hooks holds this one object: `reload()` swaps the hooks
    in place, so a new connection or attempt sees the new ones.
    """

    __slots__ = (
        "_directory",
        "_runner",
        "before_delivery",
        "module",
        "on_connect",
        "on_delivery_outcome",
        "on_mail_from",
        "on_message",
        "on_rcpt_to",
        "spec",
        "sync",
        "warnings",
    )

    def __init__(
        self,
        spec: str | None = None,
        *,
        timeout: float = 2.0,
        sync: Literal["inline", "thread"] = "inline",
        threads: int = 8,
        log: LogWriter | None = None,
        directory: Path | None = None,
    ) -> None:
        """No `spec`: no policy (every hook None). Else call `load()`. `directory`: the config
        file's, where a dotted name is looked for too (`_import`)."""
        self.spec = spec
        self._directory = directory
        self.sync = sync
        self.module: ModuleType | None = None
        self.warnings: tuple[str, ...] = ()  # the module's (`prepare`), for the caller to say
        self._runner = _Runner(timeout, threads if sync == "thread" else None, log)
        self.on_connect: Hook[Refuse] | None = None
        self.on_mail_from: Hook[Refuse] | None = None
        self.on_rcpt_to: Hook[Refuse] | None = None
        self.on_message: Hook[Refuse | Changes] | None = None
        self.before_delivery: Hook[Defer | Fail | Reroute] | None = None
        self.on_delivery_outcome: Hook[Reclassify] | None = None

    def load(self, *, warn: bool = True) -> list[str]:
        """Import the module (again, on a reload) and take its hooks (`prepare`, then `take`).
        Returns the names of the hooks it defines. Raises `PolicyLoadError`, and then keeps
        the hooks it had."""
        return self.take(self.prepare(warn=warn))

    def prepare(self, *, warn: bool = True, config: PolicyConfig | None = None) -> PolicyModule:
        """Import the module as a fresh module object and look its hooks up, changing nothing
        here: a reload does this in a thread (the import may take long), then `take`s the
        result on the loop. Raises `PolicyLoadError`.

        `config`: the `[policy]` a reload read, whose module, timeout, sync and threads are
        prepared instead of this policy's own (none of them waits for a restart: found from
        outside, a `[policy]` section added to a running node was said to wait for one, while
        an edit of the module's code did not). Its module None: no policy (every hook None).

        `warn`: find what to warn of (its `warnings`): each function named like a hook that is
        none (`on_mesage`, `On_Connect`), each module beside it that its `import` cannot reach.
        They are said by the caller, as the configuration's warnings are (logged by the node,
        `pigeon: warning: ...` by `serve --check`), and by one process of a node only: every
        process loads the module."""
        spec, sync, runner = self.spec, self.sync, self._runner
        if config is not None:
            spec, sync = config.module, config.sync
            threads = config.threads if sync == "thread" else None
            if (config.timeout, threads) != (runner.timeout, runner.threads):
                runner = _Runner(config.timeout, threads, runner.log)  # (its threads start at its first call)
        if spec is None:
            none: dict[str, Hook[Any] | None] = dict.fromkeys(HOOKS)
            return PolicyModule(None, none, None, sync, runner)
        module = _import(spec, self._directory)
        warnings: list[str] = []
        beside = _beside(spec, self._directory) if warn else None
        for entry, elsewhere in shadowed(*beside) if beside is not None else ():
            # (a script of the operator's there, a DNS server called dns.py, is not run either)
            warnings.append(
                f"policy {spec}: {entry} is not what `import {entry.stem}` imports: {elsewhere} is (Python's "
                "modules and those installed come first); a module of the policy's own needs a name of its own"
            )
        hooks: dict[str, Hook[Any] | None] = {}
        for name in HOOKS:
            function = getattr(module, name, None)
            if function is None:
                hooks[name] = None
                continue
            if not callable(function):
                raise PolicyLoadError(f"policy {spec}: {name} is not a function")
            if (problem := _call_problem(function)) is not None:
                # Found now, not as a TypeError at every call (every message, every attempt).
                raise PolicyLoadError(f"policy {spec}: {name}{problem}; Pigeon calls it with one argument")
            mode: Literal["inline", "async", "thread"] = "async" if inspect.iscoroutinefunction(function) else sync
            hooks[name] = Hook(name, function, mode, runner)
        for name in dir(module) if warn else ():
            # In any case: a hook is looked up by its exact name (found from outside: On_Connect, never
            # called, was said nothing of).
            lowered = name.lower()
            if lowered.startswith(_HOOK_PREFIXES) and name not in HOOKS and callable(getattr(module, name)):
                close = [_MEANT[lowered]] if lowered in _MEANT else difflib.get_close_matches(lowered, HOOKS, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                warnings.append(
                    f"policy {spec}: {name} is not a hook name and is never called{hint}; "
                    f"the hooks are {', '.join(HOOKS)}"
                )
        return PolicyModule(module, hooks, spec, sync, runner, tuple(warnings))

    def take(self, prepared: PolicyModule) -> list[str]:
        """The hooks `prepare` found, from now on (on the loop): a new connection or attempt
        calls them, under the settings they were prepared for; the module is the one
        `sys.modules` names from now on (the previous one, if it came from a file or is
        no longer the policy, is forgotten). Returns the names of the hooks it defines."""
        previous, module = self.module, prepared.module
        if previous is not None and (module is None or previous.__name__ != module.__name__):
            sys.modules.pop(previous.__name__, None)
        if module is not None:
            sys.modules[module.__name__] = module  # dataclasses and pickling look their module up there
        self.module = module
        self.spec, self.sync = prepared.spec, prepared.sync
        self.warnings = prepared.warnings
        if prepared.runner is not self._runner:
            # Calls already handed to the old threads still run (and are waited for as they were).
            replaced, self._runner = self._runner, prepared.runner
            if replaced.executor is not None:
                replaced.executor.shutdown(wait=False)
        for name, hook in prepared.hooks.items():
            setattr(self, name, hook)
        return [name for name, hook in prepared.hooks.items() if hook is not None]

    def defined(self) -> list[str]:
        """The names of the hooks the module defines."""
        return [name for name in HOOKS if getattr(self, name) is not None]

    @classmethod
    def from_config(
        cls, config: PolicyConfig, log: LogWriter | None = None, *, warn: bool = True, config_path: Path | None = None
    ) -> Policy:
        """The policy `[policy]` describes, loaded (`warn`: see `prepare()`; its `warnings` then
        say them); `config_path`: the file it is from (None: its defaults). Raises `PolicyLoadError`."""
        directory = None if config_path is None else config_path.absolute().parent
        threads = config.threads
        policy = cls(
            config.module, timeout=config.timeout, sync=config.sync, threads=threads, log=log, directory=directory
        )
        policy.load(warn=warn)
        return policy

    def close(self) -> None:
        """Stop the thread pool (threads in a hook finish in the background)."""
        executor = self._runner.executor
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)


def _call_problem(function: Callable[..., Any]) -> str | None:
    """Why `function` cannot be called with the one object a hook is given (its signature
    shown), or None (it can, or its signature cannot be read: a builtin, a C function)."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(None)
    except TypeError as error:
        return f"{signature} cannot take it ({error})"
    return None


def _import(spec: str, directory: Path | None = None) -> ModuleType:
    """A dotted module name, or the path of a .py file, imported as a fresh module object at
    every load: a reload never mixes old and new code, and hooks still running (or a reload
    that fails or is abandoned half-way) keep the old module's globals intact, which
    `importlib.reload` would overwrite in place as it went.

    The module imports its own from beside it: a file's directory, or for a dotted name the
    config file's (`directory`) if the name's package or module is there, is put on sys.path
    (`import helpers` finds the helpers.py beside mypolicy.py; `from acme import util` the
    acme/ beside pigeon.toml). Last, not first as for a script: a file there named like a
    module of Python's, Pigeon's or a library's (a dns.py, a DNS server of the operator's)
    must not stand in for it, in this process, for good (`shadowed` says which do).

    The new module is in `sys.modules` only while it runs (its own imports, dataclasses and
    pickling look it up there), then what was there before is put back: `Policy.take` names
    it there once it is in force. Only the module itself runs again: modules it imports
    stay as they were imported the first time.

    Whatever the module raises is its failure to load (`PolicyLoadError`), a BaseException too:
    a `sys.exit()` at its top level, a KeyboardInterrupt it raises itself (found from outside:
    either stopped the node at a SIGHUP, or ended a start with a bare traceback). Not what a
    signal's handler raises meanwhile in the main thread, which is a stop of the process (a
    Ctrl-C, the node's `Stopped`): that goes on (`_stops_noted`). A reload imports in a thread
    of its own, where no handler runs: all it meets is the module's."""
    stops: list[int] = []
    try:
        with _stops_noted(stops):
            return _imported(spec, directory)
    except PolicyLoadError:
        raise
    except BaseException as error:
        if stops:
            raise
        raise PolicyLoadError(f"policy module {spec} cannot be loaded: {_load_failure(error)}") from _from_module(error)


@contextlib.contextmanager
def _stops_noted(stops: list[int]) -> Iterator[None]:
    """Each SIGINT or SIGTERM whose handler runs during the block noted in `stops`, the handler
    then run as before: what it raises (KeyboardInterrupt, `Stopped`) is then told from the same
    exception raised by the module. Only in the main thread, where Python runs handlers, and
    only for a handler of Python's (the default of SIGTERM ends the process with no exception)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noting: dict[signal.Signals, tuple[Callable[..., Any], Callable[..., Any]]] = {}  # ours, and the one before
    for signum in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(signum)
        if callable(handler):

            def noted(number: int, frame: FrameType | None, handler: Callable[..., Any] = handler) -> Any:
                stops.append(number)
                return handler(number, frame)

            noting[signum] = (noted, handler)
            signal.signal(signum, noted)
    try:
        yield
    finally:
        for signum, (noted, handler) in noting.items():
            if signal.getsignal(signum) is noted:  # (a module that set its own handler keeps it)
                signal.signal(signum, handler)


def _imported(spec: str, directory: Path | None) -> ModuleType:
    """`_import`'s import, raising what the module or the import machinery raised."""
    if spec.endswith(".py") or "/" in spec:
        path = Path(spec)
        if not path.is_file():
            raise PolicyLoadError(f"policy module {spec}: no such file")
        _on_path(path.absolute().parent)
        found = importlib.util.spec_from_file_location(f"pigeon_policy_{next(_file_modules)}", path)
    else:
        first = spec.partition(".")[0]
        # (only when it is there: a file beside the config, a json.py say, must not stand in
        # for a module of that name everywhere in the process)
        if directory is not None and ((directory / first).is_dir() or (directory / f"{first}.py").is_file()):
            _on_path(directory)
            importlib.invalidate_caches()  # a module file made since the last look is found
            if (elsewhere := _found_elsewhere(first, directory)) is not None:
                raise PolicyLoadError(
                    f"policy module {spec}: `import {first}` imports {elsewhere}, not what is beside the "
                    f"config file in {directory}: give it a name of its own"
                )
        importlib.invalidate_caches()  # a module file made since the last look is found
        found = importlib.util.find_spec(spec)
        if found is None:
            raise ModuleNotFoundError(f"No module named {spec!r}", name=spec)
    if found is None or found.loader is None:
        raise PolicyLoadError(f"policy module {spec}: cannot be loaded as Python")
    module = importlib.util.module_from_spec(found)
    name = module.__name__
    before = sys.modules.get(name)
    sys.modules[name] = module
    try:
        found.loader.exec_module(module)
    finally:
        if before is not None:
            sys.modules[name] = before
        else:
            sys.modules.pop(name, None)
    return module


def _load_failure(error: BaseException) -> str:
    """Why the import failed, on one line and with where: `file:line: SyntaxError: invalid
    syntax: def broken(:`, `file:line: RuntimeError: boom` (the deepest line of code of the
    operator's, or a library's, that raised). A log line escapes line breaks (`\\x0a`), and
    the last line of a traceback alone does not say where."""
    if isinstance(error, SyntaxError):  # where it is, not where compile() was called (importlib)
        where = f"{error.filename}:{error.lineno}: " if error.filename and error.lineno else ""
        code = " ".join((error.text or "").split())
        return f"{where}{type(error).__name__}: {error.msg}" + (f": {code}" if code else "")
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if not _ours(frame.filename)]
    where = f"{frames[-1].filename}:{frames[-1].lineno}: " if frames else ""
    return where + " ".join("".join(traceback.format_exception_only(error)).split())


def _from_module(error: BaseException) -> BaseException | None:
    """`error` with its traceback starting at the first frame that is not Pigeon's or importlib's
    (the policy module's), for a log that shows it (`exc_info`): how `import` got there says
    nothing. A SyntaxError keeps none: its own lines say where (file, line, a caret). None: no
    code of the module ran (it was not found), and the one line says it all."""
    tb = error.__traceback__
    while tb is not None and _ours(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    if tb is None and not isinstance(error, SyntaxError):
        return None
    return error.with_traceback(tb)


def _ours(filename: str) -> bool:
    """Whether code of this file is Pigeon's loading of the module, not the module's: this file,
    or importlib's (frozen: `<frozen importlib._bootstrap>`)."""
    return filename == __file__ or filename.startswith("<frozen importlib")


def _beside(spec: str, directory: Path | None) -> tuple[Path, Path | None] | None:
    """The directory the policy module `spec` imports its own modules from (see `_import`), and
    the module itself there (None: a package, or not there); None: none is added."""
    if spec.endswith(".py") or "/" in spec:
        path = Path(spec).absolute()
        return path.parent, path
    first = spec.partition(".")[0]
    if directory is None:
        return None
    if (directory / first).is_dir():
        return directory, directory / first
    if (directory / f"{first}.py").is_file():
        return directory, directory / f"{first}.py"
    return None


def _on_path(directory: Path) -> None:
    """`directory` last on sys.path, once (a reload does not add it again)."""
    entry = str(directory)
    if entry not in sys.path:
        sys.path.append(entry)
        importlib.invalidate_caches()


def _found_elsewhere(name: str, directory: Path) -> str | None:
    """Where `import name` finds the top-level module `name` if not in `directory` (a path,
    "built-in", "frozen"), or None: there, or nowhere."""
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # (a module in sys.modules without a spec, say)
        return None
    if found is None:
        return None
    # A module's file, or a package's directory, has `directory` for its parent (named alike or not).
    places = [found.origin] if found.origin else []
    places += list(found.submodule_search_locations or [])
    here = directory.resolve()
    if any(Path(place).parent.resolve() == here for place in places if Path(place).is_absolute()):
        return None
    return found.origin or ", ".join(places) or "a module of that name"


def shadowed(directory: Path, own: Path | None = None) -> list[tuple[Path, str]]:
    """The modules beside the policy module (`.py` files and packages in `directory`, but `own`,
    the module itself) that its `import` cannot reach, as each name is another module's:
    each with where `import` finds that one."""
    found: list[tuple[Path, str]] = []
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return found
    for entry in entries:
        if entry == own:
            continue
        name = entry.stem if entry.suffix == ".py" and entry.is_file() else entry.name
        if not name.isidentifier() or not (entry.suffix == ".py" or (entry / "__init__.py").is_file()):
            continue
        if (elsewhere := _found_elsewhere(name, directory)) is not None:
            found.append((entry, elsewhere))
    return found
