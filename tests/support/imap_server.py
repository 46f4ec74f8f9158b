"""A small IMAP server on loopback, for the servers Dovecot cannot play: one that spells its
answers in lower case, one of IMAP4rev2 alone, a slow link, a FETCH answer without UIDs, an
XOAUTH2 refusal with its challenge, a stall in the middle of a body.

It runs in a thread of its own (as `apps.ThreadedApp`), so that a test can drive Pigeon as a
process or in its own loop while it answers. One folder of messages (others made by CREATE,
MOVE and COPY), what Pigeon's mailbox sends: LOGIN, AUTHENTICATE XOAUTH2, CAPABILITY, SELECT,
CREATE, NOOP, IDLE, UID SEARCH (the keys Pigeon uses), UID FETCH (UID, FLAGS, RFC822.SIZE,
BODY.PEEK[]), UID STORE, UID MOVE, UID COPY, UID EXPUNGE, EXPUNGE, LOGOUT. Every command line it
gets is kept (`commands`), for a test to see which the client chose.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.support.ports import free_port

_SEQUENCE: re.Pattern[str] = re.compile(r"(\d+|\*)(?::(\d+|\*))?")
_CAPABILITIES_REV1 = ("IMAP4rev1", "IDLE", "UIDPLUS", "MOVE", "AUTH=XOAUTH2")
# RFC 7628 3.2.2: what Google and Dovecot send for a token they refuse, base64-encoded.
REFUSAL = {"status": "401", "schemes": "bearer", "scope": "mail"}


@dataclass
class Message:
    uid: int
    body: bytes
    flags: set[str] = field(default_factory=set)

    def has(self, flag: str) -> bool:
        return flag.lower() in {f.lower() for f in self.flags}


class ImapServer:
    """An IMAP server on 127.0.0.1:`port` for user "app" (password "secret", or XOAUTH2 with
    `token`). Quirks:

    - `lowercase`: every name it sends in lower case ("a1 ok", "* 1 fetch (uid 1 ...)",
      "* capability imap4rev1 idle ...", "* ok [uidvalidity 7]"); "fetch": only its FETCH
      responses' ("* 1 fetch (uid 1 rfc822.size 123 flags ())"), "capability": only its
      capabilities ("* CAPABILITY imap4rev1 idle uidplus move");
    - `rev2`: it lists IMAP4rev2 alone (no IDLE, MOVE, UIDPLUS: they are in IMAP4rev2), and
      answers UID SEARCH with ESEARCH;
    - `capabilities`: what it lists instead of its usual;
    - `rate`: bytes a second it sends at most, in `chunk`s (a slow link);
    - `fetch_without_uid`: its answers to a body FETCH carry no UID;
    - `stall_after`: in a body FETCH answer, it sends this many bytes, then nothing more;
    - `tls`: implicit TLS with this server context; `starttls`: STARTTLS, with this one.
    """

    def __init__(
        self,
        *,
        lowercase: bool | str = False,
        rev2: bool = False,
        capabilities: tuple[str, ...] | None = None,
        rate: float | None = None,
        chunk: int = 16 * 1024,
        fetch_without_uid: bool = False,
        stall_after: int | None = None,
        token: str = "good-token",
        tls: ssl.SSLContext | None = None,
        starttls: ssl.SSLContext | None = None,
    ) -> None:
        self.port = free_port()
        self.lowercase = lowercase
        self.rev2 = rev2
        listed = ("IMAP4rev2", "AUTH=XOAUTH2") if rev2 else _CAPABILITIES_REV1
        self.capabilities = capabilities if capabilities is not None else listed
        self.rate = rate
        self.chunk = chunk
        self.fetch_without_uid = fetch_without_uid
        self.stall_after = stall_after
        self.token = token
        self.tls = tls
        self.starttls = starttls
        if starttls is not None:
            self.capabilities = (*self.capabilities, "STARTTLS")
        self.uidvalidity = 7
        self.folders: dict[str, list[Message]] = {"INBOX": []}
        self._next_uid: dict[str, int] = {"INBOX": 1}
        self.commands: list[str] = []  # every command line received, in order
        self.tokens: list[str] = []  # every XOAUTH2 token offered
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stopped: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)

    # --- the test's side ---------------------------------------------------------------------
    def __enter__(self) -> ImapServer:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the IMAP server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        stopped = self._stopped
        if stopped is not None:
            self._loop.call_soon_threadsafe(stopped.set)
        self._thread.join(10)

    def append(self, bodies: list[bytes], folder: str = "INBOX") -> list[int]:
        """Add messages to `folder`; their UIDs."""
        with self._lock:
            uids = []
            for body in bodies:
                uid = self._next_uid.setdefault(folder, 1)
                self._next_uid[folder] = uid + 1
                self.folders.setdefault(folder, []).append(Message(uid, body))
                uids.append(uid)
        return uids

    def unseen(self, folder: str = "INBOX") -> list[int]:
        with self._lock:
            return [m.uid for m in self.folders.get(folder, []) if not m.has("\\Seen")]

    def uids(self, folder: str = "INBOX") -> list[int]:
        with self._lock:
            return [m.uid for m in self.folders.get(folder, [])]

    def received(self, *words: str) -> list[str]:
        """The command lines received (their tags left out) that start with `words`, in any case."""
        with self._lock:
            lines = [line.split(" ", 1)[1] if " " in line else "" for line in self.commands]
        wanted = " ".join(words).upper()
        return [line for line in lines if line.upper().startswith(wanted)]

    # --- serving -----------------------------------------------------------------------------
    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        self._stopped = asyncio.Event()
        server = await asyncio.start_server(self._session, "127.0.0.1", self.port, ssl=self.tls)
        self._ready.set()
        async with server:
            await self._stopped.wait()
            server.close()
            for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                task.cancel()

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        session = _Session(self, reader, writer)
        try:
            await session.run()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.transport.abort()

    def name(self, text: str, kind: str = "") -> str:
        """A response name (of a `kind` of response) as this server spells it."""
        return text.lower() if self.lowercase is True or (kind and self.lowercase == kind) else text


class _Session:
    def __init__(self, server: ImapServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        self.selected: str | None = None
        self.sent = 0  # bytes of the body FETCH answer under way (`stall_after`)

    async def send(self, data: bytes, *, stalls: bool = False) -> None:
        """Send, at most `rate` bytes a second; with `stalls`, nothing past `stall_after`."""
        server = self.server
        if stalls and server.stall_after is not None:
            data = data[: max(0, server.stall_after - self.sent)]
            self.sent += len(data)
        if server.rate is None:
            self.writer.write(data)
            await self.writer.drain()
            return
        for start in range(0, len(data), server.chunk):
            piece = data[start : start + server.chunk]
            self.writer.write(piece)
            await self.writer.drain()
            await asyncio.sleep(len(piece) / server.rate)

    async def line(self, text: str) -> None:
        await self.send(text.encode() + b"\r\n")

    async def run(self) -> None:
        n = self.server.name
        await self.line(f"* {n('OK')} IMAP server ready")
        while True:
            raw = await self.reader.readline()
            if not raw:
                return
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            with self.server._lock:
                self.server.commands.append(line)
            tag, _, rest = line.partition(" ")
            command, _, args = rest.partition(" ")
            command = command.upper()
            if command == "UID":
                command, _, args = args.partition(" ")
                command = "UID " + command.upper()
            handler = _HANDLERS.get(command)
            if handler is None:
                await self.line(f"{tag} {n('BAD')} unknown command")
                continue
            if await handler(self, tag, args) is False:
                return

    async def done(self, tag: str, text: str = "done") -> None:
        await self.line(f"{tag} {self.server.name('OK')} {text}")

    # --- commands ----------------------------------------------------------------------------
    async def capability(self, tag: str, _args: str) -> None:
        n = self.server.name
        await self.line(f"* {n('CAPABILITY')} {n(' '.join(self.server.capabilities), 'capability')}")
        await self.done(tag)

    async def starttls(self, tag: str, _args: str) -> None:
        context = self.server.starttls
        if context is None:
            await self.line(f"{tag} {self.server.name('BAD')} no STARTTLS here")
            return
        await self.done(tag, "begin TLS")
        await self.writer.start_tls(context)

    async def noop(self, tag: str, _args: str) -> None:
        await self.done(tag)

    async def logout(self, tag: str, _args: str) -> bool:
        await self.line(f"* {self.server.name('BYE')} logging out")
        await self.done(tag)
        return False

    async def login(self, tag: str, args: str) -> None:
        user, _, password = args.partition(" ")
        if user == "app" and password.strip('"') == "secret":
            await self.done(tag, "logged in")
        else:
            await self.line(f"{tag} {self.server.name('NO')} [AUTHENTICATIONFAILED] Authentication failed.")

    async def authenticate(self, tag: str, args: str) -> None:
        mechanism, _, initial = args.partition(" ")
        decoded = base64.b64decode(initial).decode("ascii", "replace")
        token = decoded.split("auth=Bearer ", 1)[-1].rstrip("\x01")
        with self.server._lock:
            self.server.tokens.append(token)
        if mechanism.upper() == "XOAUTH2" and token == self.server.token:
            await self.done(tag, "logged in")
            return
        await self.line("+ " + base64.b64encode(json.dumps(REFUSAL).encode()).decode())
        await self.reader.readline()  # the client's empty answer (RFC 7628 3.2.3)
        await self.line(f"{tag} {self.server.name('NO')} [AUTHENTICATIONFAILED] Authentication failed.")

    async def select(self, tag: str, args: str) -> None:
        n = self.server.name
        folder = args.strip('"')
        with self.server._lock:
            count = len(self.server.folders.setdefault(folder, []))
        self.selected = folder
        await self.line(f"* {count} {n('EXISTS')}")
        await self.line(f"* {n('OK')} [{n('UIDVALIDITY')} {self.server.uidvalidity}] UIDs valid")
        await self.done(tag, f"[{n('READ-WRITE')}] selected")

    async def create(self, tag: str, args: str) -> None:
        with self.server._lock:
            self.server.folders.setdefault(args.strip('"'), [])
        await self.done(tag)

    async def idle(self, tag: str, _args: str) -> None:
        n = self.server.name
        await self.line("+ idling")
        with self.server._lock:
            known = len(self._messages())
        done = asyncio.ensure_future(self.reader.readline())
        try:
            while not done.done():
                await asyncio.wait({done}, timeout=0.1)
                with self.server._lock:
                    now = len(self._messages())
                if now > known:
                    known = now
                    await self.line(f"* {now} {n('EXISTS')}")
        finally:
            if not done.done():
                done.cancel()
        await self.done(tag, "idle done")

    async def search(self, tag: str, args: str) -> None:
        n = self.server.name
        with self.server._lock:
            messages = list(self._messages())
            uids = [m.uid for m in messages if _matches(m, _Keys(args.split()), messages)]
        if self.server.rev2:
            found = f" {n('ALL')} {_uid_set(uids)}" if uids else ""
            await self.line(f'* {n("ESEARCH")} ({n("TAG")} "{tag}") {n("UID")}{found}')
        else:
            await self.line(f"* {n('SEARCH')}" + "".join(f" {uid}" for uid in uids))
        await self.done(tag)

    async def fetch(self, tag: str, args: str) -> None:
        n = self.server.name
        wanted_set, _, items = args.partition(" ")
        items = items.upper()
        with self.server._lock:
            messages = list(self._messages())
            chosen = [(i, m) for i, m in enumerate(messages, start=1) if _in_set(m.uid, wanted_set, messages)]
        self.sent = 0
        body_fetch = "BODY" in items
        for number, message in chosen:
            parts = [] if self.server.fetch_without_uid and body_fetch else [f"{n('UID', 'fetch')} {message.uid}"]
            if "RFC822.SIZE" in items:
                parts.append(f"{n('RFC822.SIZE', 'fetch')} {len(message.body)}")
            if "FLAGS" in items:
                parts.append(f"{n('FLAGS', 'fetch')} ({' '.join(sorted(message.flags))})")
            head = f"* {number} {n('FETCH', 'fetch')} ({' '.join(parts)}"
            if body_fetch:
                literal = f" {n('BODY[]', 'fetch')} {{{len(message.body)}}}\r\n"
                data = (head + literal).encode() + message.body + b")\r\n"
            else:
                data = (head + ")\r\n").encode()
            await self.send(data, stalls=body_fetch)
        if body_fetch and self.server.stall_after is not None:
            await asyncio.sleep(3600)  # stalled: nothing more, the connection left open
        await self.done(tag)

    async def store(self, tag: str, args: str) -> None:
        n = self.server.name
        wanted_set, _, rest = args.partition(" ")
        how, _, flags = rest.partition(" ")
        names = flags.strip("()").split()
        changed = []
        with self.server._lock:
            messages = list(self._messages())
            for number, message in enumerate(messages, start=1):
                if not _in_set(message.uid, wanted_set, messages):
                    continue
                if how.upper().startswith("+"):
                    message.flags |= set(names)
                elif how.upper().startswith("-"):
                    message.flags -= set(names)
                else:
                    message.flags = set(names)
                changed.append((number, message))
        if "SILENT" not in how.upper():
            for number, message in changed:
                flags = " ".join(sorted(message.flags))
                await self.line(f"* {number} {n('FETCH', 'fetch')} ({n('FLAGS', 'fetch')} ({flags}))")
        await self.done(tag)

    async def copy(self, tag: str, args: str, *, move: bool = False) -> None:
        wanted_set, _, folder = args.partition(" ")
        folder = folder.strip('"')
        with self.server._lock:
            messages = list(self._messages())
            chosen = [m for m in messages if _in_set(m.uid, wanted_set, messages)]
        self.server.append([m.body for m in chosen], folder)
        if move:
            await self._expunge([m.uid for m in chosen])
        await self.done(tag)

    async def move(self, tag: str, args: str) -> None:
        await self.copy(tag, args, move=True)

    async def uid_expunge(self, tag: str, args: str) -> None:
        with self.server._lock:
            messages = list(self._messages())
            uids = [m.uid for m in messages if m.has("\\Deleted") and _in_set(m.uid, args, messages)]
        await self._expunge(uids)
        await self.done(tag)

    async def expunge(self, tag: str, _args: str) -> None:
        with self.server._lock:
            uids = [m.uid for m in self._messages() if m.has("\\Deleted")]
        await self._expunge(uids)
        await self.done(tag)

    async def _expunge(self, uids: list[int]) -> None:
        gone = set(uids)
        said = []
        with self.server._lock:
            messages = self._messages()
            for number in range(len(messages), 0, -1):
                if messages[number - 1].uid in gone:
                    del messages[number - 1]
                    said.append(number)
        for number in said:
            await self.line(f"* {number} {self.server.name('EXPUNGE')}")

    def _messages(self) -> list[Message]:
        return self.server.folders.setdefault(self.selected or "INBOX", [])


_HANDLERS: dict[str, Callable[..., Any]] = {
    "CAPABILITY": _Session.capability,
    "NOOP": _Session.noop,
    "STARTTLS": _Session.starttls,
    "LOGOUT": _Session.logout,
    "LOGIN": _Session.login,
    "AUTHENTICATE": _Session.authenticate,
    "SELECT": _Session.select,
    "EXAMINE": _Session.select,
    "CREATE": _Session.create,
    "IDLE": _Session.idle,
    "UID SEARCH": _Session.search,
    "UID FETCH": _Session.fetch,
    "UID STORE": _Session.store,
    "UID COPY": _Session.copy,
    "UID MOVE": _Session.move,
    "UID EXPUNGE": _Session.uid_expunge,
    "EXPUNGE": _Session.expunge,
}


class _Keys:
    """SEARCH keys, read one by one."""

    def __init__(self, words: list[str]) -> None:
        self._words: Iterator[str] = iter(words)

    def next(self) -> str | None:
        return next(self._words, None)


def _matches(message: Message, keys: _Keys, messages: list[Message]) -> bool:
    """Whether `message` matches every key left (ALL, SEEN, UNSEEN, DELETED, UNDELETED, KEYWORD,
    UNKEYWORD, UID, NOT)."""
    while (key := keys.next()) is not None:
        if not _key(message, key, keys, messages):
            return False
    return True


def _key(message: Message, key: str, keys: _Keys, messages: list[Message]) -> bool:
    word = key.upper()
    if word == "NOT":
        following = keys.next()
        return following is not None and not _key(message, following, keys, messages)
    if word == "ALL":
        return True
    if word in ("SEEN", "UNSEEN"):
        return message.has("\\Seen") == (word == "SEEN")
    if word in ("DELETED", "UNDELETED"):
        return message.has("\\Deleted") == (word == "DELETED")
    if word in ("KEYWORD", "UNKEYWORD"):
        return message.has(keys.next() or "") == (word == "KEYWORD")
    if word == "UID":
        return _in_set(message.uid, keys.next() or "", messages)
    raise ValueError(f"search key {key!r} not known to the test server")


def _in_set(uid: int, sequence_set: str, messages: list[Message]) -> bool:
    highest = max((m.uid for m in messages), default=0)
    for part in sequence_set.split(","):
        match = _SEQUENCE.fullmatch(part)
        if match is None:
            continue
        low = highest if match.group(1) == "*" else int(match.group(1))
        high_text = match.group(2) or match.group(1)
        high = highest if high_text == "*" else int(high_text)
        if min(low, high) <= uid <= max(low, high):
            return True
    return False


def _uid_set(uids: list[int]) -> str:
    parts: list[str] = []
    for uid in sorted(uids):
        if parts and parts[-1].split(":")[-1] == str(uid - 1):
            parts[-1] = f"{parts[-1].split(':')[0]}:{uid}"
        else:
            parts.append(str(uid))
    return ",".join(parts)
