"""MTA-STS policies of recipient domains: discovered, fetched, cached, kept across restarts.

`PolicyStore.policy(domain)` is what the router asks, beside the MX lookup (RFC 8461 3.3, 5):

* the `_mta-sts.<domain>` TXT record through Pigeon's own resolver (`[dns] nameservers`),
  cached for its TTL by the resolver; a lookup that fails (a timeout, a SERVFAIL) is
  remembered here for `TXT_FAILURE_TTL`, so a DNS server that never answers TXT costs a
  domain's routing at most the resolver's timeout once in a while, not every time;
* with a record whose `id` is not the cached policy's (or no cached policy, or one whose
  `max_age` ran out), the policy from `https://mta-sts.<domain>/.well-known/mta-sts.txt`:
  the host resolved by the same resolver, its certificate verified against the system's CAs
  or `[mta_sts] ca_file`, no redirect followed, `text/plain`, at most 64 KiB, within
  `[mta_sts] fetch_timeout`; one fetch per domain at a time, however many messages wait;
* a policy fetched is kept until its `max_age` runs out, in memory and in
  `<spool path>/mta-sts-<worker>.json` (written to a new file, fsynced, renamed over the
  old): a restart keeps enforcing it (RFC 8461 5, downgrade resistance), every worker
  reading every worker's file. A TXT record gone, a lookup that fails, a fetch that fails:
  the cached policy stands while it has not expired (RFC 8461 5.1); without one, there is
  no policy, and mail goes as it would without MTA-STS (RFC 8461 5: a policy that cannot be
  had never holds mail up). A fetch that fails is tried again after `FETCH_FAILURE_TTL`;
* the node's policy, not the worker's: while running, a worker takes in what its siblings
  fetched before it answers (`_look_at_siblings`: their files stat'ed at most once every
  `SIBLINGS_EVERY`, one that changed read), the newest fetch of each domain winning, as at
  start. A worker that never fetched a domain's policy enforces the one a sibling holds when
  the TXT record is stripped (an attacker on the DNS path) or its lookup fails, and a new
  policy one worker fetched replaces the old one in the others, whether or not they can
  fetch it themselves.

A record or policy that is not valid is no policy, and a WARNING names the domain and why,
once in a while (`mta_sts.WARNINGS`). `policy()` never raises.

A policy in use is refreshed before it expires (RFC 8461 10.2): asked for once it is a day
old (half its `max_age`, when that is shorter), it is answered at once and fetched again in
the background, whatever the TXT record says (`_refresh_after`); a refresh that fails leaves
the cached policy standing until its `max_age` runs out, as any fetch that fails does.

BUGS: what a sibling fetched is seen up to `SIBLINGS_EVERY` later (and once its file is
written): a worker answering within that second after a sibling's first fetch of a domain,
with the TXT record stripped for it, still finds no policy. Two workers asked for a domain
none has fetched yet may each fetch it. Failures (a TXT lookup's, a fetch's) are each
worker's own: a sibling may try again what one found failing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from pigeon.delivery.mta_sts import (
    MAX_POLICY_SIZE,
    WARNINGS,
    Applied,
    NoRecord,
    PolicyError,
    media_type_is_text,
    parse_policy,
    parse_record,
)
from pigeon.delivery.mx import DnsFailure, Resolver
from pigeon.delivery.tls_report import NO_POLICY, Counts, classify_fetch, sts_policy
from pigeon.fsync import fsync_directory
from pigeon.tls import client_context

_log = logging.getLogger(__name__)

TXT_FAILURE_TTL: Final = 120.0
"""Seconds a failed `_mta-sts` TXT lookup (a timeout, a SERVFAIL) is taken as "no record"
before it is asked again (the cached policy, if any, standing meanwhile)."""
FETCH_FAILURE_TTL: Final = 300.0
"""Seconds a policy that could not be fetched (or was not valid) is not fetched again for the same id."""
_FILE_VERSION: Final = 1
SIBLINGS_EVERY: Final = 1.0
"""Seconds between two looks at the sibling workers' files (`PolicyStore._look_at_siblings`)."""
REFRESH_AFTER: Final = 86_400.0
"""Seconds after its fetch a policy in use is fetched again, in the background (a policy whose
`max_age` is under twice this: after half its `max_age`). See `_refresh_after`."""


def _refresh_after(max_age: int) -> float:
    """How old a cached policy is when mail that uses it has it fetched again, in the background.

    Measured from the fetch, not back from the expiry: a day (as RFC 8461 10.2's example, a
    daily background refresh), or half the `max_age` when that is shorter. A year's policy is
    then fetched at most once a day per domain (a small GET, never in a message's way), and a
    domain that mail reaches once a month still has its policy renewed at each message, long
    before it could run out; a window counted back from the expiry (its last day, say) would
    miss such a domain, whose next message would find the policy expired and fetch it while
    waiting, exposed to a policy server down at that moment. Half of a short `max_age` (an hour:
    30 minutes) leaves as much time again for a refresh that fails to be tried again
    (`FETCH_FAILURE_TTL`). Refreshed on use, not by a timer walking every cached policy: a
    domain no mail goes to needs no policy, and one mail reaches has it refreshed then."""
    return min(REFRESH_AFTER, max_age / 2)


@dataclass(frozen=True, slots=True)
class _Cached:
    applied: Applied
    text: str  # the policy as fetched, what the file keeps
    fetched: float  # wall clock
    expires: float  # wall clock: fetched + max_age


class OwnResolver(AbstractResolver):
    """aiohttp's resolver: Pigeon's, never the system's."""

    def __init__(self, resolver: Resolver) -> None:
        self._resolver = resolver

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        try:
            addresses = await self._resolver.addresses(host)
        except DnsFailure as failure:
            raise OSError(f"cannot resolve {host}: {failure.reply.text}") from None
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for address in addresses
        ]

    async def close(self) -> None:
        pass


class PolicyStore:
    def __init__(
        self,
        resolver: Resolver,
        *,
        ca_file: Path | None = None,
        https_port: int = 443,
        fetch_timeout: float = 10.0,
        directory: Path | None = None,
        worker: int = 0,
        workers: int = 1,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        count: Callable[[str], None] | None = None,
        cached_only: bool = False,
        tls_report: Counts | None = None,
    ) -> None:
        """`worker` of `workers`: whose file this store writes, and which files are its
        siblings' (`mta-sts-<n>.json`, n < workers), taken in while it runs.
        `cached_only`: `policy()` answers from the policies cached (those of every worker's
        file in `directory`), and nothing is looked up, fetched or written: what `pigeon
        shaping explain` shows beside a running node."""
        self._resolver = resolver
        self._cached_only = cached_only
        self.ca_file = ca_file
        self._port = https_port
        self._timeout = fetch_timeout
        self._directory = directory
        self._path = directory / f"mta-sts-{worker}.json" if directory is not None else None
        self._clock = clock
        self._monotonic = monotonic
        self._count = count or (lambda outcome: None)  # each fetch's outcome: fetched, failed, kept (metrics)
        self._tls_report = tls_report  # `[tls_rpt] enabled`: a fetch that failed is counted there (RFC 8460)
        self._cache: dict[str, _Cached] = {}
        self._txt_failed: dict[str, float] = {}  # domain -> until when (monotonic) no TXT is asked
        self._fetch_failed: dict[tuple[str, str], float] = {}  # (domain, id) -> until when (monotonic)
        self._fetching: dict[str, asyncio.Future[_Cached | None]] = {}
        self._writing = asyncio.Lock()
        self._context: ssl.SSLContext | None = None
        # The files of the node's other workers (not those of workers a former `[node]
        # workers` had: nothing writes them any more, and they were read at start).
        self._siblings: list[Path] = (
            [directory / f"mta-sts-{n}.json" for n in range(workers) if n != worker]
            if directory is not None and not cached_only
            else []
        )
        self._read: dict[Path, tuple[int, int, int]] = {}  # file -> (inode, mtime ns, size) as last read
        self._next_look = 0.0  # (monotonic) when the siblings' files are next stat'ed
        self._load()

    # --- the question ------------------------------------------------------------------------
    async def policy(self, domain: str) -> Applied | None:
        """The policy in force for `domain` (any mode), or None. Never raises."""
        domain = domain.lower().rstrip(".")
        if self._cached_only:
            kept = self._kept(domain)
            return kept.applied if kept is not None else None
        if self._siblings and self._next_look <= self._monotonic():
            self._look_at_siblings()
        cached = self._cache.get(domain)
        if cached is not None and cached.expires <= self._clock():
            del self._cache[domain]
            cached = None
        policy_id = await self._record(domain)
        if policy_id is None or (cached is not None and cached.applied.policy_id == policy_id):
            if cached is None:
                return None
            if cached.fetched + _refresh_after(cached.applied.policy.max_age) <= self._clock():
                self._refresh(domain, policy_id or cached.applied.policy_id)
            return cached.applied
        failed = self._fetch_failed.get((domain, policy_id))
        if failed is not None and failed > self._monotonic():
            return cached.applied if cached is not None else None
        fetched = await self._fetch_once(domain, policy_id)
        if fetched is None:
            return cached.applied if cached is not None else None
        return fetched.applied

    async def _record(self, domain: str) -> str | None:
        """The id of the domain's TXT record; None: no (valid) record, or the lookup failed."""
        until = self._txt_failed.get(domain)
        if until is not None:
            if until > self._monotonic():
                return None
            del self._txt_failed[domain]
        try:
            texts = await self._resolver.texts(f"_mta-sts.{domain}")
        except DnsFailure as failure:
            if not failure.permanent:  # (NXDOMAIN: no record, the common case, cached by the resolver)
                if len(self._txt_failed) > 10_000:
                    self._txt_failed.clear()
                self._txt_failed[domain] = self._monotonic() + TXT_FAILURE_TTL
                _log.debug("%s: MTA-STS TXT lookup failed (%s)", domain, failure.reply.text)
            return None
        try:
            return parse_record(texts or ())
        except NoRecord:
            return None
        except PolicyError as error:
            self._warn(domain, f"its _mta-sts TXT record is not valid: {error}")
            return None

    async def _fetch_once(self, domain: str, policy_id: str) -> _Cached | None:
        """One fetch per domain at a time: the others wait for its result (shielded: one
        waiter cancelled cancels no one else's)."""
        fetching = self._fetching.get(domain)
        if fetching is None:
            fetching = self._fetching[domain] = asyncio.ensure_future(self._fetch(domain, policy_id))
            fetching.add_done_callback(lambda done: self._fetched(domain, done))
        return await asyncio.shield(fetching)

    def _refresh(self, domain: str, policy_id: str) -> None:
        """A fetch of the domain's policy in the background (RFC 8461 10.2: refresh before it
        expires, "regardless of the state of the _mta-sts TXT record", so that a policy server
        down for a while, or a TXT record suppressed, when the policy runs out does not leave
        the domain without one), unless one is under way or failed lately. `policy_id`: the
        record's, or the cached policy's when the record is gone or its lookup failed. Its
        failure keeps the cached policy until it expires, as any fetch's does."""
        if domain in self._fetching:
            return
        failed = self._fetch_failed.get((domain, policy_id))
        if failed is not None and failed > self._monotonic():
            return
        _log.debug("%s: refreshing its MTA-STS policy (id %s) before it expires", domain, policy_id)
        fetching = self._fetching[domain] = asyncio.ensure_future(self._fetch(domain, policy_id))
        fetching.add_done_callback(lambda done: self._fetched(domain, done))

    def _fetched(self, domain: str, done: asyncio.Future[_Cached | None]) -> None:
        if self._fetching.get(domain) is done:
            del self._fetching[domain]
        if not done.cancelled():
            done.exception()  # (seen: every waiter may have gone)

    async def _fetch(self, domain: str, policy_id: str) -> _Cached | None:
        try:
            text = await self._download(domain)
            policy = parse_policy(text)
        except (PolicyError, aiohttp.ClientError, OSError, TimeoutError, ValueError, ssl.SSLError) as error:
            why = str(error) or type(error).__name__
            if isinstance(error, TimeoutError):
                why = f"no answer within {self._timeout:g}s ([mta_sts] fetch_timeout)"
            if len(self._fetch_failed) > 10_000:
                self._fetch_failed.clear()
            self._fetch_failed[(domain, policy_id)] = self._monotonic() + FETCH_FAILURE_TTL
            kept = self._kept(domain)
            self._count("kept" if kept is not None else "failed")
            if self._tls_report is not None:
                reported = sts_policy(kept.applied) if kept is not None else NO_POLICY
                self._tls_report.failure(domain, reported, classify_fetch(error), reason=why)
            self._warn(domain, f"its MTA-STS policy (id {policy_id}) could not be had: {why}")
            return None
        now = self._clock()
        cached = _Cached(Applied(domain, policy, policy_id), text, now, now + policy.max_age)
        self._cache[domain] = cached
        self._count("fetched")
        _log.info(
            "%s: MTA-STS policy id %s fetched: %s, max_age %ds", domain, policy_id, policy.describe(), policy.max_age
        )
        await self._save()
        return cached

    async def _download(self, domain: str) -> str:
        """The policy's text. Raises PolicyError (what came is no policy), aiohttp's errors,
        OSError or TimeoutError."""
        host = f"mta-sts.{domain}"
        port = "" if self._port == 443 else f":{self._port}"
        url = f"https://{host}{port}/.well-known/mta-sts.txt"
        if self._context is None:
            self._context = client_context(verify=True, cafile=self.ca_file)
        connector = aiohttp.TCPConnector(resolver=OwnResolver(self._resolver), ssl=self._context, force_close=True)
        timeout = aiohttp.ClientTimeout(total=self._timeout)
        async with (
            aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False) as session,
            session.get(url, allow_redirects=False, headers={"Accept-Encoding": "identity"}) as response,
        ):
            if response.status != 200:
                raise PolicyError(f"{url} answered HTTP {response.status} (redirects are not followed)")
            if not media_type_is_text(response.headers.get("Content-Type")):
                raise PolicyError(f"{url} is {response.headers.get('Content-Type')!r}, not text/plain")
            if (response.content_length or 0) > MAX_POLICY_SIZE:
                raise PolicyError(f"{url} is {response.content_length} bytes, over {MAX_POLICY_SIZE}")
            body = bytearray()
            async for chunk in response.content.iter_chunked(8192):
                body += chunk
                if len(body) > MAX_POLICY_SIZE:
                    raise PolicyError(f"{url} is over {MAX_POLICY_SIZE} bytes")
        return body.decode("utf-8")

    def _warn(self, domain: str, why: str) -> None:
        """A WARNING (once in a while) that `why`, saying what applies: the policy kept from
        before, when one is (RFC 8461 5.1), or none."""
        if not WARNINGS.due(f"{domain}\0policy\0{why}"):
            return
        kept = self._kept(domain)
        if kept is not None:
            policy = kept.applied.policy
            until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(kept.expires))
            what = f"keeping its cached policy (id {kept.applied.policy_id}, mode {policy.mode.value}, until {until})"
            _log.warning("%s: %s; %s", domain, why, what)
        else:
            _log.warning("%s: no MTA-STS policy applied: %s", domain, why)

    def expires(self, domain: str) -> float | None:
        """When (wall clock) the domain's cached policy runs out; None: it has none."""
        kept = self._kept(domain.lower().rstrip("."))
        return kept.expires if kept is not None else None

    def _kept(self, domain: str) -> _Cached | None:
        """The domain's cached policy, if it has one that has not expired."""
        kept = self._cache.get(domain)
        return kept if kept is not None and kept.expires > self._clock() else None

    # --- the file ------------------------------------------------------------------------------
    def _load(self) -> None:
        """The unexpired policies of every worker's file (the freshest of each domain): a policy
        fetched before a restart, by whichever worker, is enforced from the first message."""
        if self._directory is None:
            return
        try:
            paths = sorted(self._directory.glob("mta-sts-*.json"))
        except OSError as error:  # (a spool this user may not read: `pigeon shaping explain`)
            _log.warning("%s: MTA-STS policy caches not read (%s)", self._directory, error)
            return
        for path in paths:
            self._take_in(path)

    def _look_at_siblings(self) -> None:
        """The sibling workers' files that changed since this worker last read them, taken in.

        Why: a policy is the node's, not the worker's. A worker that never fetched a domain's
        policy, or fetched the one since replaced, must not answer with less than what a
        sibling holds: the record stripped by an attacker on the DNS path (or a lookup that
        fails) would otherwise send its share of the mail to hosts the policy forbids, and a
        policy server down would leave workers enforcing different ids for one domain.
        Why files, not messages between workers: each worker writes its file at every fetch
        already (for restarts), renamed into place, so a file is only ever seen whole, and
        a worker restarted takes part as it is. Cheap: at most once every `SIBLINGS_EVERY`
        (a message between two looks costs a clock read), a stat of each sibling's file; only
        one whose inode, mtime or size changed (a rename is a new inode: no change is missed
        within one mtime tick) is read, synchronously, so that the answer that follows has it:
        a page-cache read of what the sibling just wrote, as big as the sibling's `_save`
        wrote it, and no more often than it fetches."""
        self._next_look = self._monotonic() + SIBLINGS_EVERY
        for path in self._siblings:
            try:
                status = os.stat(path)
            except OSError:  # (a sibling that has fetched nothing yet has no file)
                continue
            if self._read.get(path) != (status.st_ino, status.st_mtime_ns, status.st_size):
                self._take_in(path)

    def _take_in(self, path: Path) -> None:
        """The unexpired policies of `path` that are newer (fetched later) than this worker's
        of the same domain, taken in; the file's identity remembered, so that only a new
        version of it is read again (one that cannot be read is warned of once a version)."""
        now = self._clock()
        try:
            with open(path, "rb") as file:
                status = os.fstat(file.fileno())  # (of what is read: the file may be replaced meanwhile)
                self._read[path] = (status.st_ino, status.st_mtime_ns, status.st_size)
                data = json.loads(file.read().decode("utf-8"))
            entries = data["policies"] if data.get("version") == _FILE_VERSION else {}
            items = list(entries.items())
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            _log.warning("%s: MTA-STS policy cache not read (%s): policies are fetched afresh", path, error)
            return
        for domain, entry in items:
            try:
                known = self._cache.get(str(domain))
                # (the fetch time first: parsing each policy of a file read again is not needed)
                if known is not None and known.fetched >= float(entry["fetched"]):
                    continue
                cached = self._entry(str(domain), entry)
            except (PolicyError, KeyError, TypeError, ValueError):
                continue
            if cached.expires > now:
                self._cache[cached.applied.domain] = cached

    @staticmethod
    def _entry(domain: str, entry: Any) -> _Cached:
        text = str(entry["policy"])
        policy = parse_policy(text)
        fetched = float(entry["fetched"])
        return _Cached(Applied(domain, policy, str(entry["id"])), text, fetched, fetched + policy.max_age)

    async def _save(self) -> None:
        """This worker's file, written anew (in a thread: fsyncs) with what it holds unexpired."""
        path = self._path
        if path is None:
            return
        async with self._writing:
            now = self._clock()
            data = {
                "version": _FILE_VERSION,
                "policies": {
                    domain: {"id": c.applied.policy_id, "fetched": c.fetched, "policy": c.text}
                    for domain, c in self._cache.items()
                    if c.expires > now
                },
            }
            try:
                await asyncio.to_thread(_write_durably, path, json.dumps(data, indent=1, sort_keys=True))
            except OSError as error:
                _log.warning(
                    "%s: MTA-STS policy cache not written (%s): a restart fetches policies afresh", path, error
                )


def _write_durably(path: Path, text: str) -> None:
    """`path` replaced by `text` as a whole or not at all, durably: a new file, fsynced, renamed
    over the old one, the directory fsynced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".new")
    with open(temporary, "w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    fsync_directory(path.parent)
