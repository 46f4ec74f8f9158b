"""SMTP TLS Reporting (RFC 8460), the sending part: each interval's counts, summed over the
node's workers, reported to the domains that ask for it.

Each worker counts its sessions in memory (`tls_report.Counts`). At the end of each interval
(a multiple of `[tls_rpt] interval` since the epoch: 00:00 UTC for the default day, RFC 8460
4.1), each writes what it counted to `<spool>/tls-rpt/counts-<start>-w<worker>.json` (one
even when it counted nothing: the file says it is done), and worker 0, once every worker's
file is there (or `_GRACE` later), sums them and, for each domain with traffic, looks up
`_smtp._tls.<domain>` TXT through Pigeon's own resolver and sends the report to its URIs:
`https:` by POST (gzipped, `application/tlsrpt+gzip`, the certificate verified, the host
resolved by Pigeon's resolver as an MTA-STS policy fetch is), `mailto:` as a message Pigeon
puts in its own queue (`submit`: multipart/report; report-type="tlsrpt", RFC 8460 5.3, DKIM
signed when a `[[dkim]]` signer has `report_sender`'s domain). Then the interval's files go.

One report per domain per interval per node: what was sent is written to
`<spool>/tls-rpt/sent.json` (report ids, the URIs done) before the interval's files are
removed, and a report id is made of the interval, the node and the domain, so that a domain
done is never sent again, and a report that went twice (a crash between its POST and the
record of it) carries the same id for the receiver to see. A URI that failed (an HTTPS server
down, the TXT lookup failed) is tried again at each interval's end, until a day after the
interval's; a `mailto:` is done once in the queue, which retries it as any mail.

What is lost: the counts of a worker that crashes (its memory), and of an interval's end a
worker missed by more than `_GRACE` (they are reported late, at the next interval's end, with
their own interval's dates, for the domains not yet sent). A stop writes the worker's counts
of the interval under way, which a start takes back. A cluster: each node reports for itself
(its own spool), under report ids that name it: RFC 8460 allows one organization several
reports.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import gzip
import json
import logging
import math
import os
import re
import ssl
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from email.utils import format_datetime
from pathlib import Path
from typing import Any, Final

import aiohttp

from pigeon.delivery import tls_report
from pigeon.delivery.mta_sts_store import OwnResolver, _write_durably
from pigeon.delivery.mx import DnsFailure, Resolver
from pigeon.delivery.tls_report import Counts
from pigeon.tls import client_context

_log = logging.getLogger(__name__)

_GRACE: Final = 30.0
"""Seconds worker 0 waits for its siblings' files at an interval's end (at most a quarter of
the interval): their loops wake at the same moment, and write a small file."""
_RETRY_FOR: Final = 86_400.0
"""Seconds after an interval's end a report that could not go (TXT lookup, HTTPS) is tried again."""
_KEEP_SENT: Final = 8 * 86_400.0
"""Seconds a sent report's record is kept (after its interval's end)."""
_FILE: Final = re.compile(r"counts-(\d+)-w(\d+)\.json")

Submit = Callable[[str, list[str], bytes], Awaitable[None]]
"""Puts a message (from, to, its bytes) in the node's queue."""


class TlsReporter:
    def __init__(
        self,
        counts: Counts,
        *,
        directory: Path,
        worker: int,
        workers: int,
        interval: float,
        resolver: Resolver,
        node: str,
        hostname: str,
        organization: str = "",
        contact: str = "",
        sender: str = "",
        ca_file: Path | None = None,
        timeout: float = 30.0,
        submit: Submit | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.counts = counts
        self._directory = directory
        self._worker = worker
        self._workers = workers
        self._interval = max(1, round(interval))
        self._resolver = resolver
        self._node = re.sub(r"[^A-Za-z0-9.-]", "-", node) or "node"
        self._submitter = sender.rpartition("@")[2].lower() if sender else hostname
        self._organization = organization or hostname
        self._contact = contact or sender
        self._sender = sender
        self._ca_file = ca_file
        self._timeout = timeout
        self._submit = submit
        self._clock = clock
        self._context: ssl.SSLContext | None = None
        self._current = self._start_of(clock())  # the interval the counts in memory are of
        self._task: asyncio.Task[None] | None = None

    def _start_of(self, when: float) -> int:
        return int(when // self._interval) * self._interval

    def _path(self, start: int, worker: int) -> Path:
        return self._directory / f"counts-{start}-w{worker}.json"

    # --- running -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Takes back what this worker counted of the interval under way before a stop, and
        runs until `stop`."""
        path = self._path(self._current, self._worker)
        try:
            data = json.loads(path.read_bytes())
            self.counts.add(data["entries"])
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as error:
            _log.warning("%s: TLS report counts not read (%s)", path, error)
        self._task = asyncio.create_task(self._run(), name="tls reports")

    async def stop(self) -> None:
        """Stops, and writes what this worker counted of the interval under way (a start takes it back)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self._save(self._current)

    async def _run(self) -> None:
        if self._worker == 0:
            await self._send_due()  # (intervals that ended while the node was down)
        while True:
            end = self._current + self._interval
            await asyncio.sleep(max(0.0, end - self._clock()))
            if self._clock() < end:
                continue
            start, self._current = self._current, self._start_of(self._clock())
            await self._save(start)
            if self._worker == 0:
                await self._wait_for_siblings(start)
                try:
                    await self._send_due()
                except Exception as error:  # (a report's trouble must not end the reporting)
                    _log.error("TLS reports: %r", error, exc_info=error)

    async def _save(self, start: int) -> None:
        """This worker's counts of the interval from `start`, written (and taken from memory)."""
        data = {"version": 1, "start": start, "end": start + self._interval, "entries": self.counts.take()}
        path = self._path(start, self._worker)
        try:
            await asyncio.to_thread(_write_durably, path, json.dumps(data))
        except OSError as error:
            _log.warning("%s: TLS report counts not written (%s): they are lost", path, error)

    async def _wait_for_siblings(self, start: int) -> None:
        deadline = time.monotonic() + min(_GRACE, self._interval / 4)
        while time.monotonic() < deadline:
            if all(self._path(start, n).exists() for n in range(self._workers)):
                return
            await asyncio.sleep(0.05)

    # --- sending -----------------------------------------------------------------------------
    async def _send_due(self) -> None:
        """Every interval that ended with counts in the spool, reported, oldest first."""
        now = self._clock()
        intervals: dict[int, list[Path]] = {}
        try:
            names = os.listdir(self._directory)
        except FileNotFoundError:
            return
        for name in names:
            match = _FILE.fullmatch(name)
            if match is not None:
                intervals.setdefault(int(match[1]), []).append(self._directory / name)
        sent = self._read_sent()
        for start in sorted(intervals):
            files: list[tuple[Path, dict[str, Any]]] = []
            for path in intervals[start]:
                try:
                    files.append((path, json.loads(path.read_bytes())))
                except (OSError, ValueError) as error:
                    _log.warning("%s: TLS report counts not read (%s)", path, error)
            ends = [int(data.get("end", start + self._interval)) for _, data in files]
            end = max(ends, default=start + self._interval)
            if end > now:
                continue  # (the interval under way: a stop's file)
            try:
                domains = tls_report.summed(data.get("entries", []) for _, data in files)
            except (KeyError, TypeError, ValueError) as error:
                _log.warning("TLS report counts of %s not read (%s): not reported", _stamp(start), error)
                domains = {}
            finished = True
            for domain, policies in sorted(domains.items()):
                before = json.dumps(sent.get(self.report_id(domain, start)))
                if not await self._report(domain, policies, start, end, sent):
                    finished = False
                if json.dumps(sent.get(self.report_id(domain, start))) != before:
                    await self._write_sent(sent)  # (at once: a crash after it sends it no more)
            if finished or now > end + _RETRY_FOR:
                if not finished:
                    _log.warning("TLS reports of %s: given up on those not sent within a day", _stamp(start))
                for path, _ in files:
                    path.unlink(missing_ok=True)

    def report_id(self, domain: str, start: int) -> str:
        """The report's id: its interval, this node, the domain (RFC 8460 4.4, 5.3 Report-ID)."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(start))
        return f"{stamp}.{self._node}.{domain}@{self._submitter}"

    async def _report(self, domain: str, policies: dict[Any, Any], start: int, end: int, sent: dict[str, Any]) -> bool:
        """The domain's report of [start, end), sent where its TXT record says and not yet sent
        there. Whether it is done (sent everywhere, or there is nowhere to send it)."""
        report_id = self.report_id(domain, start)
        record = sent.setdefault(report_id, {"end": end, "done": [], "finished": False})
        if record["finished"]:
            return True
        try:
            texts = await self._resolver.texts(f"_smtp._tls.{domain}")
        except DnsFailure as failure:
            if failure.permanent:
                record["finished"] = True  # (NXDOMAIN: no record, nobody to tell)
                return True
            _log.info("%s: TLS report %s waits: _smtp._tls TXT lookup failed (%s)", domain, report_id,
                      failure.reply.text)  # fmt: skip
            return False
        uris = tls_report.parse_record(texts or ())
        if not uris:
            record["finished"] = True
            return True
        body = tls_report.report(
            domain,
            policies,
            start=start,
            end=end,
            organization=self._organization,
            contact=self._contact,
            report_id=report_id,
        )
        data = gzip.compress(json.dumps(body, separators=(",", ":")).encode(), mtime=0)
        mailto = [uri for uri in uris if uri.lower().startswith("mailto:") and uri not in record["done"]]
        for uri in uris:
            if uri in record["done"] or not uri.lower().startswith("https:"):
                continue
            try:
                await self._post(uri, data)
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as error:
                _log.warning("%s: TLS report %s not accepted by %s: %s", domain, report_id, uri,
                             str(error) or type(error).__name__)  # fmt: skip
                continue
            record["done"].append(uri)
            _log.info("%s: TLS report %s sent to %s", domain, report_id, uri)
        if mailto:
            if not self._sender or self._submit is None:
                _log.warning("%s: TLS report %s not mailed to %s: [tls_rpt] report_sender is not set", domain,
                             report_id, ", ".join(mailto))  # fmt: skip
                record["done"] += mailto
            else:
                addresses = [urllib.parse.unquote(uri[7:].split("?", 1)[0]) for uri in mailto]
                message = self._message(domain, report_id, addresses, data, body, start, end)
                try:
                    await self._submit(self._sender, addresses, message)
                except Exception as error:
                    _log.warning("%s: TLS report %s not queued for %s: %r", domain, report_id, ", ".join(addresses),
                                 error)  # fmt: skip
                else:
                    record["done"] += mailto
                    _log.info("%s: TLS report %s queued for %s", domain, report_id, ", ".join(addresses))
        record["finished"] = all(uri in record["done"] for uri in uris)
        return bool(record["finished"])

    async def _post(self, uri: str, data: bytes) -> None:
        """POST `data` to `uri` (RFC 8460 5.4); raises unless the answer is 2xx."""
        if self._context is None:
            self._context = client_context(verify=True, cafile=self._ca_file)
        connector = aiohttp.TCPConnector(resolver=OwnResolver(self._resolver), ssl=self._context, force_close=True)
        timeout = aiohttp.ClientTimeout(total=self._timeout)
        headers = {"Content-Type": "application/tlsrpt+gzip"}
        async with (
            aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
            session.post(uri, data=data, headers=headers, allow_redirects=False) as response,
        ):
            if not 200 <= response.status < 300:
                raise ValueError(f"HTTP {response.status}")

    def _message(
        self,
        domain: str,
        report_id: str,
        to: list[str],
        data: bytes,
        body: dict[str, Any],
        start: int,
        end: int,
    ) -> bytes:
        """The report as a message (RFC 8460 5.3): multipart/report; report-type="tlsrpt", a
        text part, and the gzipped JSON as application/tlsrpt+gzip."""
        boundary = f"=_tlsrpt.{start}.{self._node}"  # ("=_" is in no base64, nor in the text)
        successes = sum(p["summary"]["total-successful-session-count"] for p in body["policies"])
        failures = sum(p["summary"]["total-failure-session-count"] for p in body["policies"])
        filename = f"{self._submitter}!{domain}!{start}!{end}!{self._node}.json.gz"
        encoded = base64.encodebytes(data).replace(b"\n", b"\r\n")
        head = [
            f"From: <{self._sender}>",
            f"To: {', '.join(f'<{a}>' for a in to)}",
            f"Date: {format_datetime(_utc(self._clock()))}",
            f"Subject: Report Domain: {domain}\r\n Submitter: {self._submitter}\r\n Report-ID: <{report_id}>",
            f"Message-ID: <{report_id}>",
            "MIME-Version: 1.0",
            f"TLS-Report-Domain: {domain}",
            f"TLS-Report-Submitter: {self._submitter}",
            f'Content-Type: multipart/report; report-type="tlsrpt";\r\n\tboundary="{boundary}"',
        ]
        # The seconds it covers as its JSON's date-range says them: its last is `end - 1` (RFC 8460
        # 4.4's example), so the reader sees one interval, not two that disagree by a second.
        text = (
            f"This is an aggregate TLS report (RFC 8460) from {self._organization} about the\r\n"
            f"sessions to the mail servers of {domain} from {_stamp(start)} to {_stamp(end - 1)}:\r\n"
            f"{successes} succeeded, {failures} failed. Report-ID: <{report_id}>\r\n"
        )
        parts = [
            "\r\n".join(head).encode() + b"\r\n\r\nThis is a TLS report in MIME format (RFC 8460).\r\n",
            f"--{boundary}\r\nContent-Type: text/plain; charset=us-ascii\r\n\r\n{text}".encode(),
            (
                f"--{boundary}\r\nContent-Type: application/tlsrpt+gzip\r\nContent-Transfer-Encoding: base64\r\n"
                f'Content-Disposition: attachment;\r\n\tfilename="{filename}"\r\n\r\n'
            ).encode()
            + encoded,
            f"--{boundary}--\r\n".encode(),
        ]
        return b"".join(parts)

    # --- what was sent -----------------------------------------------------------------------
    def _read_sent(self) -> dict[str, Any]:
        path = self._directory / "sent.json"
        try:
            data = json.loads(path.read_bytes())
            sent = data["sent"]
            if not isinstance(sent, dict):
                raise TypeError("not a table")
            return sent
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError) as error:
            _log.warning("%s: TLS reports sent not read (%s): a report may go twice", path, error)
            return {}

    async def _write_sent(self, sent: dict[str, Any]) -> None:
        now = self._clock()
        for report_id in [r for r, record in sent.items() if float(record.get("end", 0)) + _KEEP_SENT < now]:
            del sent[report_id]
        path = self._directory / "sent.json"
        try:
            text = json.dumps({"version": 1, "sent": sent}, indent=1, sort_keys=True)
            await asyncio.to_thread(_write_durably, path, text)
        except OSError as error:
            _log.warning("%s: TLS reports sent not written (%s): a report may go twice", path, error)


def _stamp(when: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


def _utc(when: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(math.floor(when), datetime.UTC)
