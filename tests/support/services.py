"""Real servers the integration tests start for themselves: Redis, Dovecot (IMAP) and PostgreSQL.

Never mocks: Pigeon's clients must meet the real protocols and the real failures (a Redis restarted
mid-run, an IMAP server killed under an IDLE, a database that goes away). Each instance is private:
it runs the Debian package's binaries as a child process in its own process group, listens only on
free 127.0.0.1 ports and keeps every file (config, data, sockets, logs) under the directory it is
given, so tests neither touch nor depend on a system instance (one may well run on 6379 or 5432),
run side by side, and `kill()` takes a whole server down at once, like a crash. Nothing here makes
a DNS lookup. A server that does not come up in time fails with its log in the message.
"""

from __future__ import annotations

import atexit
import contextlib
import csv
import grp
import imaplib
import io
import os
import pwd
import re
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from tests.support.ports import free_port
from tests.support.tools import require

if TYPE_CHECKING:
    import redis

HOST = "127.0.0.1"
POSTGRES_LIB = Path("/usr/lib/postgresql")  # Debian's: one <version>/bin per major version
# A Unix socket path holds at most 107 bytes; Dovecot's longest socket under base_dir is
# "login/imap-urlauth" or "imap-urlauth-worker" (about 20), so leave room for those.
_SOCKET_ROOM = 107 - 24


def _open_path_to(path: Path) -> None:
    """Let the unprivileged users the servers drop to (postgres, dovecot, mail) reach `path`.

    pytest makes its temporary directories 0700 and root's, which would shut them out. Grants
    search permission (x) for others only, never listing (r); pytest takes it back from its
    base directory next session."""
    for directory in [path, *path.parents]:
        mode = stat.S_IMODE(directory.stat().st_mode)
        if not mode & stat.S_IXOTH:
            directory.chmod(mode | stat.S_IXOTH)


def reachable(directory: Path, name: str) -> Path:
    """Where a server's files go: `directory` itself, unless it would be under pytest's tree
    as root. pytest keeps that tree 0700, and any pytest session starting meanwhile (a second
    test run on the machine) takes back the search permission `_open_path_to` granted, which
    locks out the users the servers drop to mid-test. The files then live in a directory of
    their own under /tmp (removed when the test process exits), linked from `directory`."""
    if os.geteuid() != 0 or directory.exists() or "pytest-of-" not in str(directory.resolve()):
        directory.mkdir(parents=True, exist_ok=True)
        return directory.resolve()
    own = Path(tempfile.mkdtemp(prefix=f"pigeon-{name}-"))
    own.chmod(0o711)
    atexit.register(shutil.rmtree, own, ignore_errors=True)
    directory.parent.mkdir(parents=True, exist_ok=True)
    directory.symlink_to(own, target_is_directory=True)
    return own


def _group_alive(group: int) -> bool:
    """Whether a process of `group` lives (zombies, waiting for init to reap them, do not)."""
    for stat_path in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_path.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        state, process_group = fields[0], int(fields[2])
        if process_group == group and state not in "ZX":
            return True
    return False


def _tail(path: Path, limit: int = 6000) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"--- {path.name}: (not written)"
    return f"--- {path.name}:\n{text[-limit:]}"


class _Server:
    """What all the servers share: a child process in its own group, a readiness wait and
    stop (the server's own clean shutdown) versus kill (SIGKILL to the whole group: a crash)."""

    name = "server"
    #: The signal that makes this server shut down cleanly and promptly.
    stop_signal = signal.SIGTERM
    #: Send it to every process of the server, not only the one we started.
    stop_group = False

    def __init__(self, directory: Path) -> None:
        self.directory = reachable(Path(directory), self.name)
        self.process: subprocess.Popen[bytes] | None = None

    # --- to be provided by each server ------------------------------------------------------
    def _launch(self) -> subprocess.Popen[bytes]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    @property
    def log_paths(self) -> list[Path]:
        raise NotImplementedError

    # --- life cycle --------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float = 20.0) -> Self:
        """Start the server (again: same ports, same files) and wait until it serves."""
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        self.process = self._launch()
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self.process.poll() is not None:
                status = self.process.returncode
                self.kill()
                raise RuntimeError(f"{self.name} exited with status {status} while starting\n{self.logs()}")
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"{self.name} was not ready after {timeout}s\n{self.logs()}")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """Shut the server down cleanly and wait; kill it if it takes longer than `timeout`."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            if self.stop_group:
                os.killpg(process.pid, self.stop_signal)
            else:
                process.send_signal(self.stop_signal)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout)
        self.kill()  # whatever is left: a hung server, or children that outlived it

    def kill(self) -> None:
        """SIGKILL the server and every process it started, with no chance to clean up."""
        process = self.process
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the group is the server's own (new session)
        process.wait()
        self.process = None
        # The listening sockets close only when the last process holding them is gone; until
        # then connections would still be accepted, and starting again could not bind.
        deadline = time.monotonic() + 10
        while _group_alive(process.pid) and time.monotonic() < deadline:
            time.sleep(0.01)

    def restart(self, timeout: float = 20.0) -> Self:
        self.stop()
        return self.start(timeout)

    def logs(self) -> str:
        """The tail of each of the server's logs, for failure messages."""
        return "\n".join(_tail(path) for path in self.log_paths)

    def _popen(self, command: list[str], log: Path, **kwargs: Any) -> subprocess.Popen[bytes]:
        with open(log, "ab") as output:  # the child keeps its own copy of the descriptor
            return subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=output,
                start_new_session=True,
                **kwargs,
            )

    def __enter__(self) -> Self:
        if not self.running:
            self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


# --- Redis ---------------------------------------------------------------------------------------


class RedisServer(_Server):
    """A private redis-server with no persistence: a restart (or a kill) loses every key, as a
    Redis without AOF/RDB does; `start()` after `stop()`/`kill()` comes back on the same port,
    so clients that reconnect find it again ("Redis restarted mid-run")."""

    name = "redis-server"

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.port = free_port()
        self.log_path = self.directory / "redis.log"

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def log_paths(self) -> list[Path]:
        return [self.log_path]

    def client(self, **options: Any) -> redis.Redis:
        """A synchronous redis-py client for the test's own assertions (the caller closes it)."""
        import redis

        options.setdefault("socket_timeout", 5)
        return redis.Redis(host=HOST, port=self.port, db=0, **options)

    def _launch(self) -> subprocess.Popen[bytes]:
        # The log goes to stdout (logfile ""), so errors before logging starts land there too.
        command = [require("redis-server"), "--port", str(self.port), "--bind", HOST, "--save", ""]
        command += ["--appendonly", "no", "--dir", str(self.directory), "--daemonize", "no", "--logfile", ""]
        return self._popen(command, self.log_path, cwd=self.directory)

    def _ready(self) -> bool:
        try:
            with socket.create_connection((HOST, self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False


# --- Dovecot ---------------------------------------------------------------------------------------

_APPENDUID = re.compile(rb"\[APPENDUID \d+ (\d+)\]")
_FLAGS = re.compile(rb"FLAGS \(([^)]*)\)")
_LIST = re.compile(rb'\((?P<attributes>[^)]*)\) (?P<separator>"(?:[^"\\]|\\.)*"|NIL) (?P<name>.*)')


def _quote(text: str) -> str:
    """An IMAP quoted string (imaplib sends arguments as they are)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _unquote(text: bytes) -> str:
    if text.startswith(b'"') and text.endswith(b'"'):
        text = re.sub(rb"\\(.)", rb"\1", text[1:-1])
    return text.decode()


def _check(result: tuple[str, list[Any]], what: str) -> list[Any]:
    status, data = result
    if status != "OK":
        raise imaplib.IMAP4.error(f"{what}: {status} {data!r}")
    return data


class Dovecot(_Server):
    """A private Dovecot 2.3 IMAP server: plain IMAP (with STARTTLS) and implicit-TLS IMAPS on
    free loopback ports, a self-signed certificate for 127.0.0.1 and localhost (clients verify it
    with `ca_pem_path`), passwords from `users` (PLAIN and LOGIN, also without TLS), Maildir
    mail under the directory. IDLE sessions hear of other sessions' changes within about a
    second. The helpers are synchronous imaplib sessions, for a test's setup and assertions.

    With `oauth2_introspection_url` (http://127.0.0.1:<port>/..., no name lookups), it also
    takes AUTHENTICATE XOAUTH2 and OAUTHBEARER: Dovecot POSTs `token=<access token>` there
    (RFC 7662 introspection) for each login and lets the user in when the JSON answer has
    "active": true and "username" equal to the user logging in. The userdb still comes from
    `users`, so a user logging in with a token must be one of them."""

    name = "dovecot"
    host = HOST
    # Dovecot's master alone takes over a second to stop its children; each of them stops at
    # once on its own SIGTERM.
    stop_group = True

    def __init__(
        self,
        directory: Path,
        users: Mapping[str, str] | None = None,
        *,
        oauth2_introspection_url: str | None = None,
        settings: str = "",
    ) -> None:
        """`settings`: lines added to the end of the config, to make the server behave as some
        other server does (`mail_max_keyword_length = 4`: one that takes no keywords)."""
        super().__init__(directory)
        self.settings = settings
        if os.geteuid() != 0:
            raise RuntimeError("the private Dovecot must be started as root (it drops to its own users)")
        self.users = dict(users if users is not None else {"app": "secret"})
        for user, password in self.users.items():
            if not re.fullmatch(r"[\w.@+-]+", user) or re.search(r"[:\n]", password):
                raise ValueError(f"user {user!r}: names are [\\w.@+-]+, passwords have no ':' or newline")
        if oauth2_introspection_url is not None and not re.fullmatch(
            r"http://127\.0\.0\.1:\d+/\S*", oauth2_introspection_url
        ):
            raise ValueError(f"{oauth2_introspection_url!r}: the introspection URL must be http://127.0.0.1:<port>/...")
        self.oauth2_introspection_url = oauth2_introspection_url
        self.port = free_port()
        self.imaps_port = free_port()
        self.run_dir = self.directory / "run"
        if len(str(self.run_dir)) > _SOCKET_ROOM:
            raise ValueError(f"{self.run_dir} is too long for Dovecot's Unix sockets: use a shorter directory")
        self.config_path = self.directory / "dovecot.conf"
        self.log_path = self.directory / "dovecot.log"
        self.info_log_path = self.directory / "dovecot-info.log"
        self.stderr_path = self.directory / "dovecot.stderr"
        self.ca_pem_path = self.directory / "ca.pem"
        self.mail_dir = self.directory / "mail"
        self._write_files()

    @property
    def log_paths(self) -> list[Path]:
        return [self.stderr_path, self.log_path, self.info_log_path]

    def _write_files(self) -> None:
        import trustme

        # The mail belongs to one unprivileged system user (Dovecot refuses root), dovecot's
        # auth process (user dovecot) reads the password file, and its login processes
        # (dovenull) and the mail user must reach the directory through pytest's 0700 ones.
        mail_user = next(name for name in ("mail", "nobody") if _user_exists(name))
        uid, gid = pwd.getpwnam(mail_user).pw_uid, pwd.getpwnam(mail_user).pw_gid
        _open_path_to(self.directory)
        for directory in (self.mail_dir, self.directory / "home"):
            directory.mkdir(exist_ok=True)
            os.chown(directory, uid, gid)
            directory.chmod(0o700)
        (self.directory / "state").mkdir(exist_ok=True)

        ca = trustme.CA()
        leaf = ca.issue_cert(HOST, "localhost")
        ca.cert_pem.write_to_path(str(self.ca_pem_path))
        cert_path, key_path = self.directory / "cert.pem", self.directory / "key.pem"
        cert_path.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
        leaf.private_key_pem.write_to_path(str(key_path))
        key_path.chmod(0o600)  # read by the master (root) and handed to the login processes

        users_path = self.directory / "users"
        users_path.write_text("".join(f"{user}:{{PLAIN}}{password}::::::\n" for user, password in self.users.items()))
        os.chown(users_path, 0, grp.getgrnam("dovecot").gr_gid)
        users_path.chmod(0o640)

        if self.oauth2_introspection_url is None:
            mechanisms, passwd_mechanisms, oauth2 = "plain login", "", ""
        else:
            # Read by the auth process (user dovecot); it holds no secret.
            oauth2_path = self.directory / "dovecot-oauth2.conf.ext"
            oauth2_path.write_text(_DOVECOT_OAUTH2_CONF.format(url=self.oauth2_introspection_url))
            oauth2_path.chmod(0o644)
            mechanisms = "plain login xoauth2 oauthbearer"
            passwd_mechanisms = "\n  mechanisms = plain login"
            oauth2 = _DOVECOT_OAUTH2_PASSDB.format(args=oauth2_path)
        self.config_path.write_text(
            _DOVECOT_CONF.format(
                mechanisms=mechanisms,
                passwd_mechanisms=passwd_mechanisms,
                oauth2=oauth2,
                directory=self.directory,
                run=self.run_dir,
                log=self.log_path,
                info_log=self.info_log_path,
                mail=self.mail_dir,
                uid=uid,
                gid=gid,
                cert=cert_path,
                key=key_path,
                users=users_path,
                port=self.port,
                imaps_port=self.imaps_port,
            )
            + self.settings
        )

    def _launch(self) -> subprocess.Popen[bytes]:
        command = [require("dovecot"), "-F", "-c", str(self.config_path)]
        environment = {**os.environ, "DOVECOT_HOSTDOMAIN": "localhost"}  # see the config
        return self._popen(command, self.stderr_path, cwd=self.directory, env=environment)

    def _ready(self) -> bool:
        try:
            with socket.create_connection((HOST, self.port), timeout=1) as sock:
                if not sock.recv(256).startswith(b"* OK"):
                    return False
            socket.create_connection((HOST, self.imaps_port), timeout=1).close()
        except OSError:
            return False
        return True

    def end_sessions(self) -> int:
        """SIGTERM every IMAP session process (`imap`), as an operator's `kill -TERM` of them or
        a restart does: each says `* BYE Server shutting down.` and closes, while the master
        keeps serving new connections. How many there were."""
        assert self.process is not None, "dovecot is not running"
        ended = 0
        for stat_path in Path("/proc").glob("[0-9]*/stat"):
            try:
                text = stat_path.read_text()
            except OSError:
                continue  # gone meanwhile
            name = text[text.index("(") + 1 : text.rindex(")")]
            fields = text.rsplit(")", 1)[1].split()
            if name == "imap" and int(fields[2]) == self.process.pid:  # in this server's process group
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(stat_path.parent.name), signal.SIGTERM)
                    ended += 1
        return ended

    # --- IMAP helpers ----------------------------------------------------------------------------
    def ssl_context(self) -> ssl.SSLContext:
        """A client context that trusts only this server's CA (and checks the host name)."""
        return ssl.create_default_context(cafile=str(self.ca_pem_path))

    def connect(self, user: str, *, tls: bool = False, timeout: float = 10.0) -> imaplib.IMAP4:
        """A logged-in imaplib connection (IMAPS if `tls`), for what the helpers do not cover.
        The caller logs out."""
        if tls:
            client: imaplib.IMAP4 = imaplib.IMAP4_SSL(
                HOST, self.imaps_port, ssl_context=self.ssl_context(), timeout=timeout
            )
        else:
            client = imaplib.IMAP4(HOST, self.port, timeout=timeout)
        try:
            _check(client.login(user, self.users[user]), f"LOGIN {user}")
        except BaseException:
            client.shutdown()
            raise
        return client

    @contextlib.contextmanager
    def _session(self, user: str, folder: str | None = None) -> Iterator[imaplib.IMAP4]:
        """A connection with `folder` open read-only (EXAMINE), so looking sets no \\Seen."""
        client = self.connect(user)
        try:
            if folder is not None:
                _check(client.select(_quote(folder), readonly=True), f"EXAMINE {folder}")
            yield client
        finally:
            with contextlib.suppress(OSError, imaplib.IMAP4.error):
                client.logout()

    def append(self, user: str, messages: Iterable[bytes], folder: str = "INBOX") -> list[int]:
        """APPEND each message to `folder` over one connection; their UIDs (from APPENDUID)."""
        uids = []
        with self._session(user) as client:
            for message in messages:
                data = _check(client.append(_quote(folder), "", "", message), f"APPEND {folder}")
                found = _APPENDUID.search(data[0])
                if found is None:
                    raise imaplib.IMAP4.error(f"APPEND to {folder}: no APPENDUID in {data!r}")
                uids.append(int(found.group(1)))
        return uids

    def uids(self, user: str, criteria: str = "ALL", folder: str = "INBOX") -> list[int]:
        """UID SEARCH `criteria` (IMAP search syntax, sent as is) in `folder`."""
        with self._session(user, folder) as client:
            data = _check(client.uid("SEARCH", criteria), f"UID SEARCH {criteria}")
        return [int(uid) for uid in b" ".join(item for item in data if item).split()]

    def unseen(self, user: str, folder: str = "INBOX") -> list[int]:
        return self.uids(user, "UNSEEN", folder)

    def uidvalidity(self, user: str, folder: str = "INBOX") -> int:
        """The folder's UIDVALIDITY (STATUS), part of the key a message is claimed under."""
        with self._session(user) as client:
            data = _check(client.status(_quote(folder), "(UIDVALIDITY)"), f"STATUS {folder}")
        found = re.search(rb"UIDVALIDITY (\d+)", data[0] if isinstance(data[0], bytes) else b"")
        if found is None:
            raise imaplib.IMAP4.error(f"STATUS {folder}: no UIDVALIDITY in {data!r}")
        return int(found.group(1))

    def flags(self, user: str, uid: int, folder: str = "INBOX") -> set[str]:
        """The message's flags, without \\Recent (which depends on which session looked first)."""
        with self._session(user, folder) as client:
            data = _check(client.uid("FETCH", str(uid), "(FLAGS)"), f"UID FETCH {uid}")
        for item in data:
            found = _FLAGS.search(item if isinstance(item, bytes) else b"")
            if found:
                return set(found.group(1).decode().split()) - {"\\Recent"}
        raise LookupError(f"{user}'s {folder} has no message with UID {uid}")

    def message(self, user: str, uid: int, folder: str = "INBOX") -> bytes:
        """The message as stored (BODY.PEEK[]: reading it does not set \\Seen)."""
        with self._session(user, folder) as client:
            data = _check(client.uid("FETCH", str(uid), "(BODY.PEEK[])"), f"UID FETCH {uid}")
        for item in data:
            if isinstance(item, tuple):
                body: bytes = item[1]
                return body
        raise LookupError(f"{user}'s {folder} has no message with UID {uid}")

    def create_folder(self, user: str, name: str) -> None:
        """CREATE `name` ("/" separates levels: "Archive/2024")."""
        with self._session(user) as client:
            _check(client.create(_quote(name)), f"CREATE {name}")

    def folders(self, user: str) -> list[str]:
        """Every folder's name (LIST "" "*")."""
        with self._session(user) as client:
            data = _check(client.list(), "LIST")
        names = []
        for item in data:
            if isinstance(item, tuple):  # the name came as a literal
                names.append(item[1].decode())
            elif item and (found := _LIST.fullmatch(item)):
                names.append(_unquote(found.group("name")))
        return names

    def count(self, user: str, folder: str = "INBOX") -> int:
        """How many messages `folder` holds (STATUS MESSAGES)."""
        with self._session(user) as client:
            data = _check(client.status(_quote(folder), "(MESSAGES)"), f"STATUS {folder}")
        found = re.search(rb"MESSAGES (\d+)", data[0])
        if found is None:
            raise imaplib.IMAP4.error(f"STATUS {folder}: {data!r}")
        return int(found.group(1))


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


# Dovecot's defaults are for a system service; each line here says why a test instance differs.
_DOVECOT_CONF = """\
# A private Dovecot for one test, written by tests/support/services.py.
# Everything of its own lives under {directory}; nothing from /etc/dovecot is read.
base_dir = {run}
state_dir = {directory}/state
instance_name = dovecot-{port}
log_path = {log}
info_log_path = {info_log}
protocols = imap
listen = 127.0.0.1
# No name lookups: Dovecot resolves the machine's name to find its domain (asking DNS when
# /etc/hosts lacks it) unless DOVECOT_HOSTDOMAIN is set, as it is for the master and here
# for its children.
hostname = localhost
import_environment = TZ CORE_OUTOFMEM CORE_ERROR DOVECOT_HOSTDOMAIN=localhost
postmaster_address = postmaster@localhost
auth_use_winbind = no
login_trusted_networks =
auth_verbose = yes
default_internal_user = dovecot
default_internal_group = dovecot
default_login_user = dovenull

ssl = yes
ssl_cert = <{cert}
ssl_key = <{key}
ssl_min_protocol = TLSv1.2
# Tests log in with passwords over plain connections too.
disable_plaintext_auth = no
auth_mechanisms = {mechanisms}
passdb {{
  driver = passwd-file{passwd_mechanisms}
  args = scheme=PLAIN username_format=%u {users}
}}
{oauth2}userdb {{
  driver = passwd-file
  args = username_format=%u {users}
}}

# All mail belongs to one unprivileged system user (Dovecot refuses root and, by default,
# any uid below 500).
mail_uid = {uid}
mail_gid = {gid}
first_valid_uid = {uid}
last_valid_uid = {uid}
first_valid_gid = {gid}
last_valid_gid = {gid}
mail_location = maildir:{mail}/%u
mail_home = {directory}/home/%u
mail_plugins =
mail_fsync = never
namespace inbox {{
  inbox = yes
  separator = /
}}
# IDLE sessions see other sessions' changes at once (inotify), or at most a second later.
mailbox_idle_check_interval = 1 secs

protocol imap {{
  # Tests open several connections as the same user from the same address.
  mail_max_userip_connections = 100
}}
service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {port}
  }}
  inet_listener imaps {{
    address = 127.0.0.1
    port = {imaps_port}
    ssl = yes
  }}
  # High-performance mode: two waiting processes take all the logins at once.
  service_count = 0
  process_min_avail = 2
  client_limit = 100
}}
service imap {{
  process_limit = 100
}}
"""

# With oauth2_introspection_url: tokens (XOAUTH2, OAUTHBEARER) checked by that endpoint alone.
_DOVECOT_OAUTH2_PASSDB = """\
passdb {{
  driver = oauth2
  mechanisms = xoauth2 oauthbearer
  args = {args}
}}
"""

_DOVECOT_OAUTH2_CONF = """\
# Written by tests/support/services.py. No tokeninfo_url: the introspection endpoint alone
# decides (POST token=..., RFC 7662), and its "active" must be true.
introspection_url = {url}
introspection_mode = post
force_introspection = yes
username_attribute = username
active_attribute = active
active_value = true
"""


# --- PostgreSQL -------------------------------------------------------------------------------------


def _postgres_tool(name: str) -> str:
    """The newest installed PostgreSQL's own binary (Debian keeps initdb and postgres off PATH;
    bookworm's is 15), else whatever PATH has."""
    found = [path for path in POSTGRES_LIB.glob(f"*/bin/{name}") if path.parts[-3].isdigit()]
    if found:
        return str(max(found, key=lambda path: int(path.parts[-3])))
    return require(name)


def _postgres_user() -> dict[str, Any]:
    """Popen arguments that run a PostgreSQL binary as the postgres system user when we are
    root: PostgreSQL refuses to run as root. Popen switches user itself (no runuser or su in
    between), so the signals stop() and kill() send reach the server directly."""
    if os.geteuid() != 0:
        return {}
    account = pwd.getpwnam("postgres")
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


class Postgres(_Server):
    """A private PostgreSQL 15 cluster: trust authentication, TCP on a free 127.0.0.1 port, its
    Unix socket inside the directory, fsync off (data survives a kill of the server, not of the
    machine). `template` is a data directory made by `Postgres.initdb` to copy instead of running
    initdb, which saves most of the start-up time (~0.5 s of ~0.7 s)."""

    name = "postgres"
    stop_signal = signal.SIGINT  # "fast" shutdown: SIGTERM ("smart") waits for clients to leave

    def __init__(self, directory: Path, template: Path | None = None) -> None:
        super().__init__(directory)
        self.port = free_port()
        self.template = template
        self.data_dir = self.directory / "data"
        self.socket_dir = self.directory / "socket"
        self.log_path = self.directory / "postgres.log"
        if len(str(self.socket_dir)) > _SOCKET_ROOM:
            raise ValueError(f"{self.socket_dir} is too long for PostgreSQL's Unix socket: use a shorter directory")

    @property
    def dsn(self) -> str:
        return self.dsn_for("postgres")

    def dsn_for(self, database: str) -> str:
        return f"postgresql://postgres@{HOST}:{self.port}/{database}"

    @property
    def log_paths(self) -> list[Path]:
        return [self.log_path]

    @staticmethod
    def initdb(data_dir: Path) -> Path:
        """Make a new, empty cluster in `data_dir` (superuser postgres, trust authentication)."""
        data_dir = Path(data_dir).resolve()
        data_dir.mkdir(parents=True, exist_ok=True)
        _hand_to_postgres(data_dir)
        command = [_postgres_tool("initdb"), "-D", str(data_dir), "-U", "postgres", "-A", "trust"]
        command += ["-E", "UTF8", "--no-locale", "--no-sync"]
        result = subprocess.run(command, cwd=data_dir, capture_output=True, text=True, check=False, **_postgres_user())
        if result.returncode != 0:
            raise RuntimeError(f"initdb failed ({result.returncode}):\n{result.stdout}{result.stderr}")
        return data_dir

    def _launch(self) -> subprocess.Popen[bytes]:
        if os.geteuid() == 0:
            _open_path_to(self.directory)  # the server's working directory, as postgres
        if not (self.data_dir / "PG_VERSION").exists():
            if self.template is None:
                self.initdb(self.data_dir)
            else:  # cp -a keeps the template's owner (postgres) and modes
                shutil.rmtree(self.data_dir, ignore_errors=True)
                subprocess.run(["cp", "-a", str(self.template), str(self.data_dir)], check=True)
        self.socket_dir.mkdir(exist_ok=True)
        _hand_to_postgres(self.socket_dir)
        command = [_postgres_tool("postgres"), "-D", str(self.data_dir), "-p", str(self.port)]
        command += ["-h", HOST, "-k", str(self.socket_dir)]
        for setting in (
            # Commits reach the kernel (synchronous_commit stays on: a kill loses nothing
            # committed) but never wait for the disk.
            "fsync=off",
            "full_page_writes=off",
            "logging_collector=off",
            "log_hostname=off",
            "shared_buffers=32MB",
            "max_connections=100",
        ):
            command += ["-c", setting]
        return self._popen(command, self.log_path, cwd=self.directory, **_postgres_user())

    def _ready(self) -> bool:
        """What pg_ctl -w waits for: our postmaster (not one killed before) says "ready" in its
        pid file."""
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
        except FileNotFoundError:
            return False
        assert self.process is not None
        return len(lines) >= 8 and lines[0] == str(self.process.pid) and lines[7].strip() == "ready"

    def _psql(self, sql: str, database: str, *options: str) -> str:
        command = [_postgres_tool("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", self.dsn_for(database)]
        command += [*options, "-c", sql]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"psql failed ({result.returncode}) on {sql!r}:\n{result.stderr}")
        return result.stdout

    def execute(self, sql: str, database: str = "postgres") -> None:
        """Run SQL (one or more statements) with psql; raises with psql's message on error."""
        self._psql(sql, database)

    def query(self, sql: str, database: str = "postgres") -> list[tuple[str | None, ...]]:
        """The rows one statement returns, as psql prints them: text values ('3', 't'), None
        for NULL. psql, not the driver under test, so its results are an independent view."""
        output = self._psql(sql, database, "--csv", "-t", "-P", "null=\\N")
        return [tuple(None if value == "\\N" else value for value in row) for row in csv.reader(io.StringIO(output))]


def _hand_to_postgres(path: Path) -> None:
    """As root: the postgres user owns `path` and can reach it (see `_open_path_to`)."""
    if os.geteuid() == 0:
        account = pwd.getpwnam("postgres")
        os.chown(path, account.pw_uid, account.pw_gid)
        _open_path_to(path.parent)
    path.chmod(0o700)


__all__ = ["Dovecot", "Postgres", "RedisServer", "free_port", "reachable"]
