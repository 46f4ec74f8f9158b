"""An IMAP session with one selected folder, on aioimaplib: what a mailbox source needs.

aioimaplib speaks the protocol (and IDLE); this adds implicit TLS or STARTTLS (which
aioimaplib lists but does not implement), LOGIN or XOAUTH2, UIDVALIDITY from SELECT, parsing
of UID SEARCH answers (ESEARCH too, as IMAP4rev2 servers give them), UID FETCH answers read by
`imap_responses` (not by aioimaplib), acknowledgement by flag, move or delete, and a timeout on
every command, so a server that stops answering costs one reconnect, not a hung watcher.

Servers may spell names in any case ("* 1 fetch", "a1 ok", "* capability imap4rev1 idle"):
responses get their names in capitals (`imap_responses.canonical`) before anything reads them,
and capabilities are compared in capitals. A server of IMAP4rev2 alone (RFC 9051) is spoken to
as one of IMAP4rev1 is: the commands Pigeon sends are the same there, its UID SEARCH answers
come as ESEARCH, and it has IDLE, MOVE and UIDPLUS whether it lists them or not.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import ssl
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Final, TypeVar

import aioimaplib
from aioimaplib.aioimaplib import Command, IMAP4ClientProtocol, IncompleteRead, literal_data_re

from pigeon.config.patterns import host_port
from pigeon.inbound.folders import to_imap
from pigeon.inbound.imap_responses import (
    FetchData,
    MalformedResponse,
    ResponseReader,
    canonical,
    capability_names,
    esearch_uids,
)
from pigeon.inbound.sasl import refusal, token_problem
from pigeon.tls import client_context

_log = logging.getLogger(__name__)

_UIDVALIDITY: Final = re.compile(rb"\[UIDVALIDITY (\d+)\]", re.IGNORECASE)
_PUSH: Final = re.compile(rb"\d+ (EXISTS|RECENT)\b", re.IGNORECASE)
_VERSIONS: Final = frozenset({"IMAP4REV1", "IMAP4REV2", "IMAP4"})  # aioimaplib's, and RFC 9051's
# What IMAP4rev2 includes (RFC 9051 E.1), listed or not by a server of IMAP4rev2 alone. Of them
# Pigeon uses IDLE, MOVE and UIDPLUS (UID EXPUNGE); ESEARCH is how its UID SEARCH is answered.
_IN_IMAP4REV2: Final = frozenset({
    "NAMESPACE", "UNSELECT", "UIDPLUS", "ESEARCH", "SEARCHRES", "ENABLE", "IDLE", "SASL-IR", "LIST-EXTENDED",
    "LIST-STATUS", "MOVE", "LITERAL-", "BINARY", "SPECIAL-USE", "STATUS=SIZE",
})  # fmt: skip
# X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH: the certificate is for another name
_NAME_MISMATCH: Final = frozenset({62, 64})
_BYE: Final = re.compile(rb"\* BYE\b ?", re.IGNORECASE)
_T = TypeVar("_T")


class ImapError(Exception):
    """The server refused a command or broke the session; the watcher reconnects."""


class CopiedOnly(ImapError):
    """A move without MOVE got as far as the copy: the messages are in the destination, and
    removing them from the folder was refused. Moving them again would copy them again."""


class FetchUnusable(ImapError):
    """The server answered a FETCH, but with nothing Pigeon can use for messages that are in the
    folder (FETCH responses without a UID, say): fetching them again would get the same."""


class ConnectFailed(OSError):
    """Connecting to the server, or TLS with it, failed: the text names the server, and what to
    change where a setting can fix it. `errno` is the cause's (a refused connection's
    ECONNREFUSED: the mailbox knocks for the server's return)."""

    def __str__(self) -> str:
        return str(self.strerror)


def uid_set(uids: Iterable[int]) -> str:
    """ "1:3,7,9:10" for [1, 2, 3, 7, 9, 10]: short commands even for long runs of UIDs."""
    ordered = sorted(set(uids))
    parts: list[str] = []
    start = previous = None
    for uid in ordered:
        if start is None:
            start = previous = uid
        elif previous is not None and uid == previous + 1:
            previous = uid
        else:
            parts.append(f"{start}:{previous}" if start != previous else str(start))
            start = previous = uid
    if start is not None:
        parts.append(f"{start}:{previous}" if start != previous else str(start))
    return ",".join(parts)


class _Link:
    """Whether a session's connection is over, and why: the server closed it, said BYE (it
    closes next; nothing more will be answered), or broke the protocol. Every wait on the
    server races `gone`, so none outlives the connection (aioimaplib fails no command when
    the server goes away, and a command waiting for its answer would wait for its timeout)."""

    def __init__(self, gone: asyncio.Event | None = None) -> None:
        self.gone = gone if gone is not None else asyncio.Event()
        self._reason = ""
        self.client: aioimaplib.IMAP4 | None = None
        self.server = ""  # "host:port", for errors

    def heard(self) -> tuple[float, int]:
        """When the server last sent bytes (the loop's clock), and how many it sent in all; -inf
        and 0 without a connection to tell."""
        protocol = getattr(self.client, "protocol", None)
        if not isinstance(protocol, _Protocol):
            return float("-inf"), 0
        return protocol.heard, protocol.received

    @property
    def reason(self) -> str:
        """Why the connection is over; empty while it is not."""
        if not self.gone.is_set():
            return ""
        return self._reason or "the server closed the connection"

    def lose(self, reason: str) -> None:
        """The first reason counts: a BYE, then the close that follows it, is a BYE."""
        if self.gone.is_set():
            return
        self._reason = reason
        self.gone.set()
        if self.client is not None:
            # Wake an IDLE wait: the watcher then finds the session lost and reconnects.
            self.client.protocol.idle_queue.put_nowait(aioimaplib.STOP_WAIT_SERVER_PUSH)


async def _until_lost(waited: Awaitable[_T], link: _Link, limit: float, what: str, server: str = "") -> _T:
    """What `waited` gives, unless the connection is lost first (ImapError, at once) or the
    server sends nothing for `limit` seconds (TimeoutError, naming `server`, or the link's).
    `waited` is cancelled if it does not end.

    `limit` bounds the server's silence, not the command: any byte from the server starts it
    again. A FETCH of a 20 MB message over a slow link takes minutes, and so does the answer to
    a STORE sent while it streams (the server answers in order): cut at `limit` in all, such a
    FETCH was tried again and again, the mailbox stalled for good. A server that stops sending,
    mid-answer or before it, is still timed out `limit` after its last byte."""
    task = asyncio.ensure_future(waited)
    if link.gone.is_set():
        task.cancel()
        raise ImapError(f"{what}: {link.reason}")
    gone = asyncio.ensure_future(link.gone.wait())
    loop = asyncio.get_running_loop()
    sent = loop.time()
    _, before = link.heard()
    done: set[asyncio.Future[Any]] = set()
    try:
        while not done:
            heard, _ = link.heard()
            left = max(sent, heard) + limit - loop.time()
            if left <= 0:
                break
            waits: set[asyncio.Future[Any]] = {task, gone}
            done, _ = await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
    if task in done:
        return task.result()
    if link.gone.is_set():
        raise ImapError(f"{what}: {link.reason}")
    server = server or link.server
    named = f" from {server}" if server else ""
    _, after = link.heard()
    if after == before:
        raise TimeoutError(f"{what}: no answer{named} within {limit:g}s")
    raise TimeoutError(f"{what}: nothing more{named} for {limit:g}s ({after - before} bytes came since it was sent)")


def _carries(item: FetchData, wanted: str) -> bool:
    """Whether a FETCH response carries `wanted` ("RFC822.SIZE" or "BODY[]")."""
    return (item.size if wanted == "RFC822.SIZE" else item.body) is not None


def _unusable(what: str, uids: Sequence[int], folder: str, collected: Sequence[FetchData], wanted: str) -> str:
    """Why a FETCH gave nothing of use for `uids`, which are in `folder`: what its responses
    lacked."""
    asked = set(uids)
    without_uid = sum(1 for item in collected if item.uid is None and _carries(item, wanted))
    without_item = sum(1 for item in collected if item.uid in asked and not _carries(item, wanted))
    if without_uid:
        how = f"{without_uid} of its FETCH responses carried {wanted} but no UID, which a UID FETCH must"
    elif without_item:
        how = f"{without_item} of its FETCH responses for them carried no {wanted}"
    else:
        how = "it sent no FETCH response for them"
    return (
        f"{what}: the server answered, but with nothing of use for UIDs {uid_set(uids)}, which are in {folder}: "
        f"{how}; this server's answers cannot be read"
    )


def _token_refused(step: str, answer: aioimaplib.Response, challenge: bytes | None) -> str:
    """A refused XOAUTH2 login, said as what it is: the token was refused (it has expired, or
    lacks the scope), not a password."""
    said = b" ".join(bytes(line) for line in answer.lines[-1:]).decode("utf-8", "replace")
    details = refusal(challenge)
    return (
        f'{step}: auth = "xoauth2": the server refused the token{f" ({details})" if details else ""}; refresh '
        f"the token in password_file (the server said: {answer.result} {said})"
    ).strip()


def _check(response: aioimaplib.Response, what: str) -> aioimaplib.Response:
    if response.result != "OK":
        text = b" ".join(bytes(line) for line in response.lines[-1:]).decode("utf-8", "replace")
        raise ImapError(f"{what}: {response.result} {text}".strip())
    return response


class ImapSession:
    """A logged-in session with `folder` selected. Open with `ImapSession.open()`.

    Every command has a deadline, and a lost connection (or a BYE) fails every wait on the
    server at once, IDLE's start and end included: aioimaplib times out only some commands
    and never fails one when the server goes away, which would leave a watcher waiting on a
    dead socket.
    """

    def __init__(
        self, client: aioimaplib.IMAP4, folder: str, uidvalidity: int, timeout: float, gone: asyncio.Event,
        link: _Link | None = None,
    ) -> None:  # fmt: skip
        """`gone`: set when the connection is lost; `link` says why (`open` passes both)."""
        self._client = client
        self.folder = folder
        self.uidvalidity = uidvalidity
        self._timeout = timeout
        self._link = link if link is not None else _Link(gone)
        if self._link.client is None:
            self._link.client = client  # (its protocol tells when the server last sent anything)
        self._gone = gone
        self._woken = asyncio.Event()  # set by `wake` while `wait_for_mail` waits
        self._waiting = False
        self._marks_refused = False  # the server refused keywords stored with \Deleted (`delete`)

    @property
    def lost(self) -> bool:
        return self._gone.is_set()

    @property
    def lost_reason(self) -> str:
        """Why the connection is over ("the server said BYE: ..."); empty while it is not."""
        return self._link.reason

    async def until_lost(self) -> str:
        """Return the reason once the connection is lost (the server closed it or said BYE)."""
        await self._gone.wait()
        return self._link.reason

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        *,
        tls: str,
        tls_context: ssl.SSLContext | None,
        username: str,
        secret: str,
        auth: str,
        folder: str,
        command_timeout: float,
    ) -> ImapSession:
        """Connect, secure, log in, select. Raises `ImapError` or `OSError`/`TimeoutError`."""
        timeout = command_timeout
        if auth == "xoauth2" and (problem := token_problem(secret)) is not None:
            # Sent, an empty token would be refused as any wrong one; one not ASCII cannot be sent.
            raise ImapError(f'login as {username}: auth = "xoauth2": {problem}')
        link = _Link()

        def closed(_error: Exception | None) -> None:
            link.lose("the server closed the connection")

        context = tls_context if tls == "implicit" else None
        client = _Client(host, port, timeout=timeout, conn_lost_cb=closed, ssl_context=context)
        link.client = client
        client.protocol.on_loss = link.lose
        server = host_port(host, port)  # "[::1]:993": an IPv6 address's port told from the address
        link.server = server
        step = "connect and greeting"  # what a bare timeout is named by: which step the server left waiting
        try:
            await _hello(client, host, port, tls, timeout)
            if tls == "starttls":
                step = "STARTTLS and its TLS handshake"
                await _starttls(client, host, tls_context, timeout, link, server)
            step = f"login as {username}"
            if auth == "xoauth2":
                _answer_sasl_errors(client)
                login = client.protocol.xoauth2(username, secret)
            else:
                login = client.protocol.login(username, secret)
            answer = await _until_lost(login, link, timeout, step, server)
            if auth == "xoauth2" and answer.result != "OK":
                raise ImapError(_token_refused(step, answer, client.protocol.challenge))
            _check(answer, step)
            # Servers may offer more once logged in (Gmail: MOVE, UIDPLUS).
            step = "CAPABILITY"
            await _until_lost(client.protocol.capability(), link, timeout, step, server)
            step = f"select {folder}"
            selecting = client.protocol.select(_quote(folder))
            response = _check(await _until_lost(selecting, link, timeout, step, server), step)
        except TimeoutError as error:
            await _close(client)
            if str(error):
                raise
            raise TimeoutError(f"{step}: no answer from {server} within {timeout:g}s") from None
        except BaseException:
            await _close(client)
            raise
        validity = next((m for line in response.lines if (m := _UIDVALIDITY.search(bytes(line)))), None)
        if validity is None:
            await _close(client)
            raise ImapError(f"select {folder}: the server gave no UIDVALIDITY")
        return cls(client, folder, int(validity.group(1)), timeout, link.gone, link)

    def has(self, capability: str) -> bool:
        """Whether the server offers `capability` (in any case: "idle" is IDLE). A server of
        IMAP4rev2 offers what that includes (`_IN_IMAP4REV2`), listed or not."""
        return capability.upper() in self._client.protocol.capabilities

    async def _run(self, command: Awaitable[aioimaplib.Response], what: str) -> aioimaplib.Response:
        """One command: its answer, checked; or ImapError when the connection goes away (or
        the server says BYE), or TimeoutError past the deadline."""
        return _check(await _until_lost(command, self._link, self._timeout, what), what)

    async def search(self, criteria: str) -> list[int]:
        """The UIDs of the messages that match `criteria` (UID SEARCH), from a SEARCH response
        or, from a server of IMAP4rev2, an ESEARCH one."""
        protocol = self._client.protocol
        command = Command("SEARCH", protocol.new_tag(), *criteria.split(), prefix="UID", loop=protocol.loop)
        response = await self._run(protocol.execute(command), f"search {criteria}")
        uids: list[int] = []
        # aioimaplib hands over "* SEARCH 1 2 3" as b"1 2 3" (or as it came, in some versions);
        # the last line is the tagged completion text.
        for line in response.lines[:-1]:
            words = bytes(line).split()
            if words and words[0].upper() == b"ESEARCH":
                try:
                    found = esearch_uids(bytes(line), command.tag)
                except MalformedResponse as error:
                    raise ImapError(f"search {criteria}: {error}") from None
                uids += found or []
                continue
            if words and words[0].upper() == b"SEARCH":
                words = words[1:]
            try:
                uids += map(int, words)
            except ValueError:
                continue  # not a SEARCH line (an untagged EXISTS, say)
        return uids

    async def present(self, uids: Sequence[int]) -> list[int]:
        """Which of `uids` are still in the folder. A NOOP first: a message another session
        expunged may linger in this session's view until the server tells it (and a command
        on it is refused meanwhile: `NO [EXPUNGEISSUED]`)."""
        if not uids:
            return []
        await self._run(self._client.protocol.simple_command("NOOP"), "NOOP")
        wanted = set(uids)
        return [uid for uid in await self.search(f"UID {uid_set(uids)}") if uid in wanted]

    async def sizes(self, uids: Sequence[int], *, unless: Sequence[str] = ()) -> dict[int, int]:
        """Sizes by UID of the messages still there and carrying none of the flags `unless`."""
        skip = {flag.lower() for flag in unless}
        described = await self.describe(uids)
        return {uid: size for uid, (size, flags) in described.items() if not skip & {f.lower() for f in flags}}

    async def describe(self, uids: Sequence[int]) -> dict[int, tuple[int, tuple[str, ...]]]:
        """(size, flags) by UID of the messages still there: one FETCH."""
        found: dict[int, tuple[int, tuple[str, ...]]] = {}
        for item in await self._fetch(uids, "(UID RFC822.SIZE FLAGS)", "fetch sizes", "RFC822.SIZE"):
            if item.uid is not None and item.size is not None:
                found[item.uid] = (item.size, item.flags or ())
        return found

    async def fetch(self, uids: Sequence[int]) -> dict[int, tuple[tuple[str, ...], bytes]]:
        """(flags, raw message) by UID of the messages still there, fetched with BODY.PEEK[]
        so nothing is marked \\Seen. The flags are those at the fetch: what another session
        did to a message before it shows."""
        found: dict[int, tuple[tuple[str, ...], bytes]] = {}
        for item in await self._fetch(uids, "(UID FLAGS BODY.PEEK[])", "fetch", "BODY[]"):
            if item.uid is not None and item.body is not None:
                found[item.uid] = (item.flags or (), item.body)
        return found

    async def _fetch(self, uids: Sequence[int], items: str, what: str, wanted: str) -> list[FetchData]:
        """A UID FETCH's answers, read by `imap_responses` as they come (see `_Protocol`).

        A message it gave no `wanted` item for ("RFC822.SIZE", "BODY[]") with its UID is looked
        for: gone from the folder (expunged by another client since the search), it is not
        there to fetch; still there, the server's answer was of no use (FETCH responses without
        a UID, say), and `FetchUnusable` says how, rather than the caller finding nothing to
        hand over, again at every round, and saying nothing."""
        protocol = self._client.protocol
        command = _Fetch(protocol.new_tag(), uid_set(uids), items, loop=protocol.loop)
        await self._run(protocol.execute(command), what)
        collected: list[FetchData] = command.collected
        asked = set(uids)
        usable = {item.uid for item in collected if item.uid in asked and _carries(item, wanted)}
        missing = [uid for uid in uids if uid not in usable]
        if missing:
            there = await self.present(missing)
            if there:
                raise FetchUnusable(_unusable(what, there, self.folder, collected, wanted))
        return collected

    def _store(self, uids: Sequence[int], flags: str, name: str) -> asyncio.Future[aioimaplib.Response]:
        """UID STORE +FLAGS.SILENT, sent now. aioimaplib holds a command back while another
        with the same `name` is under way (a STORE answers with FETCH lines, so it names
        STORE after FETCH): a silent STORE answers with none, so it gets a name of its own
        and goes out even while a FETCH is under way. The server takes them in order."""
        protocol = self._client.protocol
        command = Command("STORE", protocol.new_tag(), uid_set(uids), "+FLAGS.SILENT", f"({flags})", prefix="UID",
                          untagged_resp_name=name, loop=protocol.loop)  # fmt: skip
        sent: asyncio.Future[aioimaplib.Response] = asyncio.ensure_future(protocol.execute(command))
        return sent

    async def flag(self, uids: Sequence[int], flags: str) -> None:
        if uids:
            await self._run(self._store(uids, flags, "STORE"), "store flags")

    def flag_first(self, uids: Sequence[int], flags: str) -> Awaitable[None]:
        """`flag`, sent before any command asked for after this call (a FETCH that must see
        the flags, say); its outcome is awaited later."""
        sent = self._store(uids, flags, "STORE FIRST") if uids else None

        async def outcome() -> None:
            if sent is not None:
                await self._run(sent, "store flags")

        return outcome()

    async def move(self, uids: Sequence[int], folder: str, *, marks: str = "") -> None:
        """MOVE, or COPY then `delete` (with `marks`) where the server has no MOVE."""
        if not uids:
            return
        protocol = self._client.protocol
        if self.has("MOVE"):
            await self._run(protocol.move(uid_set(uids), _quote(folder), by_uid=True), f"move to {folder}")
            return
        await self._run(protocol.copy(uid_set(uids), _quote(folder), by_uid=True), f"copy to {folder}")
        try:
            await self.delete(uids, marks=marks)
        except ImapError as error:
            if self.lost:
                raise
            raise CopiedOnly(f"copied to {folder}, then {error}") from error

    async def delete(self, uids: Sequence[int], *, marks: str = "") -> None:
        """Flag \\Deleted and expunge. `marks`: keywords stored with \\Deleted in the same
        command, so a message left \\Deleted (the expunge cut short) says why it is: the
        caller looks for them later. A server that refuses them gets \\Deleted alone."""
        if not uids:
            return
        if marks and not self._marks_refused:
            try:
                await self.flag(uids, f"\\Deleted {marks}")
            except ImapError:
                if self.lost:
                    raise
                self._marks_refused = True  # no keywords here: \Deleted alone, as without marks
                await self.flag(uids, "\\Deleted")
        else:
            await self.flag(uids, "\\Deleted")
        protocol = self._client.protocol
        if self.has("UIDPLUS"):
            await self._run(protocol.expunge(uid_set(uids), by_uid=True), "uid expunge")
        else:
            # Without UIDPLUS, EXPUNGE removes every \Deleted message in the folder, ours or not.
            await self._run(protocol.expunge(), "expunge")

    async def create(self, folder: str) -> None:
        try:
            await self._run(self._client.protocol.simple_command("CREATE", _quote(folder)), f"create {folder}")
        except ImapError:
            pass  # it exists already (servers say so with NO)

    def wake(self) -> None:
        """End a `wait_for_mail` under way early, as new mail would (IDLE is ended as usual,
        with DONE). Nothing when none is under way: the caller is busy already."""
        if self._waiting and not self._woken.is_set():
            self._woken.set()
            if self._client.has_pending_idle():
                # What wakes an IDLE wait (the connection's loss does the same). Should IDLE end
                # first for another reason, the next IDLE returns at once: one round more.
                self._client.protocol.idle_queue.put_nowait(aioimaplib.STOP_WAIT_SERVER_PUSH)

    async def wait_for_mail(self, seconds: float, idle: bool) -> None:
        """Return when the server says the folder changed (IDLE), after `seconds`, or when
        `wake` is called; polling, having told the server to show the folder's news (NOOP), so
        that a search then finds what came meanwhile. Raises ImapError when the server says BYE or the connection goes
        away meanwhile."""
        self._waiting = True
        self._woken.clear()
        try:
            await self._wait_for_mail(seconds, idle)
        finally:
            self._waiting = False

    async def _wait_for_mail(self, seconds: float, idle: bool) -> None:
        timeout = seconds
        if not (idle and self.has("IDLE")):
            gone, woken = asyncio.ensure_future(self._gone.wait()), asyncio.ensure_future(self._woken.wait())
            try:
                await asyncio.wait({gone, woken}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                gone.cancel()
                woken.cancel()
            if self.lost:
                raise ImapError(self.lost_reason)
            # A poll ends with NOOP: a server shows a selected folder the messages another
            # session appended only when a command ends (Dovecot, in that command's untagged
            # EXISTS), so a search straight after the wait would miss what came during it, and
            # find it only at the poll after (up to two poll intervals late).
            await self._run(self._client.protocol.simple_command("NOOP"), "NOOP")
            return
        client = self._client
        # Its start and its end race the connection's loss, as every command does: a server
        # that says BYE (then closes) while IDLE starts or ends, just after a handoff say,
        # would otherwise leave the watcher waiting out `timeout` on a dead socket.
        idling = await _until_lost(client.idle_start(timeout=max(timeout, 1.0)), self._link, self._timeout, "IDLE")
        try:
            while not self.lost and not self._woken.is_set():
                push = await client.wait_server_push(timeout=timeout + self._timeout)
                if push == aioimaplib.STOP_WAIT_SERVER_PUSH:
                    break
                if any(_PUSH.match(bytes(line)) for line in push):
                    break
        except TimeoutError:
            pass
        finally:
            if self.lost:
                idling.cancel()
            else:
                if client.has_pending_idle():
                    client.idle_done()
                await _until_lost(idling, self._link, self._timeout, "end of IDLE")
        if self.lost:
            raise ImapError(self.lost_reason)

    async def close(self) -> None:
        # A lost connection answers no LOGOUT: waiting for one would only delay the reconnect.
        await _close(self._client, polite=not self.lost)


class _Protocol(IMAP4ClientProtocol):  # type: ignore[misc]
    """aioimaplib's protocol, minus a recursion and a copy per line. It parses a chunk of the
    server's data by handling its first line and calling itself on a copy of the rest, so:
    - a chunk of more than about 950 lines raised RecursionError, which broke the connection.
      The server tells a session about the flags other sessions changed at its next command:
      with three nodes acknowledging batches of 100, a node that spent a moment claiming got
      over a thousand such lines at once. The watcher then reconnected, and the other nodes
      left the batch it gave back alone for two seconds, as they had found it held;
    - a FETCH of a batch copied most of each chunk (up to 256 KB) for every line in it.
    This parses the same way with a loop and offsets. It also skips the debug log line that
    formatted every chunk received, whether debug logging was on or not.

    The bytes are first cut into whole responses by `imap_responses.ResponseReader`: the
    answers to Pigeon's own FETCH commands are read there (bodies as the literals they came
    in), and aioimaplib gets every other response whole, so its parsing never sees a message
    body."""

    incomplete_line: bytes  # set by aioimaplib's __init__: the start of a line not yet complete
    current_command: Command | None  # ... and the command it belongs to

    def __init__(
        self, loop: asyncio.AbstractEventLoop, conn_lost_cb: Callable[[Exception | None], None] | None = None
    ) -> None:
        super().__init__(loop, conn_lost_cb)
        self._responses = ResponseReader()
        # Told why the connection is over before it closes: a BYE, a broken protocol.
        self.on_loss: Callable[[str], None] | None = None
        # When the server last sent bytes (the loop's clock), and how many in all: a command
        # times out when the server has been silent too long, not when it takes long.
        self.heard = loop.time()
        self.received = 0
        self.challenge: bytes | None = None  # the server's XOAUTH2 error challenge, if it sent one
        # Done when the greeting and the CAPABILITY that follows it were answered; failed
        # when the server refused, or went away first. See `_hello`.
        self.greeted: asyncio.Future[None] = loop.create_future()

    async def welcome(self, command: bytes) -> None:
        """aioimaplib's welcome (state from the greeting, then CAPABILITY), which says how it
        ended on `greeted` instead of only to the state condition's waiters."""
        try:
            await super().welcome(command)
        except Exception as error:  # said on `greeted`, not as "Task exception was never retrieved"
            self._greeted(ImapError(f"the server's greeting: {error}"))
        except BaseException:
            self._greeted(ImapError("greeting abandoned"))
            raise
        else:
            self._greeted(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._greeted(ImapError("the server closed the connection before it was ready"))
        super().connection_lost(exc)

    def _greeted(self, error: ImapError | None) -> None:
        if self.greeted.done():
            return
        if error is None:
            self.greeted.set_result(None)
        else:
            self.greeted.set_exception(error)
            self.greeted.exception()  # retrieved: `_hello` may have given up on it already

    def data_received(self, data: bytes) -> None:
        """Whole responses (`imap_responses`): the FETCH answers to Pigeon's own FETCH
        commands read into the command (`_Fetch.collected`), every other response handed to
        aioimaplib, in order (a tagged answer ends its command before the next is read)."""
        self.heard = self.loop.time()
        self.received += len(data)
        reader = self._responses
        try:
            reader.receive_data(data)
            while True:
                pending = self.pending_async_commands.get("FETCH")
                collector = pending if isinstance(pending, _Fetch) and self.pending_sync_command is None else None
                event = reader.next_event(fetch=collector is not None)
                if event is None:
                    return
                if isinstance(event, FetchData):
                    assert collector is not None
                    collector.collected.append(event)
                else:
                    self._pass(event.raw())
        except (aioimaplib.Abort, UnicodeDecodeError, MalformedResponse) as error:
            # The server broke the protocol (a tagged answer to a command never sent, a
            # response name that is not text, a FETCH that cannot be read): hang up as on any
            # broken peer, and the mailbox reconnects. Raised from here, it reached asyncio's
            # "data_received() call failed" traceback (both found by fuzzing).
            _log.warning("IMAP server broke the protocol, closing the connection: %s", error)
            self._lost(f"the server broke the protocol: {error}")
            self.transport.close()

    def _lost(self, reason: str) -> None:
        if self.on_loss is not None:
            self.on_loss(reason)

    def _pass(self, response: bytes) -> None:
        """A whole response handled by aioimaplib (its bookkeeping of commands and IDLE). A
        BYE after the greeting (RFC 3501 7.1.5: the server is closing the connection) ends
        the session's waits at once: aioimaplib would pass it to whatever command is under
        way, or drop it, and nothing more will be answered. Its names come in capitals
        (`canonical`): aioimaplib matches them so."""
        response = canonical(response)
        bye = _BYE.match(response)
        if bye is not None and self.state != aioimaplib.aioimaplib.CONNECTED:
            said = response[bye.end() :].rstrip(b"\r\n").decode("utf-8", "replace")
            self._lost(f"the server said BYE: {said}" if said else "the server said BYE")
        try:
            self._handle_responses(self.incomplete_line + response, self._handle_line, self.current_command)
            self.incomplete_line = b""
            self.current_command = None
        except IncompleteRead as incomplete_read:  # a response aioimaplib takes for unfinished
            self.current_command = incomplete_read.cmd
            self.incomplete_line = incomplete_read.data

    async def capability(self) -> None:
        """aioimaplib's CAPABILITY, which took the capabilities as their case came ("idle" was
        no IDLE) and refused a server of IMAP4rev2 alone ("server not IMAP4 compliant"). In
        capitals here, with what IMAP4rev2 includes when the server has it."""
        response = await self.execute(Command("CAPABILITY", self.new_tag(), loop=self.loop))
        lines = [bytes(line) for line in response.lines]
        # aioimaplib hands over "* CAPABILITY IMAP4rev1 IDLE" as b"IMAP4rev1 IDLE" (as it came,
        # in some versions); the last line is the tagged completion text.
        listed = capability_names(lines[0].removeprefix(b"CAPABILITY")) if len(lines) > 1 else None
        if not listed:
            said = lines[-1].decode("utf-8", "replace") if lines else ""
            raise ImapError(f"CAPABILITY: the server listed none ({response.result} {said})".strip())
        versions = listed & _VERSIONS
        if not versions:
            shown = " ".join(sorted(listed))
            raise ImapError(f"the server speaks neither IMAP4rev1 nor IMAP4rev2: its capabilities are {shown:.300}")
        self.capabilities = set(listed | _IN_IMAP4REV2 if "IMAP4REV2" in listed else listed)
        self.imap_version = "IMAP4REV1" if "IMAP4REV1" in versions else min(versions)

    def _untagged_response(self, line: bytes) -> Command | None:
        """aioimaplib's, and an ESEARCH response goes to the SEARCH under way (an IMAP4rev2
        server's answer to it), where aioimaplib gave it to no command."""
        if line.startswith(b"* ESEARCH") and line[9:10] in (b"", b" ") and self.pending_sync_command is None:
            search = self.pending_async_commands.get("SEARCH")
            if search is not None:
                search.append_to_resp(line[2:])
                return search
        return super()._untagged_response(line)

    def _handle_responses(
        self, data: bytes, line_handler: Callable[[bytes, Command | None], Command | None],
        current_cmd: Command | None = None,
    ) -> None:  # fmt: skip
        view = memoryview(data)
        start, end = 0, len(data)
        while True:
            if start == end:
                if self.pending_sync_command is not None:
                    self.pending_sync_command.flush()
                if current_cmd is not None and current_cmd.wait_data():
                    raise IncompleteRead(current_cmd)
                return
            if current_cmd is not None and current_cmd.wait_literal_data():
                start = end - len(current_cmd.append_literal_data(view[start:]))
                if current_cmd.wait_literal_data():
                    raise IncompleteRead(current_cmd)
            stop = data.find(b"\r\n", start)
            if stop < 0:
                raise IncompleteRead(current_cmd, data[start:])
            line = data[start:stop]
            start = stop + 2
            cmd = line_handler(line, current_cmd)
            begin_literal = literal_data_re.match(line)
            if begin_literal:
                if cmd is None:
                    cmd = Command("NIL", "unused")
                cmd.begin_literal_data(int(begin_literal.group("size")))
                current_cmd = cmd
            elif cmd is not None and cmd.wait_data():
                current_cmd = cmd
            else:
                current_cmd = None


async def _hello(client: aioimaplib.IMAP4, host: str, port: int, tls: str, waited: float) -> None:
    """Connect and wait for the greeting. A port that speaks the other way round (TLS from the
    first byte, or not) is the usual first mistake, and its symptom is cryptic: say which key
    to change."""
    server = host_port(host, port)
    try:
        await asyncio.wait_for(_greeting(client), waited)
    except ssl.SSLError as error:
        plain_answer = "WRONG_VERSION_NUMBER" in str(error) or "record layer" in str(error)
        if tls != "implicit" or not plain_answer:
            raise _tls_failed(error, server, tls) from error
        raise ImapError(
            f"TLS handshake with {server} failed ({error.reason or error}): the server answered in plain "
            'text, so this port probably expects tls = "starttls" or "none" (143 is the usual such port) '
            'while [[mailbox]] tls is "implicit" (the default, for port 993): set tls = "starttls", or the '
            "server's implicit TLS port"
        ) from error
    except TimeoutError:
        task = client._client_task
        if client.protocol.state != aioimaplib.aioimaplib.CONNECTED:  # greeted: it did not answer CAPABILITY
            raise TimeoutError(f"{server} greeted, then gave no answer to CAPABILITY within {waited:g}s") from None
        if tls == "implicit" or not task.done() or task.cancelled() or task.exception() is not None:
            raise
        raise ImapError(
            f"connected to {server}, but no IMAP greeting within {waited:g}s: if this is an implicit "
            'TLS port (993 is the usual one), set tls = "implicit" in [[mailbox]]'
        ) from None
    except OSError as error:  # refused, unreachable, a name that does not resolve
        raise _cannot_connect(error, server) from error


def _cannot_connect(error: OSError, server: str) -> ConnectFailed:
    """`cannot connect to host:port: why`, as a webhook target says it: Python's own text
    ("[Errno 111] Connect call failed ('127.0.0.1', 993)") names neither the setting nor,
    for a name's addresses, the name."""
    if error.errno is not None and error.errno > 0:
        why = os.strerror(error.errno)  # "Connection refused"
    else:  # a resolver's error (a negative errno), or each address's ("Multiple exceptions: ...")
        why = error.strerror or str(error) or type(error).__name__
    return ConnectFailed(error.errno, f"cannot connect to {server}: {why}")


def _tls_failed(error: ssl.SSLError, server: str, tls: str) -> ConnectFailed:
    """A failed TLS handshake, naming the server and, where a setting can fix it, which."""
    where = f"TLS to {server} ({tls})"
    if isinstance(error, ssl.SSLCertVerificationError):
        said = error.verify_message or error.reason or str(error)
        if error.verify_code in _NAME_MISMATCH:
            fix = "set host to a name the certificate is for (or tls_verify = false)"
        else:
            fix = "set ca_file to the PEM file of the CA that issued it (or tls_verify = false)"
        return ConnectFailed(None, f"{where}: certificate not trusted: {said}; {fix}")
    reason = error.reason.replace("_", " ").lower() if error.reason else str(error)  # "wrong version number"
    return ConnectFailed(None, f"{where}: handshake failed: {reason}")


async def _greeting(client: aioimaplib.IMAP4) -> None:
    """Connected, greeted, and CAPABILITY answered. Not aioimaplib's `wait_hello_from_server`:
    it waits on a condition whose lock aioimaplib's welcome holds until the server answers
    CAPABILITY, and a cancelled condition wait must take the lock back before it ends. So a
    server that greeted and then died, or stopped answering, before that answer (a server
    killed, or restarting, just then) left the timeout's cancellation waiting for ever: the
    watcher hung in `open` for good, connected to nothing, saying nothing."""
    await client._client_task  # a refused connection or a failed TLS handshake is raised here
    protocol = client.protocol
    assert isinstance(protocol, _Protocol)
    await protocol.greeted


class _Client(aioimaplib.IMAP4):  # type: ignore[misc]
    """aioimaplib's client on `_Protocol`."""

    def create_client(
        self, host: str, port: int, loop: asyncio.AbstractEventLoop | None,
        conn_lost_cb: Callable[[Exception | None], None] | None = None, ssl_context: ssl.SSLContext | None = None,
    ) -> None:  # fmt: skip
        local_loop = loop if loop is not None else asyncio.get_running_loop()
        self.protocol = _Protocol(local_loop, conn_lost_cb)
        connect = local_loop.create_connection(lambda: self.protocol, host, port, ssl=ssl_context)
        self._client_task = local_loop.create_task(connect)


class _Fetch(Command):  # type: ignore[misc]
    """A UID FETCH whose answers `_Protocol` reads itself (`imap_responses.fetch_data`) into
    `collected`, instead of handing aioimaplib each line and literal to keep."""

    def __init__(self, tag: str, uids: str, items: str, *, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__("FETCH", tag, uids, items, prefix="UID", untagged_resp_name="FETCH", loop=loop)
        self.collected: list[FetchData] = []


def _answer_sasl_errors(client: aioimaplib.IMAP4) -> None:
    """A refused XOAUTH2 token comes back as a `+ <base64 JSON>` challenge, and the server
    says NO only after the client's empty answer (RFC 7628 3.2.3). aioimaplib never sends
    it, so the login would hang until the command timeout and report a timeout, not the
    refusal. Answer it, and keep the challenge: it says why (`_token_refused`)."""
    protocol = client.protocol
    original = protocol._continuation

    def continuation(line: bytes) -> None:
        pending = protocol.pending_sync_command
        if pending is not None and pending.name == "AUTHENTICATE":
            protocol.challenge = line  # what the refusal was (`sasl.refusal`): said with the NO
            protocol.transport.write(b"\r\n")
            return
        original(line)

    protocol._continuation = continuation


async def _starttls(
    client: aioimaplib.IMAP4, host: str, context: ssl.SSLContext | None, limit: float, link: _Link, server: str
) -> None:
    timeout = limit
    protocol = client.protocol
    if "STARTTLS" not in protocol.capabilities:
        raise ImapError('the server does not offer STARTTLS (use tls = "implicit" or "none")')
    command = Command("STARTTLS", protocol.new_tag(), loop=protocol.loop)
    _check(await _until_lost(protocol.execute(command), link, timeout, "STARTTLS", server), "starttls")
    loop = asyncio.get_running_loop()
    try:
        transport = await asyncio.wait_for(
            loop.start_tls(protocol.transport, protocol, context or client_context(verify=True), server_hostname=host),
            timeout,
        )
    except ssl.SSLError as error:
        raise _tls_failed(error, server, "starttls") from error
    protocol.transport = transport
    await _until_lost(protocol.capability(), link, timeout, "CAPABILITY after STARTTLS", server)  # RFC 3501 6.2.1


async def _close(client: aioimaplib.IMAP4, *, polite: bool = True) -> None:
    try:
        if polite and client.get_state() in ("AUTH", "SELECTED"):
            await asyncio.wait_for(client.logout(), 2)
    except Exception:
        pass
    transport = client.protocol.transport
    if transport is not None:
        transport.close()
    for task in [*client.protocol.tasks, *client.tasks]:  # a welcome waiting for CAPABILITY, an IDLE
        task.cancel()


def _quote(folder: str) -> str:
    """A configured folder name as a command's argument: in modified UTF-7 (RFC 3501 5.1.3),
    which "Entrée" needs to name the folder the server knows, quoted where need be."""
    folder = to_imap(folder)
    if re.fullmatch(r"[A-Za-z0-9_./-]+", folder):
        return folder
    return '"' + folder.replace("\\", "\\\\").replace('"', '\\"') + '"'
