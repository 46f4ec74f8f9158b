"""What the commands that talk to a running node share: where it is, the token, the request.

The token is `--token`, else `$PIGEON_TOKEN`, else the local token file of the spool the
configuration names (`<spool path>/api-token`: without -c, `./var/spool`), which a user who may
read the spool may use. The node asked is `--url`, else the spool's node: where it listens, as
it wrote to the spool's `http-address` when it started, else `[http] listen`. A node that
answers 401 to a command that took its token from a spool (or found none there) is told of,
before its answer, with where the token came from and what to give instead.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import shutil
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Final

from pigeon import __version__
from pigeon.cli.common import add_config_option, load_config, os_reason
from pigeon.config.schema import split_endpoint
from pigeon.logs.peer_text import escape_unprintable, shown
from pigeon.node.partial_answer import covered
from pigeon.node.sockets import recorded_http_address
from pigeon.redaction import redact, redact_url


def add_api_options(parser: argparse.ArgumentParser) -> None:
    add_config_option(parser)
    parser.add_argument("--url", help="the node's HTTP address (default: from [http] listen)")
    parser.add_argument("--token", help="API token (default: $PIGEON_TOKEN, else the node's local token)")
    parser.add_argument("--json", action="store_true", help="print the answer as JSON, for scripts")


UNREACHABLE = 3
"""The exit status of a command whose node cannot be reached (`pigeon inject`'s is 75)."""
TEMPFAIL = 75
"""`EX_TEMPFAIL`: not every worker of the node answered (a partial 503), or a write went
unanswered (the connection ended mid-request): the node may have carried out part of it. Also
a node that cannot do it now (429, 5xx: busy, failing, delivery disabled on it), and a cluster's
answer that leaves out a node (`pending`, `missing`: `pigeon.cli.admin`)."""
_WRITES_WAIT_ON: Final = ("/api/v1/admin/", "/api/v1/shaping/")


def _url_of(host: str, port: int) -> str:
    """The URL to reach a listener bound to `host:port` from this machine (a wildcard: loopback)."""
    host = "127.0.0.1" if host in ("0.0.0.0", "") else ("::1" if host == "::" else host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _url_problem(url: str) -> bool:
    """Whether `url` is not an HTTP address with a host and, if given, a port in 1..65535."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # raises for a port out of range or not a number
    except ValueError:
        return True
    return parts.scheme not in ("http", "https") or not parts.hostname or port == 0


class ApiClient:
    def __init__(self, args: argparse.Namespace) -> None:
        config = load_config(args, enough=[("http", "listen"), ("spool", "path")])
        listen = config.http.listen
        self.url = (args.url or _url_of(listen.host, listen.port)).rstrip("/")
        # Told neither: the default address, which is the node's only when it runs on its defaults.
        self._defaulted = args.config is None and not args.url
        # The node on this spool listens where it wrote as it started: that one is asked, whose
        # local token this is. `[http] listen` may name another node's address: edited since the
        # node started (it takes effect at its restart), or, without -c, the default address
        # another node holds. The configured address is asked only when the recorded one cannot
        # be reached (no node runs there any more).
        self._configured: str | None = None
        if not args.url and (recorded := recorded_http_address(config.spool.path)) is not None:
            with contextlib.suppress(ValueError):  # (a file no node wrote)
                if (running := _url_of(*split_endpoint(recorded))) != self.url:
                    self.url, self._configured = running, self.url
        if _url_problem(self.url):  # "localhost:8025", "http://[::1", port 99999: a usage error
            print(f"pigeon: --url {redact_url(self.url)!r} is not an HTTP address (give http://HOST:PORT)",
                  file=sys.stderr)  # fmt: skip
            raise SystemExit(2)
        self.token = args.token or os.environ.get("PIGEON_TOKEN")
        # Taken from the spool (or looked for there, and not found): what to say when refused.
        self._local: _LocalToken | None = None
        if not self.token:
            self._local = _LocalToken(config.spool.path / _local_token_file(), args.config)
            self.token = self._local.token

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        unreachable: int = UNREACHABLE,
        unanswered: Unanswered | None = None,
    ) -> tuple[int, Any]:
        """The status and decoded JSON answer. Exits `unreachable` (3) if the node cannot be
        reached; see `fetch` for `unanswered`."""
        data = None if body is None else json.dumps(body).encode()
        # A bulk operation answers when it is done, minutes later on a large spool: a write
        # waits for it rather than calling a node that is at work unreachable.
        timeout = None if method != "GET" and path.startswith(_WRITES_WAIT_ON) else 600
        if unanswered is None and method not in ("GET", "HEAD"):
            unanswered = _may_have_acted(path)
        status, raw = self.fetch(
            path, method=method, data=data, timeout=timeout, unreachable=unreachable, unanswered=unanswered
        )
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, {"error": raw.decode(errors="replace")}

    def fetch(
        self,
        path: str,
        *,
        method: str = "GET",
        data: bytes | None = None,
        token: bool = True,
        timeout: float | None = 600,
        unreachable: int = UNREACHABLE,
        unanswered: Unanswered | None = None,
        sink: BinaryIO | None = None,
    ) -> tuple[int, bytes]:
        """The status and raw body of one request (an HTTP error status is an answer, not an
        exception). A node that cannot be reached (refused, timed out, no route) prints why
        and exits `unreachable`: every command then says the same thing the same way.

        A connection that ends once it was made (the node killed or restarted mid-request, a
        proxy's timeout) is another thing: the request went out, so the node may have carried
        it out, in part, before it went. `unanswered`, given what happened, says so as the
        command's user needs to hear it and gives the exit status; without it (a read: it
        changed nothing), it is said as the node not answering, with `unreachable`.

        `sink`: a successful answer's body is written there as it comes, in pieces, and b""
        returned in its place (a message of gigabytes: `pigeon inspect --content`)."""
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        # The node keeps "cli" with a rule this makes (`suspended_by`): see listener.http.admin.CLI_AGENT.
        request.add_header("User-Agent", f"pigeon-cli/{__version__}")
        if token and self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        plain, tls = _NotingPlain(), _NotingTls()
        try:
            try:
                with urllib.request.build_opener(plain, tls).open(request, timeout=timeout) as response:
                    if sink is not None:
                        shutil.copyfileobj(response, sink, 64 * 1024)
                        return response.status, b""
                    return response.status, response.read()
            except urllib.error.HTTPError as error:
                with error:
                    if error.code == 401 and token and self._local is not None:
                        print(f"pigeon: {self._local.refused(self.url)}", file=sys.stderr)
                    return error.code, error.read()
        except BrokenPipeError:
            raise  # the sink's reader went away (`| head`): no fault of the node's (`pigeon.cli.main`)
        except (OSError, http.client.HTTPException) as error:
            reason = getattr(error, "reason", error)
            why = redact(str(reason) or type(reason).__name__)  # IncompleteRead and timeouts can say ""
            if plain.connected or tls.connected:
                ended = f"the connection to {redact_url(self.url)} ended before the node answered ({why})"
                if unanswered is not None:
                    raise SystemExit(unanswered(ended)) from None
                print(f"pigeon: {ended} (is `pigeon serve` still running?)", file=sys.stderr)
                raise SystemExit(unreachable) from None
            if isinstance(reason, ssl.SSLError):
                # An https URL for the plain HTTP listener: trying again cannot help.
                print(f"pigeon: TLS with {redact_url(self.url)} failed: {redact(str(error))} (the node's API "
                      "speaks plain HTTP unless a proxy in front of it does TLS: give http://HOST:PORT)",
                      file=sys.stderr)  # fmt: skip
                raise SystemExit(2) from None
            if self._configured is not None:
                recorded, self.url, self._configured = self.url, self._configured, None
                configured = "the default address" if self._defaulted else "[http] listen"
                print(f"pigeon: note: {redact_url(recorded)}, where the node on this spool listened when it started "
                      f"(its http-address), cannot be reached ({why}): asking {redact_url(self.url)} ({configured})",
                      file=sys.stderr)  # fmt: skip
                return self.fetch(path, method=method, data=data, token=token, timeout=timeout,
                                  unreachable=unreachable, unanswered=unanswered, sink=sink)  # fmt: skip
            hint = "is `pigeon serve` running?"
            if self._defaulted:
                hint += (
                    " This asked the default address: give the node's configuration (-c FILE, as given to"
                    " `pigeon serve`) or its API address (--url http://HOST:PORT)"
                )
            print(f"pigeon: cannot reach {redact_url(self.url)}: {why} ({hint})", file=sys.stderr)
            raise SystemExit(unreachable) from None


Unanswered = Callable[[str], int]
"""Told that a request's connection ended after it was made, before any answer (in words),
a command says what that means for what it asked, and returns its exit status (`ApiClient.fetch`)."""


def _may_have_acted(path: str) -> Unanswered:
    """A write whose node went away once it had the request (the node, or its supervisor, killed
    or restarted mid-request): said as a worker that went away mid-request is (`fail`), with
    `EX_TEMPFAIL`, never as a node not reached, since it may have acted on part of it already."""
    after_restart = next((where for start, where in _SHOWN_BY if path.startswith(start)), "the node's log")

    def unanswered(what: str) -> int:
        print(f"pigeon: {what}: it may have carried out part of the request (see `pigeon queue operations`; "
              f"after a restart of the node, which forgets those, {after_restart})", file=sys.stderr)  # fmt: skip
        return TEMPFAIL

    return unanswered


_SHOWN_BY: Final = (
    ("/api/v1/admin/bounce", "`pigeon bounce --list`, and `pigeon logs --type AdminBounce` for what it bounced"),
    ("/api/v1/admin/suspend", "`pigeon suspend --list`"),
    ("/api/v1/admin/hold", "`pigeon queue list --state held`, and `pigeon logs --type AdminHold` for what it held"),
    ("/api/v1/shaping/", "`pigeon shaping status`"),
)
"""What shows, once the node was started again, what a write to these paths did."""


class _Noting:
    """Mixed into urllib's handlers: notes whether the connection to the node was made
    (`connected`). An error before that means nothing reached it; after it, the request may
    have been sent."""

    connected = False

    def do_open(self, http_class: Any, req: Any, **http_conn_args: Any) -> Any:
        handler = self

        class Connection(http_class):  # type: ignore[misc]
            def connect(self) -> None:
                super().connect()  # (over TLS, the handshake too)
                handler.connected = True

        return super().do_open(Connection, req, **http_conn_args)  # type: ignore[misc]


class _NotingPlain(_Noting, urllib.request.HTTPHandler):
    pass


class _NotingTls(_Noting, urllib.request.HTTPSHandler):
    """For an https URL (a proxy in front of the node doing TLS)."""


def identifier(value: str) -> str:
    """An argparse type for an id that goes into an API path (a rule's, an effect's, a
    message's): letters, digits, "-" and "_" only. Anything else could step out of its path
    segment ("../../admin/suspend/ID" was another operation) or not be a URL at all."""
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", value):
        raise argparse.ArgumentTypeError(f"{value!r} is not an id: ids are letters and digits, as the lists show them")
    return value


def printable(answer: Any) -> Any:
    """An API answer as a table for people may show it: every string in it (keys too) with its
    control and format characters escaped (`pigeon.logs.peer_text`). Replies, reasons, queue
    names and addresses are what remote servers, senders and API clients chose: an ESC in one
    would otherwise retitle or clear the operator's terminal. (`--json` needs none of this:
    JSON escapes them itself.)"""
    if isinstance(answer, str):
        return shown(answer, limit=None)
    if isinstance(answer, dict):
        return {printable(key): printable(value) for key, value in answer.items()}
    if isinstance(answer, list | tuple):
        return [printable(item) for item in answer]
    return answer


def _said(answer: Any) -> Any:
    """An error answer as `printable`, but for the backslash: the node's error texts quote
    what was asked for as Python does (`tenant 'a\\x1bb' ...`), escaped already; escaping their
    backslashes again showed `'a\\\\x1bb'`. A control character the node did not escape is
    escaped all the same."""
    if isinstance(answer, str):
        return escape_unprintable(answer)
    if isinstance(answer, dict):
        return {_said(key): _said(value) for key, value in answer.items()}
    if isinstance(answer, list | tuple):
        return [_said(item) for item in answer]
    return answer


def is_partial(status: int, answer: Any) -> bool:
    """Whether an answer is a node's partial one: 503 because not every worker answered (one
    restarting, or killed for not answering its supervisor); `answers` holds what the others said."""
    return status == 503 and isinstance(answer, dict) and answer.get("partial") is True


def fail(status: int, answer: Any) -> int:
    """Print an error answer for people; the exit status for it: 75 (`EX_TEMPFAIL`) for a
    partial answer, naming the workers that did not answer, and for any other answer of a node
    that cannot do it now, the command being right (429, 5xx: busy, no worker up, delivery
    disabled on it); else 2 (refused: fix the command)."""
    answer = _said(answer)  # an error may quote what was asked for, or a remote's words
    if is_partial(status, answer):
        print(f"pigeon: {status}: {covered(answer.get('answered'))}", file=sys.stderr)
        for missing in answer.get("missing", ()):
            print(f"pigeon: worker {missing.get('worker')} did not answer: {missing.get('error')}", file=sys.stderr)
        print("pigeon: try again once every worker is back (`pigeon top`, /healthz)", file=sys.stderr)
        return TEMPFAIL
    message = answer.get("error", answer) if isinstance(answer, dict) else answer
    where = f" ({answer['field']})" if isinstance(answer, dict) and answer.get("field") else ""
    print(f"pigeon: {status}: {message}{where}", file=sys.stderr)
    return TEMPFAIL if status == 429 or status >= 500 else 2


def _local_token_file() -> str:
    # Imported when asked: the HTTP listener's module brings aiohttp, a third of a second.
    from pigeon.listener.http.auth import LOCAL_TOKEN_FILE

    return LOCAL_TOKEN_FILE


class _LocalToken:
    """The local token of the spool a command reads, when it was given none (`token`: None if
    there is none to read), and what to say when a node refuses it, or refuses a request
    without it (401)."""

    def __init__(self, path: Path, config: Path | None) -> None:
        self.config = config
        # Without -c, the default `[spool] path`, relative to the working directory: said so.
        self.spool = str(path.parent) if path.is_absolute() else f"./{path.parent}"
        self.path = path
        with contextlib.suppress(OSError):  # (a working directory removed)
            self.path = path.absolute()
        self.token: str | None = None
        self.problem = ""
        try:
            self.token = path.read_text().strip() or None
        except OSError as error:
            self.problem = os_reason(error)
        else:
            self.problem = "" if self.token else "it is empty"

    def refused(self, url: str) -> str:
        """Said before the node's 401 (from the node at `url`)."""
        none = "no token was sent: none was given (--token, $PIGEON_TOKEN), and"
        if self.config is None:
            spool = self.spool
            instead = "give the node's configuration (-c FILE, as given to `pigeon serve`"
            if self.token is None:
                return (f"{none} without -c the local token is looked for in {spool}/{self.path.name} ({self.path}): "
                        f"{self.problem}; {instead}: its spool holds the local token) or --token")  # fmt: skip
            return (f"the token sent is the local one of {spool} ({self.path}), which {redact_url(url)} does not know: "
                    f"it is not that spool's node; {instead}) or --token")  # fmt: skip
        if self.token is None:
            return (f"{none} the local token is looked for in the spool of {self.config}, {self.path}: "
                    f"{self.problem} (the node keeps it there while [http] local_token is on, for the user it runs "
                    "as); give --token")  # fmt: skip
        return (f"the token sent is the local one of the spool of {self.config} ({self.path}), which {redact_url(url)} "
                "does not know: it is not that spool's node (is that one running?); give --url and --token of the "
                "node to ask")  # fmt: skip
