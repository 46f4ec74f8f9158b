"""The configuration schema: every key, its type, its default. This file is the reference.

Values that are durations accept a number of seconds or a string with a unit
(`"250ms"`, `"30s"`, `"5m"`, `"2h"`, `"1d"`); sizes accept a number of bytes or a string
(`"64KiB"`, `"25MiB"`, `"10MB"`, `"1GiB"`). With no file at all the defaults run a working
node: SMTP on 127.0.0.1:2525, HTTP on 127.0.0.1:8025, data under ./var.
"""

from __future__ import annotations

import datetime
import ipaddress
import math
import re
import socket
from pathlib import Path
from typing import Annotated, Any, ClassVar, Final, Literal

import msgspec

from pigeon.node.cpus import auto_workers, available_cpus
from pigeon.node.scheduling import Scheduling

DURATION_TEXT: Final = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)?\s*")
DURATION_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_SIZE: Final = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B|B)?\s*", re.IGNORECASE)
_SIZE_UNITS: Final = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}


PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]


class Duration(float):
    """Seconds. Written as a number of seconds or "30s", "5m", "250ms", "2h", "1d"."""


class PositiveDuration(Duration):
    """A Duration of more than 0: a timeout, interval or window that 0 would make fire at once
    (or count nothing) is refused at load, naming the key, rather than run."""


class Size(int):
    """Bytes. Written as a number of bytes or "64KiB", "25MiB", "10MB"."""


class PositiveSize(Size):
    """A Size of more than 0: a limit that 0 would make refuse everything is refused at load."""


class DataRate(int):
    """Bytes a second. Written as a number or "500B/s", "2KiB/s", "1MB/s" (the "/s" optional)."""


class Network(str):
    """An IP network in CIDR form ("127.0.0.0/8", "::1/128"); a bare address means /32 or /128."""

    __slots__ = ()

    @property
    def network(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        return ipaddress.ip_network(self, strict=False)


class Endpoint(str):
    """A listen address "host:port"; IPv6 hosts in brackets: "[::1]:2525"."""

    __slots__ = ()

    @property
    def host(self) -> str:
        return split_endpoint(self)[0]

    @property
    def port(self) -> int:
        return split_endpoint(self)[1]


class Peer(Endpoint):
    """An address Pigeon connects to, "host:port" (a next hop, a resolver); IPv6 hosts in
    brackets: "[::1]:53". Its port is 1 to 65535: port 0, which a listener takes to mean "any
    free port", is no server's, and would only fail at the first connection."""

    __slots__ = ()
    usual_port: ClassVar[int] = 25
    """The port an example in an error message gives."""

    @property
    def host(self) -> str:
        return split_peer(self, self.usual_port)[0]

    @property
    def port(self) -> int:
        return split_peer(self, self.usual_port)[1]


class NameserverPeer(Peer):
    """A `[dns] nameservers` entry: a Peer whose usual port is DNS's."""

    __slots__ = ()
    usual_port: ClassVar[int] = 53


def numeric_name_problem(name: str) -> str | None:
    """Why `name`, which is no IP address, is no host name either (None: nothing of this): its
    last label is all digits (RFC 1123 2.1, RFC 3696 2), as only an IPv4 address's is. Such a
    name ("1.2.3", "999.1.1.1", "1.2.3.4.5", "192.0.2.1.") is read as an address, or as nothing,
    by whoever takes it: `inet_aton`, under every resolver, reads "1.2.3" as 1.2.0.3."""
    last = name.removesuffix(".").rpartition(".")[2]
    if last.isascii() and last.isdigit():
        return (
            f'is not a host name: its last label, "{last}", is all digits, as only an IP address\'s is (RFC 1123 2.1)'
        )
    return None


def host_problem(host: str, port: int | str | None = None) -> str | None:
    """Why the host of a setting Pigeon connects to or listens on is neither an IP address nor a
    host name (None: it is one), said with what to write instead (`port`: the example's, for a
    "host:port" setting)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        problem = numeric_name_problem(host)
        if problem is not None:
            example = "192.0.2.1" if port is None else f"192.0.2.1:{port}"
            return f"{host!r} {problem}; an IPv4 address is four numbers from 0 to 255, like {example}"
    return None


def canonical_host(host: str) -> str:
    """One spelling of a host Pigeon connects to (a `Peer`'s, without brackets): a name in
    lower case without its trailing dot, an IP address as `ipaddress` writes it ("::1", not
    "0:0:0:0:0:0:0:1"). Two spellings of one next hop are then one site (one connection limit,
    one hold) and one smart host to the load's checks. Names are not resolved: "localhost" and
    "127.0.0.1" stay two."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.lower().removesuffix(".")


def split_endpoint(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{text!r} is not host:port (port 0..65535; 0 picks a free port)")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        # "::1:2525" could as well be the address ::1:2525 with no port.
        raise ValueError(f'{text!r}: write an IPv6 address in brackets, then the port: "[{host}]:{port}"')
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise ValueError(f"{text!r} has no host; use 0.0.0.0:{port} or [::]:{port} for every address")
    if (problem := host_problem(host, port)) is not None:  # ("127.1" would bind 127.0.0.1)
        raise ValueError(f"{text!r}: {problem}")
    if ":" in host:
        try:
            mapped = ipaddress.IPv6Address(host).ipv4_mapped
        except ValueError:
            mapped = None
        if mapped is not None:
            # Pigeon's IPv6 sockets are IPv6-only (IPV6_V6ONLY), and Linux binds none of them
            # to an IPv4-mapped address: the start would fail with "Invalid argument".
            raise ValueError(
                f"{text!r} is an IPv4-mapped IPv6 address, which no IPv6 socket can listen on: "
                f'write the IPv4 address, "{mapped}:{port}"'
            )
    return host, int(port)


def split_peer(text: str, usual_port: int = 25) -> tuple[str, int]:
    """`text` as a `Peer`'s host and port; raises ValueError saying what is wrong, for a person."""
    host, sep, port = text.rpartition(":")
    if text.startswith("[") and text.endswith("]"):
        host, sep, port = text, "", ""
    elif ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ValueError(f'{text!r}: write an IPv6 address in brackets, then the port: "[2001:db8::1]:{usual_port}"')
    if not sep or "]" in port:
        raise ValueError(f"{text!r} is not host:port: name the server's port too, like '{text}:{usual_port}'")
    if not port.isdigit():
        raise ValueError(f"{text!r}: the port {port!r} is not a number from 1 to 65535")
    if not 1 <= int(port) <= 65535:
        # 0 is a listener's "any free port", which no server listens on.
        raise ValueError(f"{text!r}: port {port} is no server's; a port to connect to is 1 to 65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise ValueError(f"{text!r} has no host")
    if (problem := host_problem(host, port)) is not None:
        raise ValueError(f"{text!r}: {problem}")
    if ":" in host and (mapped := _ipv4_mapped(host)) is not None:
        # The same server as its IPv4 address, which every check of an address (loopback, a
        # listener's own) reads as it is: one spelling, as a listen address has.
        raise ValueError(f'{text!r} is an IPv4-mapped IPv6 address: write the IPv4 address, "{mapped}:{port}"')
    return host, int(port)


def _ipv4_mapped(host: str) -> ipaddress.IPv4Address | None:
    try:
        return ipaddress.IPv6Address(host).ipv4_mapped
    except ValueError:
        return None


def _expected(kind: type) -> str:
    """What a value of `kind` looks like, for "expected ..., got true"."""
    if issubclass(kind, Duration):
        return 'a duration such as "30s"'
    if issubclass(kind, Size):
        return 'a size such as "25MiB"'
    if kind is DataRate:
        return 'a data rate such as "2KiB/s"'
    if kind is Network:
        return 'an IP network such as "127.0.0.0/8"'
    if issubclass(kind, Peer):
        return f'an address such as "192.0.2.1:{kind.usual_port}"'
    if kind is Endpoint:
        return 'a listen address such as "127.0.0.1:2525"'
    return "a path"


def decode_hook(kind: type, value: Any) -> Any:
    """msgspec hook turning TOML values into the custom types above, with clear errors."""
    if isinstance(value, bool) and kind in _HOOKED:
        # Spelt as the file has it ("got true", as an integer key says), not Python's True.
        raise ValueError(f"expected {_expected(kind)}, got {toml_spelling(value)}")
    if kind is Duration or kind is PositiveDuration:
        seconds = _duration(value)
        if kind is PositiveDuration and seconds <= 0:
            raise ValueError(MORE_THAN_ZERO)
        return kind(seconds)
    if kind is Size or kind is PositiveSize:
        size = _size(value)
        if kind is PositiveSize and size <= 0:
            raise ValueError('must be more than 0 (e.g. "64KiB", "25MiB")')
        return kind(size)
    if kind is DataRate:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return DataRate(value)
        if isinstance(value, str):
            match = _SIZE.fullmatch(value.strip().removesuffix("/s").removesuffix("/S"))
            if match:
                unit = (match.group(2) or "b").lower()
                return DataRate(int(float(match.group(1)) * _SIZE_UNITS[unit]))
        raise ValueError(f'{_given(value)} is not a data rate: use bytes a second or a string like "500B/s", "2KiB/s"')
    if kind is Network:
        if isinstance(value, str):
            try:
                network = ipaddress.ip_network(value, strict=False)
            except ValueError:
                pass
            else:
                address = ipaddress.ip_interface(value).ip
                if address != network.network_address:
                    # "10.0.0.1/8": a typo in who may relay, or in which network is meant
                    # (10.0.0.1/32?); taken as 10.0.0.0/8 it would quietly open the relay to
                    # a whole network. Refused, naming both readings.
                    raise ValueError(
                        f"{value!r} has host bits set: did you mean {str(network)!r}? "
                        f"(or '{address}/{network.max_prefixlen}' for the one address)"
                    )
                return Network(value)
        raise ValueError(f'{_given(value)} is not an IP network like "127.0.0.0/8" or "::1"')
    if kind is Peer or kind is NameserverPeer:
        if isinstance(value, str):
            split_peer(value, kind.usual_port)
            return kind(value)
        port = kind.usual_port  # (a resolver's example on 53, a next hop's on 25)
        raise ValueError(f'{_given(value)} is not an address like "192.0.2.1:{port}" or "[2001:db8::1]:{port}"')
    if kind is Endpoint:
        if isinstance(value, list):
            example = value[0] if value and isinstance(value[0], str) else "127.0.0.1:8025"
            raise ValueError(f'takes one address as a string, not a list: listen = "{example}"')
        if isinstance(value, str):
            split_endpoint(value)
            return Endpoint(value)
        raise ValueError(f'{_given(value)} is not a listen address like "127.0.0.1:2525"')
    if kind is Path:
        if isinstance(value, str) and value:
            return Path(value)
        raise ValueError(f"{_given(value)} is not a path")
    raise NotImplementedError(kind)


_HOOKED: Final = (
    Duration,
    PositiveDuration,
    Size,
    PositiveSize,
    DataRate,
    Network,
    Peer,
    NameserverPeer,
    Endpoint,
    Path,
)
"""The kinds `decode_hook` reads."""


SECRET_KEYS: Final = frozenset({"token", "password", "auth_password", "secret"})
"""Keys whose value is a secret: `pigeon config show` writes it as `***`, and an error about it
names the key and what is wrong, never the value."""
URL_KEYS: Final = frozenset({"url", "redis_url", "dsn"})
"""Keys whose value is a URL or DSN that may carry a password or token: shown redacted
(`redaction.redact_url`), and never in an error about it."""
HEADERS_KEY: Final = "headers"
"""A webhook's or log hook's request headers: every value but a harmless header's is shown as
`***` (`redaction.redact_headers`), and none in an error."""


MORE_THAN_ZERO: Final = 'must be more than 0 (e.g. "2s", "250ms")'
"""What a `PositiveDuration` of 0 is told."""


_BARE_KEY: Final = re.compile(r"[A-Za-z0-9_-]+")


def toml_spelling(value: Any) -> str:
    """A value read from a TOML file as TOML writes it, for a message that says what the file
    gave: `true`, not Python's `True`; `[true, 1]`, not `[True, 1]`; `2024-01-01`, not
    `datetime.date(2024, 1, 1)`; `-inf`, `nan`; a string as a basic string, `"x"`; a table as
    an inline table, `{ a = 1 }`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)  # ("1.5", "1e+300", "1e-05": each a TOML float)
    if isinstance(value, str):
        # (TOML's escapes are JSON's, \uXXXX included; what needs none is written as it is)
        return msgspec.json.encode(value).decode()
    if isinstance(value, datetime.datetime):  # (before date: a datetime is a date)
        if value.tzinfo is not None and value.utcoffset() == datetime.timedelta(0):
            return _seconds_cut(value.replace(tzinfo=None).isoformat()) + "Z"
        return _seconds_cut(value.isoformat())  # (an offset "+02:00", or a local date-time)
    if isinstance(value, datetime.date | datetime.time):
        return _seconds_cut(value.isoformat())
    if isinstance(value, list):
        return f"[{', '.join(toml_spelling(item) for item in value)}]"
    if isinstance(value, dict):
        keys = (key if _BARE_KEY.fullmatch(key) else toml_spelling(key) for key in value)
        pairs = ", ".join(f"{key} = {toml_spelling(item)}" for key, item in zip(keys, value.values(), strict=True))
        return f"{{ {pairs} }}" if pairs else "{}"
    return repr(value)  # (no TOML value: a default's, never read from the file)


def _seconds_cut(iso: str) -> str:
    """An ISO 8601 time's fraction of a second without its trailing zeros ("07:32:00.5", not
    Python's "07:32:00.500000"), as a TOML file writes it."""
    return re.sub(r"\.(\d+)", lambda fraction: f".{fraction[1].rstrip('0')}".rstrip("."), iso)


def _given(value: Any) -> str:
    """A value `decode_hook` refuses, for its message: a string quoted as Pigeon's messages quote
    what was given (`'forever'`, as TOML writes a literal string), anything else as TOML writes
    it (`toml_spelling`)."""
    return repr(value) if isinstance(value, str) else toml_spelling(value)


def _duration(value: Any) -> float:
    seconds: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        seconds = float(value)
    elif isinstance(value, str) and (match := DURATION_TEXT.fullmatch(value)):
        seconds = float(match.group(1)) * DURATION_UNITS[match.group(2)]
    if seconds is not None and math.isfinite(seconds):  # (TOML's inf, or 1e400: no time to wait)
        return seconds
    raise ValueError(f'{_given(value)} is not a duration: use seconds or a string like "30s", "5m", "250ms"')


def _size(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        match = _SIZE.fullmatch(value)
        if match:
            unit = (match.group(2) or "b").lower()
            return int(float(match.group(1)) * _SIZE_UNITS[unit])
    raise ValueError(f'{_given(value)} is not a size: use bytes or a string like "64KiB", "25MiB", "10MB"')


class _Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class NodeConfig(_Section):
    name: str = msgspec.field(default_factory=socket.gethostname)
    """Node name written into every log record, and the seed of its message ids: not empty,
    without white space or control characters (checked at load). Default: the host name."""
    workers: Annotated[int, msgspec.Meta(ge=1, le=64)] | Literal["auto"] = "auto"
    """Worker processes, each with its own spool shard, accepting on the listening sockets the
    main process bound (no SO_REUSEPORT: a second node on the port fails to start).
    "auto": one per CPU this process may use (its affinity, capped by a cgroup CPU quota) but
    one, which is left to the kernel's network stack, the spools' commit threads and whatever
    else runs there; at least one (`pigeon.node.cpus`; the README's "Workers" has the figures)."""
    scheduling: Scheduling = "batch"
    """The kernel scheduling policy of the node's processes (Linux): "batch" (SCHED_BATCH: a
    woken worker does not preempt what is running, and finds more work when it runs; fewer
    context switches and less CPU per message under load) or "normal" (SCHED_OTHER, the
    default of every process). See `pigeon.node.scheduling` and the README's "Workers"."""
    shutdown_timeout: PositiveDuration = PositiveDuration(30)
    """On SIGTERM, how long open SMTP transactions may take to finish (more than 0: 0 would cut
    every open transaction and delivery off at any stop)."""
    worker_timeout: Duration = Duration(30)
    """With several workers: a worker that has not answered the supervisor's heartbeat for this
    long (its loop blocked, or the process stopped) is killed (SIGKILL) and started again, and
    an admin request the workers are all asked gets 503 with what the others answered when one
    has not answered within it. At least 2s."""
    reload_timeout: PositiveDuration = PositiveDuration(60)
    """SIGHUP: how long a worker may take to read the files again and import the policy module
    (in a thread: mail and /healthz go on meanwhile with the running configuration). A reload
    that takes longer is abandoned, logged, and the running configuration stays."""
    user: str | None = None
    """Started as root, bind the listeners, then run as this user (every process, for good).
    The spool and log directories are made and given to it. Started as this user, nothing
    changes; started as anyone else, Pigeon refuses to start. None: run as whoever starts it."""
    group: str | None = None
    """The group to run as with `user`. Default: the user's primary group (and the user's
    supplementary groups are kept either way, e.g. `ssl-cert` to read a certificate key)."""

    @property
    def worker_count(self) -> int:
        if self.workers == "auto":
            return auto_workers(available_cpus())
        return self.workers


class SmtpConfig(_Section):
    listen: list[Endpoint] = msgspec.field(default_factory=lambda: [Endpoint("127.0.0.1:2525")])
    """Addresses the SMTP listener binds to: a list, or one address as a string."""
    hostname: str = msgspec.field(default_factory=socket.gethostname)
    """Name in the banner, EHLO reply and Received headers: a domain name or an address literal
    ("[192.0.2.1]", "[IPv6:2001:db8::1]"; a bare address is refused), checked at load as the SMTP
    client checks a name to greet with (`config.load`)."""
    banner: str = "ESMTP Pigeon"
    """The banner's text after the hostname, which comes first as RFC 5321 4.3.1 asks:
    `220 <hostname> <banner>` (Postfix's smtpd_banner without its $myhostname). Printable ASCII
    and spaces, no line break or control character (checked at load); keep "ESMTP" in it, which
    some old clients look for before they send EHLO. "": the hostname alone."""
    relay_networks: list[Network] = msgspec.field(default_factory=lambda: [Network("127.0.0.0/8"), Network("::1/128")])
    """Clients in these networks may send to any domain. Others must authenticate. A list, or one
    network as a string. A network with host bits set ("10.0.0.1/8") is refused at load."""
    postmaster: str = ""
    """Where mail for <postmaster> (no domain) goes; anyone may send it (RFC 5321 4.5.1).
    Default: postmaster@<hostname>."""
    max_message_size: PositiveSize = PositiveSize(25 * 1024 * 1024)
    """Largest message accepted (advertised with SIZE, checked on MAIL and on the data)."""
    max_recipients: PositiveInt = 1000
    """Recipients per message; more get 452 4.5.3 (the client sends them in a new transaction).
    As many again in one transaction cost nothing (a pipelining client sent them before it heard
    the first 452); each one past that counts against max_junk_commands."""
    max_messages_per_connection: PositiveInt = 10_000
    max_errors: PositiveInt = 20
    """Error replies a connection may get: the max_errors-th gets its reply, then 421 4.7.0 and
    Pigeon closes the connection (the client's errors count: not Pigeon's own 4.3.x)."""
    max_junk_commands: NonNegativeInt = 100
    """Commands that move no mail a client may send between two messages accepted (or before
    the first): NOOP, RSET, VRFY, HELP, EHLO or HELO after the first one (TLS starts over), and
    RCPTs past twice max_recipients in one transaction. The next one gets 421 4.7.0 and the
    connection closes, so a client cannot hold a connection (and a transaction) open for ever
    with answers that are no errors. Postfix's smtpd_junk_command_limit is 100 too. 0: no limit."""
    max_line_length: PositiveInt = 998
    """Longest text line, without CRLF (RFC 5322 2.1.1); applies to commands and message lines."""
    max_connections: PositiveInt = 2000
    """Concurrent SMTP connections per worker (it bounds the worker's open files and memory, and a
    worker can only close its own). Past it a newcomer takes the place of the connection silent
    the longest between transactions (which gets 421 4.7.0); with none idle, the outsider (not in
    `relay_networks`, not authenticated) whose envelope has been open longest, if for 10 seconds
    or more (half `envelope_timeout` if less); with none such, the newcomer gets 421 4.7.0."""
    max_connections_per_client: PositiveInt = 50
    """Concurrent SMTP connections per node (all its workers) from one client address outside
    `relay_networks` (an IPv6 address counts as its /64, as for the AUTH lockouts); further
    ones get 421 4.7.0 (Postfix's smtpd_client_connection_count_limit
    is 50 too)."""
    max_hops: PositiveInt = 100
    """Received headers after which a message is refused as a loop (RFC 5321 6.3)."""
    bare_linefeeds: Literal["refuse", "normalise"] = "refuse"
    """A message with a bare LF or CR: refuse it (554 5.6.0) or rewrite the line endings as CRLF."""
    idle_timeout: PositiveDuration = PositiveDuration(300)
    """Close a connection that sends nothing for this long (421 4.4.2)."""
    command_timeout: PositiveDuration = PositiveDuration(300)
    """Close a connection (421 4.4.2) that takes longer than this to send one command line, from
    the reply to the previous one (RFC 5321 4.5.3.2.7), or to send a message's content (after
    354, or from the first BDAT to the end of the LAST chunk) beyond what `min_data_rate` allows."""
    envelope_timeout: PositiveDuration = PositiveDuration(120)
    """Close a connection (421 4.4.2) whose transaction's envelope (from MAIL to DATA or BDAT, or
    RSET) takes longer than this in all, the policy hooks' time left out: each command within
    `command_timeout` is not enough, or RCPTs dripped one at a time would hold the connection for
    days. A real client sends an envelope of 1,000 recipients in well under a second."""
    min_data_rate: DataRate = DataRate(500)
    """Slowest a message's content may arrive: it must be done within `command_timeout` plus its
    size at this rate, and never stall for `command_timeout`. A client at least this fast is never
    cut off, however large the message; a trickle slower than it is, about `command_timeout` after
    the content began. Postfix's smtpd_min_data_rate is 500 too. 0: all content within
    `command_timeout`."""
    pipelining: bool = True
    chunking: bool = True
    smtputf8: bool = True
    dsn: bool = True
    tls_certificate: Path | None = None
    """PEM certificate chain for STARTTLS. Without one, a self-signed pair is made at first start."""
    tls_private_key: Path | None = None
    starttls: bool = True
    """Offer STARTTLS."""
    auth_users: Path | None = None
    """File of `user:$scrypt$...` lines written by `pigeon passwd`. Without it AUTH is not offered."""
    allow_plaintext_auth: bool = False
    """Offer AUTH on connections without TLS (passwords would cross the network in clear)."""
    auth_failures_per_address: NonNegativeInt = 10
    """Failed AUTH attempts from one client address (an IPv6 client: its /64) within
    `auth_failure_window` that lock the address out for `auth_lockout`: its AUTH attempts then
    get 454 4.7.0 without a password check. 0: no per-address limit."""
    auth_failures_per_user: NonNegativeInt = 30
    """Failed AUTH attempts for one user name, from any address, within `auth_failure_window`
    that lock the name out for `auth_lockout` (addresses that authenticated as it in the last
    day are exempt). 0: no per-user limit."""
    auth_failure_window: PositiveDuration = PositiveDuration(600)
    """How far back failed AUTH attempts count."""
    auth_lockout: PositiveDuration = PositiveDuration(600)
    """How long a locked-out address or user name gets 454 4.7.0."""
    auth_threads: Annotated[int, msgspec.Meta(ge=1, le=64)] = 2
    """Threads that check passwords (scrypt), apart from those that write files."""
    auth_max_waiting: PositiveInt = 32
    """Password checks that may run or wait at once; AUTH beyond gets 454 4.7.0."""


class ApiToken(_Section):
    name: str
    """Who holds the token: written into the records of what it did. One of its own, not empty,
    and not "local" (`LOCAL_TOKEN_NAME`)."""
    token: Annotated[str, msgspec.Meta(min_length=16)]
    """The bearer secret (at least 16 characters of printable ASCII, no white space: it is sent as
    `Authorization: Bearer <token>`; `openssl rand -hex 32` makes a good one)."""
    scopes: list[Literal["inject", "admin", "read"]]
    """What it may do (at least one): "inject" mail, "admin" operations (bounce, suspend, ...), "read" state."""
    tenants: list[str] | None = None
    """The tenants whose mail it may inject, see and act on (`pigeon.listener.http.tenancy`):
    its injections may name no other (the request's `tenant`, or the content's tenant header:
    403). With exactly one, mail naming none is that tenant's, and so is an admin selector
    naming none. Its admin writes are confined to them (403 otherwise), another tenant's
    message or rule is answered as absent (404), its reads show its tenants' alone, and what
    has no tenant (a site suspension, the shaping effects) is 403. None (unset): any tenant,
    the token being the operator's. An empty list is refused at load (a token that could do
    nothing)."""
    routing_domains: list[str] | None = None
    """With `tenants`: the domains (globs) a rebind from this token may route its tenants' mail
    as (`routing_domain`). That domain's `[[route]]` (next hop, TLS, the smart host's AUTH user
    and password) and `[[shaping]]` then carry the mail, and the operator may have written them
    for another customer: so a token bound to tenants may give only these, or "" (its recipients'
    own domains again); others are 403. None: none. A token bound to no tenant routes mail as any
    domain, and is refused this key at load (it would restrict nothing)."""


LOCAL_TOKEN_NAME: Final = "local"
"""The holder's name of the local token (`[http] local_token`), which the `pigeon` commands on the
node's machine use: what they do is recorded under it, so no `[[http.token]]` may take it."""


class HttpConfig(_Section):
    listen: Endpoint = Endpoint("127.0.0.1:8025")
    """Address of the HTTP listener (/healthz, /metrics, /api/...)."""
    token: list[ApiToken] = msgspec.field(default_factory=list)
    """API bearer tokens, as [[http.token]] tables."""
    local_token: bool = True
    """Keep a token with every scope in <spool path>/api-token (mode 0600), made at first start,
    for the `pigeon` commands run on this machine by a user who can read the spool."""
    status_token_required: bool = False
    """/metrics and /healthz's detail only to a `read` token bound to no tenant: they name every
    tenant's queues (tenant and campaign names), recipient domains, counts, sources and
    mailboxes, so a listener customers reach for the API should not answer them to anyone.
    /metrics is then 401 without a token, 403 with one bound to tenants; /healthz answers every
    caller its status and code (a liveness probe needs no token) and its components to such a
    token alone. False: both open to anyone who reaches the listener, as before."""
    max_request_size: PositiveSize = PositiveSize(64 * 1024 * 1024)
    """Largest API request body: 413 beyond, with a JSON error naming this setting."""
    max_recipients: PositiveInt = 10_000
    """Recipients of one injection request; beyond, 400 naming this setting, nothing stored. A
    message holds at most `[smtp] max_recipients` of them, as over SMTP: this one bounds a
    request's work."""
    max_stored_size: PositiveSize = PositiveSize(1024 * 1024 * 1024)
    """Bytes of messages one injection request may have the spool store (each body as composed,
    once per message it is stored for): beyond, 413 naming this setting, nothing stored. Raw
    content sent as it is is stored once for all its recipients; each other recipient's message
    is its own, so a request's size alone does not bound what it stores."""
    max_metadata_size: Size = Size(4 * 1024)
    """Largest `metadata` object of one injected recipient, in bytes of its JSON (400 beyond):
    it is written into every log record of the message. 0: no metadata (a recipient with any
    gets 400)."""
    max_open_requests: PositiveInt = 64
    """API requests a node with several workers reads and forwards at once; beyond, 503 and the
    connection closed. With `max_request_size` it bounds the bodies held in memory. A request
    without a known token is refused (401) from its headers, before its body is read."""
    max_render_time: PositiveDuration = PositiveDuration(10)
    """Time one injection request may spend rendering its templates, over all its recipients
    (each render also stops at 1 s). Recipients left when it is spent get `451 4.3.0`, to be
    sent again in another request, so that no request holds a worker for longer."""
    max_connections: PositiveInt = 1000
    """Concurrent connections to the HTTP listener (of the process that serves it: the node, or
    its supervisor). Past it a newcomer takes the place of the connection idle longest between
    requests; with none idle, it gets 503 and is closed. Each is an open file of the process
    that, with one worker, also takes SMTP mail and writes the spool (`pigeon.node.descriptors`)."""
    header_timeout: PositiveDuration = PositiveDuration(10)
    """A request's line and headers must have arrived within this long: from the connection's
    start for its first request (a connection that sends nothing is closed), from its first
    byte for a later one. Past it, 408 and the connection closed (nginx's client_header_timeout)."""
    keepalive_timeout: PositiveDuration = PositiveDuration(60)
    """A connection that sends nothing for this long after an answer is closed."""
    body_timeout: PositiveDuration = PositiveDuration(30)
    """A request's body gets this long from the end of its headers plus its size at
    `min_body_rate`, and may never stall for this long; past it, 408 and the connection closed.
    A client that reads nothing of an answer for this long is cut off too."""
    min_body_rate: DataRate = DataRate(10_000)
    """Slowest a request's body may arrive beyond `body_timeout` (as `[smtp] min_data_rate` for
    a message's content). 0: all of the body within `body_timeout`."""


class SpoolConfig(_Section):
    path: Path = Path("var/spool")
    """Directory of the spool database and large bodies."""
    inline_limit: Size = Size(256 * 1024)
    """Bodies up to this size are kept in memory for their first delivery and stored in the
    database or a segment; larger ones in files of their own. 0: every body (but an empty one)
    in a file of its own."""
    inline_total: PositiveSize = PositiveSize(64 * 1024 * 1024)
    """Bodies being received (each up to `inline_limit`) are held in memory until their end, up
    to this many bytes in all per worker; past it, the body whose bytes pass it goes to a file
    of its own, as a larger one does, so clients that stall before the end cost disk, not memory."""
    segment_from: Size = Size(16 * 1024)
    """Bodies from this size up to `inline_limit` are appended to segment files (written once,
    one fsync per commit) rather than stored in the database (written twice, WAL then
    checkpoint). Above `inline_limit` to turn segments off; 0: every body up to `inline_limit`
    in a segment, none in the database."""
    segment_size: PositiveSize = PositiveSize(64 * 1024 * 1024)
    """A segment file takes bodies until it is this big; then a new one starts."""
    commit_window: Duration = Duration(0.002)
    """Under load (four or more writes arrived during the last commit), how long the next commit
    waits to gather more, so one fsync serves more messages. 0: never wait."""
    max_batch: PositiveInt = 1024
    max_size: PositiveSize | None = None
    """Cap on a shard's disk use (database, segments, files of large bodies); a message that
    would pass it gets 451 4.3.0."""
    reserve: Size = Size(32 * 1024 * 1024)
    """Without `max_size`: room each shard keeps allocated on its disk (a sixteenth of the disk
    if that is less, at least 256 KiB), given up to delivery when the disk fills, so that the
    spool goes on delivering (and so freeing room) while new mail gets 451. 0: none."""


class LogConfig(_Section):
    path: Path = Path("var/log")
    """Directory of the JSON-lines log segments."""
    max_segment_size: PositiveSize = PositiveSize(128 * 1024 * 1024)
    max_segment_age: PositiveDuration = PositiveDuration(3600)
    compress: bool = True
    """gzip segments once they are closed."""
    level: Literal["debug", "info", "warning", "error"] = "info"
    """Level of the diagnostic messages Pigeon writes to stderr (not the event log)."""


class DeliveryConfig(_Section):
    enabled: bool = True
    """Deliver mail. Off: the node only accepts (maintenance, or measuring acceptance): SMTP mail
    for `[[inbound]]` routes waits in the spool too (said at start); mailboxes are still watched."""
    helo_name: str = ""
    """Name in outbound EHLO, checked as [smtp] hostname is. Default: [smtp] hostname."""
    source: str = "default"
    """Name of the implicit egress source: the one mail leaves from when it has no pool (its
    address is the one the OS picks, its EHLO name `helo_name`). Ready queues are "source->site",
    so it is made as a `[[source]]`'s name is: letters, digits, ".", "_" and "-"."""
    pool: str | None = None
    """The `[[pool]]` mail leaves from when neither its `[[queue]]` nor the policy hook names
    one. None: such mail leaves from the implicit source."""
    smtp_port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 25
    retry_interval: PositiveDuration = PositiveDuration(300)
    """First retry after this long; each later one waits twice as long as the one before ..."""
    max_retry_interval: PositiveDuration = PositiveDuration(4 * 3600)
    """... up to this."""
    max_age: PositiveDuration = PositiveDuration(5 * 86400)
    """Give up (Expiration, and a DSN) when a message has not been delivered by this age."""
    dsn: bool = True
    """Send delivery status notifications for bounces and expirations (never to <>)."""
    delay_warning: Duration = Duration(0)
    """Tell the sender once, with a "delayed" DSN (RFC 3464 `Action: delayed`), that a message
    still being retried has waited this long since it arrived (Postfix's `delay_warning_time`,
    often "4h"), unless its recipients' NOTIFY leaves out DELAY. 0 (the default): never, even
    to a sender that asked for NOTIFY=DELAY. Not with `dsn = false`."""
    dsn_from: str = ""
    """The address in a DSN's From field, e.g. "MAILER-DAEMON@example.com" (Postfix's
    MAILER-DAEMON@$myorigin): a smart host that takes only verified From domains refuses a DSN
    from the host's name, and the notice is lost. Its envelope sender stays <>, its Message-ID
    and Reporting-MTA name [smtp] hostname. An ASCII mailbox (a domain may be a U-label: it is
    written as its A-label), checked at load. Default: MAILER-DAEMON@<[smtp] hostname>."""
    tls: Literal["opportunistic", "required", "disabled"] = "opportunistic"
    tls_verify: bool = False
    """Verify the server's certificate (system CAs; the MX host's name, or a next_hop's address).
    With "required", a certificate that does not verify means no delivery; with "opportunistic",
    TLS unverified, then the clear."""
    ca_file: Path | None = None
    """PEM file of the CAs to trust, instead of the system's, where the certificate is verified
    (`tls_verify`) and the `[[route]]` names no `ca_file` of its own."""
    pipelining: bool = True
    chunking: bool = True
    """Use BDAT when the server offers CHUNKING."""
    eight_bit_conversion: bool = True
    """8-bit mail to a server without 8BITMIME goes in a 7-bit form (its 8-bit MIME parts
    quoted-printable, as Postfix's `disable_mime_output_conversion = no`), signed again where
    Pigeon signed it (DKIM); false: it bounces, `554 5.6.3` (a report of Pigeon's own goes
    7-bit all the same). Mail with 8-bit header fields has no 7-bit form, and bounces either way."""
    try_next_mx: bool = False
    """A recipient a host answers 4xx (greylisting, a busy server) is tried at once at the
    site's next host in MX preference order, in the same attempt, as Postfix does; false (the
    default): it waits for its retry. Off by default: each such move costs a new connection
    (with its STARTTLS, where offered); measured on the realistic relay bench, 1.22x the CPU
    and 0.80x the rate, for no earlier settling (single-MX domains set the tail). The first
    connection is closed before the next opens, so `connection_limit` holds."""
    mx_address_limit: PositiveInt = 5
    """Addresses of the site's hosts tried, in preference order, to open one connection (as
    Postfix's smtp_mx_address_limit): an address named by several hosts is tried once, a host
    that adds none (its lookup failed, its addresses tried already) counts as one, and hosts
    past the limit are not looked up. Past it, the attempt is a temporary failure naming what
    was tried; the next starts again from the most preferred host."""
    mx_session_limit: PositiveInt = 2
    """Sessions (hosts that greeted with 220) one attempt may use, as Postfix's
    smtp_mx_session_limit: opening stops after this many greeted and would not do (EHLO
    refused, TLS failed, ...); with `try_next_mx`, the move to the next host is one (1: none)."""
    connection_limit: PositiveInt = 32
    """Connections per site from each egress source (ready queue): for the node, whatever its
    workers; for the cluster with a [redis] url (each node's share while Redis does not answer)."""
    max_deliveries_per_connection: PositiveInt = 1000
    idle_timeout: PositiveDuration = PositiveDuration(10)
    """Close a connection that has had nothing to send for this long."""
    max_message_rate: str | None = None
    """Messages per second to one site, e.g. "100/s", "3000/min", "10/s,burst=5" (GCRA; none:
    no limit). For the node, or the cluster with a [redis] url, like `connection_limit`."""
    connection_failures_before_delay: PositiveInt = 3
    """Failed connections in a row after which everything waiting for a site is deferred
    (a host that answered and would not do: a 421, a failed TLS handshake). One that no host
    took at all makes the site down at once (`site_retry_interval`)."""
    site_retry_interval: PositiveDuration = PositiveDuration(60)
    """A site none of whose hosts takes a connection (each refuses it or times out) is down:
    its mail waits, untried (`451 4.4.1 not tried: <site> is down`, no attempt counted), and
    one connection probes it this long after ..."""
    max_site_retry_interval: PositiveDuration = PositiveDuration(600)
    """... then twice as long after each probe that fails, up to this. A probe that connects
    brings the site up, and its mail goes at once. Each worker process keeps its own view."""
    connect_timeout: PositiveDuration = PositiveDuration(30)
    reply_timeout: PositiveDuration = PositiveDuration(300)
    data_done_timeout: PositiveDuration = PositiveDuration(600)
    """The reply to the end of a message's content (the final dot, or BDAT LAST), while the
    server takes the message: RFC 5321 4.5.3.2.6's 10 minutes (Postfix's
    smtp_data_done_timeout), never less than `reply_timeout`. Shorter, a server that takes
    long to answer it gets the message again at each retry."""
    max_active: PositiveInt = 10_000
    """Messages held in memory per worker (the rest wait in the spool)."""
    tenant_header: str = "X-Tenant"
    """Header naming the tenant part of the queue name; removed before delivery (so no field of the
    message itself, like Subject, and not `campaign_header`)."""
    campaign_header: str = "X-Campaign"
    """Header naming the campaign part of the queue name; removed before delivery."""
    bounce_rules: list[Path] = msgspec.field(default_factory=list)
    """TOML files of extra bounce classification rules, tried before the built-in table."""
    provider_defaults: bool = True
    """Use the providers Pigeon ships (Gmail, Outlook, Yahoo, ... with conservative limits:
    `pigeon/shaping/providers.toml`). Off: only the `[[provider]]` blocks of this file."""
    default_reactions: bool = True
    """Apply the reactions Pigeon ships (src/pigeon/shaping/reactions.toml) as well as the
    `[[reaction]]` tables: a table with a shipped rule's `id` replaces it (or, with
    `enabled = false`, turns it off). false: only your own."""


class DnsConfig(_Section):
    nameservers: list[NameserverPeer] = msgspec.field(default_factory=list)
    """Resolvers to ask (["127.0.0.1:53"], or one as a string), in turn: one that does not answer within its share of
    `timeout`, or fails the query (SERVFAIL, REFUSED), has the next asked. Empty: the system's
    (/etc/resolv.conf, with its timeout:, attempts: and rotate options)."""
    timeout: PositiveDuration = PositiveDuration(5)
    """A whole lookup, every nameserver asked (each of n has timeout / n at most)."""


class MtaStsConfig(_Section):
    enabled: bool = True
    """Apply recipient domains' MTA-STS policies (RFC 8461) to mail delivered by MX lookup, as
    KumoMTA does by default (see "MTA-STS" in the README). false: none is looked up."""
    ca_file: Path | None = None
    """PEM file of the CAs to trust, instead of the system's, for the policy host's HTTPS
    certificate and the MX hosts' certificates under a policy."""
    fetch_timeout: PositiveDuration = PositiveDuration(10)
    """A policy fetch, connection to the last byte."""
    https_port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 443
    """Port of the policy hosts (`https://mta-sts.<domain>/`). For tests: RFC 8461 says 443."""


class DaneConfig(_Section):
    enabled: bool = False
    """Apply DANE (RFC 7672) to mail delivered by MX lookup, as KumoMTA's `enable_dane` and
    Postfix's `smtp_tls_security_level = dane`: the DNS questions carry the DO bit and the AD bit
    of the answers is trusted, so `[dns] nameservers` must be a validating resolver on this host
    (unbound on 127.0.0.1): see "DANE" in the README."""


class TlsRptConfig(_Section):
    enabled: bool = False
    """Send SMTP TLS reports (RFC 8460) to the recipient domains that publish an `_smtp._tls`
    TXT record, about the sessions to their MX hosts under an MTA-STS policy or DANE: see "TLS
    reporting" in the README."""
    organization_name: str = ""
    """Who the reports are from (`organization-name`). Default: `[smtp] hostname`."""
    contact_info: str = ""
    """How to reach the operator about them (`contact-info`): an address, a URL. Default: `report_sender`."""
    report_sender: str = ""
    """The address reports sent by mail (a `mailto:` URI) are from: one of the operator's, which
    bounces come back to (and a `[[dkim]]` signer of its domain signs them). Empty: reports go
    only to `https:` URIs."""
    interval: PositiveDuration = PositiveDuration(86_400)
    """What a report covers, from one multiple of it (since the epoch, UTC) to the next: a day
    by default, 00:00 to 24:00 UTC (RFC 8460 4.1). At least 1s."""
    ca_file: Path | None = None
    """PEM file of the CAs to trust, instead of the system's, for the `https:` URIs' certificates."""
    timeout: PositiveDuration = PositiveDuration(30)
    """An `https:` report's POST, connection to the answer."""


class RouteConfig(_Section):
    domain: str
    """Recipient domain (a glob: "*.example.net", "*" for every domain)."""
    next_hop: Peer | None = None
    """Send here instead of the domain's MX hosts: "host:port" (no MX lookup)."""
    tls: Literal["opportunistic", "required", "disabled", "implicit"] | None = None
    """As `[delivery] tls`; "implicit" (with `next_hop` only): TLS from the first byte, no
    STARTTLS (RFC 8314, a submission port 465)."""
    tls_verify: bool | None = None
    ca_file: Path | None = None
    """PEM file of the CAs to trust, instead of the system's, when this route verifies the
    certificate (`tls_verify`): a smart host or partner under a private CA."""
    auth_username: str | None = None
    """Authenticate to the smart host (`next_hop`, and only it) as this user, with SMTP AUTH
    (RFC 4954), once per connection, before its first message. A failure defers the mail (never
    a bounce) and logs a WARNING."""
    auth_password: str | None = None
    auth_password_file: Path | None = None
    """Read the password from this file (its first line) at start and at each reload, rather
    than keep it in the config. Not with `auth_password`."""
    auth_mechanisms: list[str] | None = None
    """The SASL mechanisms to use, in order of preference: "PLAIN", "LOGIN". Default: both,
    PLAIN first (the first the server offers is used)."""
    allow_plaintext_auth: bool = False
    """Allow AUTH with `tls = "disabled"`: the password crosses the network in clear. (Under
    "opportunistic", AUTH goes only once TLS is up, whatever this says.)"""
    tenants: list[str] | None = None
    """The tenants whose mail this route is for (["globex"]): a smart host's account is one
    customer's. Mail of another tenant, or of none (Pigeon's own DSNs included), whose recipient
    domain or routing domain picks this route is refused where it arrives (550 5.7.1) and
    bounced, never sent through it, if it reaches the route later. None: any tenant's mail.
    Not on a route for every domain ("*")."""


class QueueConfig(_Section):
    name: str
    """Scheduled queue names this applies to (a glob: "newsletter:*", "*@example.net"). Mail with
    no tenant nor campaign is in the queue of its domain alone, "example.net", which
    "*@example.net" does not match."""
    retry_interval: PositiveDuration | None = None
    max_retry_interval: PositiveDuration | None = None
    max_age: PositiveDuration | None = None
    dsn: bool | None = None
    delay_warning: Duration | None = None
    """`[delivery] delay_warning` for this queue ("0": none here)."""
    pool: str | None = None
    """The `[[pool]]` this queue's mail leaves from (a policy hook's `egress_pool` wins).
    None: `[delivery] pool`."""
    max_message_rate: str | None = None
    """Messages a second each scheduled queue this block matches may send, whatever their
    destination: "10/s", "6000/h", "10/s,burst=5" (GCRA, as `[delivery] max_message_rate`; none:
    no limit). Each matching queue has a rate of its own (KumoMTA's queue `max_message_rate`),
    for the node, or the cluster with a [redis] url. Mail over it waits in its queue, untried;
    a retry counts as a message. A reload applies a changed rate."""


class SourceConfig(_Section):
    """An egress source: a local address outbound connections bind to, and the EHLO name they give."""

    name: str
    """What `[[pool]]`s, `[[shaping]]` blocks and logs call it; ready queues are "<name>-><site>"."""
    bind: str
    """A local IP address, v4 or v6 ("192.0.2.10", "2001:db8::10"). Connections from this source
    go only to MX addresses of the same family."""
    ehlo: str = ""
    """Name in EHLO (it should resolve to `bind`, and `bind` back to it), checked as [smtp] hostname
    is. Default: [delivery] helo_name."""


class PoolMember(_Section):
    source: str
    """A `[[source]]` name."""
    weight: int = 1
    """Its share of the pool's messages, relative to the other members' weights."""


class PoolConfig(_Section):
    """An egress pool: sources with weights. Each message takes the next source of a smooth
    weighted round-robin, so weights 3 and 1 give 3 of every 4 messages to the first."""

    name: str
    sources: list[PoolMember | str]
    """`[{source = "ip-2", weight = 3}, {source = "ip-3", weight = 1}]`; a bare name has weight 1."""


class ProviderConfig(_Section):
    name: str
    """What `[[shaping]] provider = "..."` calls it (lower-case letters, digits, ".", "-", "_").
    The name of a shipped provider ("gmail", "outlook", "yahoo", ...) replaces its suffixes."""
    mx_suffixes: list[str]
    """Suffixes of its MX hosts' names ("google.com", or "*.google.com": the same). A site is
    the provider's when every one of its MX hosts is under one of them."""


class ShapingConfig(_Section):
    domain: str | None = None
    """Recipient domains this applies to (a glob). Give this or `provider`, not both."""
    provider: str | None = None
    """A provider's name (a `[[provider]]`, or a shipped one): the limits apply to the
    provider's sites as a whole, counted together (`provider:<name>`), whichever recipient
    domain led there."""
    source: str | None = None
    """Only for connections from this `[[source]]`. A matching block with a source takes
    precedence over the blocks without one: what it sets overrides theirs, the rest is theirs."""
    connection_limit: PositiveInt | None = None
    max_deliveries_per_connection: PositiveInt | None = None
    idle_timeout: PositiveDuration | None = None
    max_message_rate: str | None = None


class ReactionConfig(_Section, kw_only=True):
    """A rule that reacts to what a site answers: when a delivery reply matches, an *effect*
    (suspend, limit or bounce) applies to the site (or the source's path to it, or the whole
    provider) for `duration`, on every worker, and on every node through [redis]."""

    id: Annotated[str, msgspec.Meta(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")]
    """The rule's name, in effects, records and logs. A shipped rule's id replaces that rule."""
    match: str | None = None
    """A regular expression (Python syntax, case-insensitive) searched for in the reply as one
    line: "<code> <enhanced code> <text>", e.g. "^421 4\\.7\\.0 .*rate limited". Needed unless
    `enabled = false`."""
    provider: str | list[str] | None = None
    """Only for sites of this provider, or of one of these (by their MX host suffixes: the
    shipped providers and `[[provider]]`s; see the README)."""
    site: str | None = None
    """Only for sites matching this glob (a site: the sorted MX hosts, or host:port)."""
    domain: str | None = None
    """Only for messages to recipient domains matching this glob."""
    action: Literal["suspend", "limit", "bounce"] | None = None
    """suspend: take no mail for it; limit: lower `connection_limit` and/or `max_message_rate`;
    bounce: every message waiting for it (and arriving while the effect lives) is bounced.
    Needed unless `enabled = false`."""
    scope: Literal["site", "source", "provider"] = "site"
    """What the effect applies to: the site; this source's path to the site (`source->site`,
    the sending address a provider judges); or every site of `provider`."""
    duration: PositiveDuration = PositiveDuration(600)
    """How long the effect lives. A match while it lives changes nothing (it is not extended)."""
    connection_limit: PositiveInt | None = None
    """action = "limit": connections at most this many while the effect lives."""
    max_message_rate: str | None = None
    """action = "limit": messages at most this fast ("10/s", "100/min") while the effect lives."""
    threshold: str | None = None
    """"N/DURATION" ("5/10m"): the effect begins only at the Nth matching reply for its key
    within DURATION, counted by the node's workers together (each node counts its own). None:
    at the first. One stray 421 then does not suspend a site."""
    enabled: bool = True
    """false: the rule is off (with the id of a shipped rule: that rule is off)."""


class RedisConfig(_Section):
    url: str | None = None
    """Redis shared by the nodes ("redis://host:6379/0"): inbound claims are arbitrated there,
    and shaping limits (connections, message rates) are held for the whole cluster.
    None: single-node mode, claims and limits are held in the node (one node per mailbox)."""
    key_prefix: str = "pigeon"
    """Prefix of every key Pigeon writes, so several clusters can share one Redis."""
    timeout: PositiveDuration = PositiveDuration(2)
    """Connect and command timeout. A Redis that does not answer pauses inbound claims."""
    late_operations: PositiveDuration = PositiveDuration(300)
    """How late a one-off admin operation another node was asked for (a bounce of what is
    queued, a retry, a rebind) may still reach this node (back from a stop or a Redis
    outage); older ones are skipped, and logged. Standing rules (suspensions, bounces with a
    duration) do not depend on it: a node loads those in force whenever it (re)joins."""


class _Target(_Section, tag_field="kind", kw_only=True):
    name: str
    """What `[[mailbox]]` and `[[inbound]]` call this target."""
    retry_interval: PositiveDuration = PositiveDuration(5)
    """First retry of a message the target refused for now (5xx, timeout, Redis down) ..."""
    max_retry_interval: PositiveDuration = PositiveDuration(300)
    """... doubling up to this (at least `retry_interval`)."""


class SidekiqTarget(_Target, tag="sidekiq", kw_only=True):
    """A Sidekiq job, pushed as Sidekiq's own client pushes it (LPUSH queue:<queue>, SADD queues)."""

    redis_url: str | None = None
    """The application's Redis. Default: [redis] url, else redis://127.0.0.1:6379/0."""
    queue: str = "default"
    job_class: str = "InboundEmailJob"
    """The worker class Sidekiq runs; args are [raw message, {dedupe_key, message_id, ...}]. A raw
    message that is not UTF-8 is base64, and args[1] has "raw_encoding": "base64"."""
    arguments: Literal["raw_and_meta", "raw"] = "raw_and_meta"
    """"raw_and_meta": args are [raw message, metadata] (above). "raw": args are [raw message]
    only, mail_room's job shape, for a worker written for it (`def perform(raw)`); a message that
    is not UTF-8 then goes as its bytes read as Latin-1 (each byte the character of that
    number: nothing lost, `raw.encode("ISO-8859-1")` gives the bytes back), as no metadata can
    say base64, and the node logs that it did so."""
    retry: bool | int = True
    """The job's own Sidekiq `retry` option."""
    timestamps: Literal["seconds", "milliseconds"] = "seconds"
    """created_at/enqueued_at as float seconds (Sidekiq 7, which 8 also reads) or integer
    milliseconds (Sidekiq 8's own format)."""


class WebhookTarget(_Target, tag="webhook", kw_only=True):
    """An HTTP POST per message; 2xx is accepted."""

    url: str
    """"http://" or "https://" with a host (anything else is refused at load)."""
    format: Literal["raw", "json"] = "raw"
    """"raw": the message as message/rfc822. "json": {dedupe_key, message_id, headers, raw, ...},
    where `raw` is base64 with "raw_encoding": "base64" beside it when the message is not UTF-8."""
    secret: str | None = None
    """HMAC-SHA256 key: X-Pigeon-Signature: t=<unix time>,v1=<hex HMAC of "<t>." + body>,v2=<hex
    HMAC of t, the dedupe key, the envelope headers and the body> (`pigeon.inbound.targets.webhook`)."""
    timeout: PositiveDuration = PositiveDuration(30)
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    """Extra request headers (an Authorization header, say)."""
    tls_verify: bool = True
    """For an "https://" `url`: verify the receiver's certificate and name (as a mailbox's
    `tls_verify`). False: any certificate is taken."""
    ca_file: Path | None = None
    """For an "https://" `url`: PEM file of the CAs to trust instead of the system's (a
    receiver under a private CA), as a mailbox's `ca_file`. Read once, at start."""
    retry_statuses: list[Annotated[int, msgspec.Meta(ge=400, le=499)]] = msgspec.field(
        default_factory=lambda: [401, 403, 404, 408, 409, 423, 425, 429]
    )
    """4xx answers that mean "later" rather than "never". Other 4xx (400, 410, 413, 422, ...)
    are permanent failures: the failed folder, or a bounce. 5xx, timeouts and connection
    errors are always retried. 401, 403 and 404 are here by default because they usually mean
    a wrong token or a deploy in progress, which an operator fixes, not a bad message."""


class PostgresqlTarget(_Target, tag="postgresql", kw_only=True):
    """A row per message, inserted with ON CONFLICT (dedupe_key) DO NOTHING."""

    dsn: str
    """"postgresql://user:password@host:5432/database"."""
    table: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")] = (
        "inbound_emails"
    )
    create_table: bool = True
    """Create the table (and its unique dedupe_key index) at start if it does not exist, and
    again whenever it turns out gone (dropped while the node runs)."""
    pool_size: PositiveInt = 4
    timeout: PositiveDuration = PositiveDuration(10)
    """How long connecting, and each statement (the insert, the table's check), may take; then
    the batch is refused for now and tried again (a lock held on the table, most often)."""


class MaildirTarget(_Target, tag="maildir", kw_only=True):
    """Files in a Maildir (tmp/ then new/), named after the dedupe key."""

    path: Path


class LogTarget(_Target, tag="log", kw_only=True):
    """One JSON line per message (headers, dedupe key and the raw message) in a file: the JSON
    webhook's body, so `raw` is base64 with "raw_encoding": "base64" when it is not UTF-8."""

    path: Path


TargetConfig = SidekiqTarget | WebhookTarget | PostgresqlTarget | MaildirTarget | LogTarget


class MailboxConfig(_Section, kw_only=True):
    name: str
    """Name in logs, metrics and /healthz."""
    host: str
    port: Annotated[int, msgspec.Meta(ge=1, le=65535)] | None = None
    """Default: 993 for tls = "implicit", 143 otherwise."""
    tls: Literal["implicit", "starttls", "none"] = "implicit"
    tls_verify: bool = True
    ca_file: Path | None = None
    """PEM file of the CAs to trust instead of the system's."""
    username: str
    password: str | None = None
    password_file: Path | None = None
    """Read the password from this file (its first line) at every login. Not with `password`."""
    auth: Literal["login", "xoauth2"] = "login"
    """"xoauth2": the password (or password_file, refreshed by whatever keeps it current) is an
    OAuth2 access token."""
    folder: str = "INBOX"
    search: str = "UNSEEN"
    """IMAP SEARCH criteria for the messages to hand over."""
    idle: bool = True
    """Wait with IDLE when the server offers it; poll otherwise."""
    poll_interval: Duration = Duration(60)
    """Poll this often when not idling, and re-IDLE at least this often: at most 29 minutes
    with `idle` (RFC 2177), refused at load above that."""
    after_delivery: Literal["seen", "move", "delete"] = "seen"
    """Once the target accepted a message: flag it \\Seen, move it to `move_to`, or delete and
    expunge it (UID EXPUNGE where the server offers UIDPLUS)."""
    move_to: str | None = None
    """The folder for after_delivery = "move", and only for it."""
    failed_folder: str | None = None
    """Where a message the target refused for good goes. None: it stays, flagged \\Seen and
    $PigeonFailed."""
    target: str
    """The `[[target]]` name."""
    lease: Duration = Duration(60)
    """How long a claim on a message lasts unless renewed (renewed every third of it). It
    bounds a node that is alive but stalled (or cut off from Redis); a node that dies is
    noticed sooner, when its heartbeat (sent every second, lasting 5 s) runs out, and its claims are
    taken over then."""
    batch: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 1000
    """Messages claimed, fetched and handed over at a time (up to 64 MiB of them: past that, the
    rest wait for the next batch); while other nodes share the Redis, no more than this node's
    share of what nobody holds, ceil(unclaimed / live nodes), so that they share a backlog. A
    target that takes a batch whole (Sidekiq, PostgreSQL, log, Maildir) gets it in one step,
    and a node killed in the middle may repeat that step. Each batch costs a few IMAP round
    trips whatever its size, so draining a backlog is faster in big ones (bench/inbound.py: a
    log target at 0.91x the mail_room gem's rate with 200, 1.06x with 1,000; three nodes
    sharing Redis 0.92x one node with 200, 1.08x with 1,000)."""
    concurrency: Annotated[int, msgspec.Meta(ge=1, le=256)] = 8
    """Messages handed to the target at once, for a target that takes them one by one (a
    webhook). A node killed mid-batch repeats at most twice this many such handoffs (those not
    yet marked done), each with the same dedupe key; a target that takes a batch whole repeats
    at most that batch (see `batch`)."""
    max_message_size: PositiveSize = PositiveSize(50 * 1024 * 1024)
    """Larger messages are treated as permanent failures (not fetched)."""
    timeout: Duration = Duration(60)
    """How long the server may stay silent (connecting, in the TLS handshake, or while a command
    waits for its answer) before the session is given up and opened again. Silence, not the
    command's length: any byte from the server starts it again, so a FETCH that takes minutes
    to come over a slow link is waited for while its bytes keep coming."""
    down_after: Duration = Duration(120)
    """/healthz reports the mailbox "down" (and answers 503) once it has been unable to connect,
    search or claim for this long; "degraded" before that."""


class InboundRouteConfig(_Section, kw_only=True):
    target: str
    """The `[[target]]` name."""
    recipient: str | None = None
    """Recipient address (a glob: "support@app.example", "reply+*@app.example")."""
    domain: str | None = None
    """Recipient domain (a glob: "app.example", "*.app.example")."""
    bounces: Literal["never", "authenticated", "always"] = "authenticated"
    """Who gets a DSN when the target refuses a message for good (4xx other than those it
    retries, e.g. 413, 422) or it expires: "authenticated" senders only (SMTP AUTH or an API
    token), "always", or "never". Anyone may send here: a DSN to any sender, with the whole
    message under RET=FULL, is backscatter."""
    failed: Literal["hold", "drop"] = "hold"
    """Such a message whose sender gets no DSN: "hold" keeps it in the spool for the operator
    (`pigeon queue summary` counts it, `pigeon retry --queue 'inbound:<target>'` sends it
    again), "drop" ends it with its Bounce or Expiration record."""
    held_for: Duration = Duration(30 * 86400)
    """How long held mail waits for the operator: then it ends with an `Expiration` record
    (still no DSN), so junk sent to a route the application refuses cannot fill the spool.
    0: held until the operator acts."""


LOG_HOOK_TYPES: Final = ("Delivery", "TransientFailure", "Bounce", "Expiration", "AdminBounce", "Held")
"""The record types a `[[log_hook]]` sends by default: the outcomes of outbound mail."""


class LogHookConfig(_Section, kw_only=True):
    """Event log records POSTed in batches to an HTTP endpoint, read back from the log files
    (`pigeon.logs.hook`): at least once, in order, from a durable cursor in the spool."""

    name: Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
    """Names its cursor (`<spool>/log-hooks/<name>.json`) and its metrics. Renamed, a hook starts afresh."""
    url: str
    """"http://" or "https://" with a host (anything else is refused at load)."""
    types: list[str] = msgspec.field(default_factory=lambda: list(LOG_HOOK_TYPES))
    """Record types to send (`type`); ["*"]: every record. Default: the outbound outcomes."""
    batch: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 100
    """Records per POST, at most."""
    linger: PositiveDuration = PositiveDuration(1)
    """How long a record may wait for others to fill its batch before the batch goes as it is."""
    timeout: PositiveDuration = PositiveDuration(30)
    """How long one POST may take; no answer by then is a failure (and the batch is sent again)."""
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    """Extra request headers (an Authorization header, say)."""
    secret: str | None = None
    """HMAC-SHA256 key: X-Pigeon-Signature: t=<unix time>,v1=<hex HMAC of "<t>." + body>, as a
    webhook target's."""
    tls_verify: bool = True
    """For an "https://" `url`: verify the receiver's certificate and name. False: any is taken."""
    ca_file: Path | None = None
    """For an "https://" `url`: PEM file of the CAs to trust instead of the system's."""
    retry_interval: PositiveDuration = PositiveDuration(1)
    """First wait after a failed POST (any answer but 2xx, or none) ..."""
    max_retry_interval: PositiveDuration = PositiveDuration(60)
    """... doubling up to this. A batch is never skipped: it is sent until a 2xx takes it."""


DKIM_HEADERS: Final = (
    "from",
    "sender",
    "reply-to",
    "subject",
    "date",
    "message-id",
    "to",
    "cc",
    "mime-version",
    "content-type",
    "content-transfer-encoding",
    "content-id",
    "content-description",
    "resent-date",
    "resent-from",
    "resent-sender",
    "resent-to",
    "resent-cc",
    "resent-message-id",
    "in-reply-to",
    "references",
    "list-id",
    "list-help",
    "list-unsubscribe",
    "list-unsubscribe-post",
    "list-subscribe",
    "list-post",
    "list-owner",
    "list-archive",
)
"""The header fields a [[dkim]] signature covers by default (dkimpy's list, and
List-Unsubscribe-Post, which RFC 8058 wants signed)."""

DKIM_OVER_SIGNED: Final = ("from", "to", "subject", "date", "message-id")
"""Fields named once more in h= than the message has them (`over_sign = true`), so that a
copy added on the way breaks the signature instead of showing in the reader's mail client."""


class DkimConfig(_Section):
    domain: str
    """The author domains this signs for: a glob on the domain of the From: address
    ("example.com", "*.example.com", "*")."""
    selector: str
    """The key's selector: it is published at <selector>._domainkey.<domain>. A DNS name,
    checked as `pigeon dkim keygen` checks it (`dkim.keys.name_problem`)."""
    private_key: Path
    """PEM file of the private key (`pigeon dkim keygen` writes one). Read at start and on
    SIGHUP, by the user Pigeon runs as."""
    algorithm: Literal["rsa-sha256", "ed25519-sha256"] = "rsa-sha256"
    signing_domain: str | None = None
    """The d= of the signature. Default: the author domain the glob matched. An
    internationalised name may be written as its U-label ("bücher.example"): d= is its A-label."""
    headers: list[str] = msgspec.field(default_factory=lambda: list(DKIM_HEADERS))
    """Header fields to sign, where the message has them. From is required."""
    over_sign: bool | list[str] = True
    """true: over-sign From, To, Subject, Date and Message-ID; or a list of fields; false: none."""
    canonicalization: Literal[
        "relaxed/relaxed", "relaxed/simple", "simple/relaxed", "simple/simple", "relaxed", "simple"
    ] = "relaxed/relaxed"
    """header/body; one word means that for the header and simple for the body (RFC 6376 3.5)."""
    tenant: str | None = None
    """Sign only the mail of this tenant (the X-Tenant header). None: every tenant's."""
    name: str | None = None
    """What a policy hook calls this signer to choose it."""


class PolicyConfig(_Section):
    module: str | None = None
    """The policy module: a name ("mypolicy"), which is the .py file of that name beside this
    file if there is one; a dotted name ("acme.policy"), looked for beside this file first, then
    on sys.path; or the path of a .py file (relative to this file), whose directory is put first
    on sys.path, as a script's is. Its functions named like the hooks are
    called at the points the README's "Policy hooks" describes. None: no policy."""
    timeout: PositiveDuration = PositiveDuration(2)
    """How long an async (or threaded) hook may take; more than 0. Past it the client gets
    451 4.3.0, a delivery is deferred, an outcome stays as it was, and a PolicyFailure record
    is logged."""
    sync: Literal["inline", "thread"] = "inline"
    """Where plain (non-async) hooks run: "inline" on the event loop (fast, about a microsecond
    a call, but a slow hook holds up the worker and cannot be cut short) or "thread" on a thread
    pool (tens of microseconds a call, bounded by `timeout`)."""
    threads: PositiveInt = 8
    """Threads per worker for plain hooks when sync = "thread"."""


class Config(_Section):
    node: NodeConfig = msgspec.field(default_factory=NodeConfig)
    smtp: SmtpConfig = msgspec.field(default_factory=SmtpConfig)
    http: HttpConfig = msgspec.field(default_factory=HttpConfig)
    spool: SpoolConfig = msgspec.field(default_factory=SpoolConfig)
    log: LogConfig = msgspec.field(default_factory=LogConfig)
    delivery: DeliveryConfig = msgspec.field(default_factory=DeliveryConfig)
    dns: DnsConfig = msgspec.field(default_factory=DnsConfig)
    mta_sts: MtaStsConfig = msgspec.field(default_factory=MtaStsConfig)
    dane: DaneConfig = msgspec.field(default_factory=DaneConfig)
    tls_rpt: TlsRptConfig = msgspec.field(default_factory=TlsRptConfig)
    route: list[RouteConfig] = msgspec.field(default_factory=list)
    queue: list[QueueConfig] = msgspec.field(default_factory=list)
    shaping: list[ShapingConfig] = msgspec.field(default_factory=list)
    provider: list[ProviderConfig] = msgspec.field(default_factory=list)
    source: list[SourceConfig] = msgspec.field(default_factory=list)
    pool: list[PoolConfig] = msgspec.field(default_factory=list)
    reaction: list[ReactionConfig] = msgspec.field(default_factory=list)
    redis: RedisConfig = msgspec.field(default_factory=RedisConfig)
    target: list[TargetConfig] = msgspec.field(default_factory=list)
    mailbox: list[MailboxConfig] = msgspec.field(default_factory=list)
    inbound: list[InboundRouteConfig] = msgspec.field(default_factory=list)
    dkim: list[DkimConfig] = msgspec.field(default_factory=list)
    policy: PolicyConfig = msgspec.field(default_factory=PolicyConfig)
    log_hook: list[LogHookConfig] = msgspec.field(default_factory=list)
