"""SMTP TLS Reporting (RFC 8460), the pure part: what is counted, and the report it makes.

With `[tls_rpt] enabled`, each outbound session to an MX host under a policy is counted for
its *policy domain* (the recipient domain whose MX records the hosts are, as Postfix reports:
the domain that publishes `_smtp._tls.<domain>`): a recipient domain with an MTA-STS policy
applied (enforce or testing), or one whose MX host had DANE TLSA records (RFC 8461 2: DANE,
when the host has usable records, is the policy applied, not MTA-STS). A session is a success
when its TLS met the policy (verified for the MX host's name and the host allowed by the
MTA-STS policy; the certificate matched a TLSA record), a failure otherwise, by result type
(RFC 8460 4.3), from what the session knows (`classify`):

* STARTTLS not offered, or refused: `starttls-not-supported`;
* a handshake that failed verification: `certificate-expired`, `certificate-host-mismatch`,
  `certificate-not-trusted` (an unknown CA, a self-signed certificate; under DANE, no TLSA
  record matches the certificate: the records are the trust anchors), or
  `validation-failure` for the rest (a handshake that broke, a testing policy's MX host
  that its patterns do not allow);
* DANE: TLSA records none of which is usable for SMTP, `tlsa-invalid` (the session went on
  with TLS unauthenticated, RFC 7672 2.2, and is reported so); a TLSA lookup that failed
  (perhaps a bogus answer), `dnssec-invalid`;
* MTA-STS: a policy that could not be fetched, `sts-policy-fetch-error`; one that was not
  valid, `sts-policy-invalid`; its HTTPS server's certificate not valid, `sts-webpki-invalid`
  (counted at each fetch that failed, against the policy kept from before, or
  `no-policy-found`).

Counting is an increment in this process's memory (`Counts`), only for policy domains;
`pigeon.delivery.tls_reporter` writes them to the spool at the end of each interval and one
worker of the node sums and sends them. No I/O here.
"""

from __future__ import annotations

import datetime
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from pigeon.delivery.mta_sts import Applied, PolicyError

STARTTLS_NOT_SUPPORTED: Final = "starttls-not-supported"
CERTIFICATE_HOST_MISMATCH: Final = "certificate-host-mismatch"
CERTIFICATE_EXPIRED: Final = "certificate-expired"
CERTIFICATE_NOT_TRUSTED: Final = "certificate-not-trusted"
VALIDATION_FAILURE: Final = "validation-failure"
TLSA_INVALID: Final = "tlsa-invalid"
DNSSEC_INVALID: Final = "dnssec-invalid"
STS_POLICY_FETCH_ERROR: Final = "sts-policy-fetch-error"
STS_POLICY_INVALID: Final = "sts-policy-invalid"
STS_WEBPKI_INVALID: Final = "sts-webpki-invalid"

MAX_DETAILS: Final = 200
"""Failure details (result type, addresses, host, reason) kept per domain and policy in an
interval: a host that fails in ever new ways must not grow a worker's memory without end.
Past it, failures are still counted (the summary), under the last detail kept."""
_MAX_REASON: Final = 200  # characters of a failure's reason kept (`failure-reason-code`)


@dataclass(frozen=True, slots=True)
class ReportPolicy:
    """A policy as a report names it (RFC 8460 4.4): `kind` "sts", "tlsa" or
    "no-policy-found", its `strings` (the MTA-STS policy's lines, or the TLSA records in
    presentation form) and, for "sts", its `mx` patterns."""

    kind: str
    strings: tuple[str, ...] = ()
    mx: tuple[str, ...] = ()


NO_POLICY: Final = ReportPolicy("no-policy-found")


def sts_policy(applied: Applied) -> ReportPolicy:
    """How a report names an MTA-STS policy: its lines, as served (RFC 8460 4.4 policy-string)."""
    policy = applied.policy
    lines = ["version: STSv1", f"mode: {policy.mode.value}", *(f"mx: {mx}" for mx in policy.mx)]
    lines.append(f"max_age: {policy.max_age}")
    return ReportPolicy("sts", tuple(lines), policy.mx)


def tlsa_policy(records: Iterable[tuple[int, int, int, bytes]]) -> ReportPolicy:
    """How a report names TLSA records: "3 1 1 <hex>", as in a zone file."""
    return ReportPolicy("tlsa", tuple(f"{u} {s} {m} {data.hex().upper()}" for u, s, m, data in records))


@dataclass(frozen=True, slots=True)
class Failure:
    """One kind of failed session (RFC 8460 4.4 failure-details), what it is counted under."""

    result_type: str
    sending_ip: str
    mx_host: str
    receiving_ip: str
    reason: str


class _Tally:
    __slots__ = ("failures", "successes")

    def __init__(self) -> None:
        self.successes = 0
        self.failures: dict[Failure, int] = {}

    def fail(self, failure: Failure, count: int = 1) -> None:
        failures = self.failures
        if failure not in failures and len(failures) >= MAX_DETAILS:
            failure = next(reversed(failures))  # (counted all the same: see MAX_DETAILS)
        failures[failure] = failures.get(failure, 0) + count


class Counts:
    """This worker's counts since they were last taken: per policy domain and policy, the
    sessions that succeeded and those that failed, by failure. An increment each."""

    def __init__(self) -> None:
        self._tallies: dict[tuple[str, ReportPolicy], _Tally] = {}

    def __bool__(self) -> bool:
        return bool(self._tallies)

    def _tally(self, domain: str, policy: ReportPolicy) -> _Tally:
        key = (domain, policy)
        tally = self._tallies.get(key)
        if tally is None:
            tally = self._tallies[key] = _Tally()
        return tally

    def success(self, domain: str, policy: ReportPolicy) -> None:
        """A session whose TLS met `policy`."""
        self._tally(domain, policy).successes += 1

    def failure(
        self,
        domain: str,
        policy: ReportPolicy,
        result_type: str,
        *,
        sending_ip: str = "",
        mx_host: str = "",
        receiving_ip: str = "",
        reason: str = "",
    ) -> None:
        """A session (or a policy fetch) that failed `policy` so."""
        failure = Failure(result_type, sending_ip, mx_host.lower().rstrip("."), receiving_ip, reason[:_MAX_REASON])
        self._tally(domain, policy).fail(failure)

    def take(self) -> list[dict[str, Any]]:
        """The counts, as `to_json` writes them, and from zero again."""
        tallies, self._tallies = self._tallies, {}
        return to_json(tallies)

    def add(self, entries: Iterable[dict[str, Any]]) -> None:
        """Counts read back (`to_json`'s), added to these (a worker started again within an interval)."""
        for domain, policy, tally in from_json(entries):
            mine = self._tally(domain, policy)
            mine.successes += tally.successes
            for failure, count in tally.failures.items():
                mine.fail(failure, count)


def to_json(tallies: dict[tuple[str, ReportPolicy], _Tally]) -> list[dict[str, Any]]:
    """Counts as a worker's file keeps them."""
    return [
        {
            "domain": domain,
            "policy": {"kind": policy.kind, "strings": list(policy.strings), "mx": list(policy.mx)},
            "successes": tally.successes,
            "failures": [
                [f.result_type, f.sending_ip, f.mx_host, f.receiving_ip, f.reason, count]
                for f, count in tally.failures.items()
            ],
        }
        for (domain, policy), tally in tallies.items()
    ]


def from_json(entries: Iterable[dict[str, Any]]) -> list[tuple[str, ReportPolicy, _Tally]]:
    """`to_json`'s entries read back. Raises KeyError, TypeError or ValueError for what is not."""
    found: list[tuple[str, ReportPolicy, _Tally]] = []
    for entry in entries:
        raw = entry["policy"]
        policy = ReportPolicy(str(raw["kind"]), tuple(map(str, raw["strings"])), tuple(map(str, raw["mx"])))
        tally = _Tally()
        tally.successes = int(entry["successes"])
        for result_type, sending_ip, mx_host, receiving_ip, reason, count in entry["failures"]:
            tally.fail(
                Failure(str(result_type), str(sending_ip), str(mx_host), str(receiving_ip), str(reason)), int(count)
            )
        found.append((str(entry["domain"]), policy, tally))
    return found


def summed(files: Iterable[list[dict[str, Any]]]) -> dict[str, dict[ReportPolicy, _Tally]]:
    """The workers' counts of an interval, summed: per domain, per policy."""
    domains: dict[str, dict[ReportPolicy, _Tally]] = {}
    for entries in files:
        for domain, policy, tally in from_json(entries):
            mine = domains.setdefault(domain, {}).setdefault(policy, _Tally())
            mine.successes += tally.successes
            for failure, count in tally.failures.items():
                mine.fail(failure, count)
    return domains


def _stamp(when: float) -> str:
    return datetime.datetime.fromtimestamp(when, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def report(
    domain: str,
    policies: dict[ReportPolicy, _Tally],
    *,
    start: float,
    end: float,
    organization: str,
    contact: str,
    report_id: str,
) -> dict[str, Any]:
    """The report of `domain` for the interval [start, end) (RFC 8460 4.4: its end-datetime is
    the last second in it, as the RFC's example has it)."""
    return {
        "organization-name": organization,
        "date-range": {"start-datetime": _stamp(start), "end-datetime": _stamp(end - 1)},
        "contact-info": contact,
        "report-id": report_id,
        "policies": [
            {
                "policy": {
                    "policy-type": policy.kind,
                    "policy-string": list(policy.strings),
                    "policy-domain": domain,
                    **({"mx-host": list(policy.mx)} if policy.kind == "sts" else {}),
                },
                "summary": {
                    "total-successful-session-count": tally.successes,
                    "total-failure-session-count": sum(tally.failures.values()),
                },
                "failure-details": [
                    {
                        "result-type": f.result_type,
                        **({"sending-mta-ip": f.sending_ip} if f.sending_ip else {}),
                        **({"receiving-mx-hostname": f.mx_host} if f.mx_host else {}),
                        **({"receiving-ip": f.receiving_ip} if f.receiving_ip else {}),
                        "failed-session-count": count,
                        **({"failure-reason-code": f.reason} if f.reason else {}),
                    }
                    for f, count in tally.failures.items()
                ],
            }
            for policy, tally in policies.items()
        ],
    }


def parse_record(texts: Iterable[str]) -> list[str]:
    """The reporting URIs (`rua`) of a domain's `_smtp._tls` TXT records (RFC 8460 3): of the
    records that begin with "v=TLSRPTv1", there must be exactly one, with an `rua` field of
    one or more URIs, comma separated (a comma or semicolon in one is %-encoded). Only
    `mailto:` and `https:` URIs are kept. Empty: no (valid) record."""
    ours = [text for text in texts if text.startswith("v=TLSRPTv1") and text[10:11] in ("", ";", " ", "\t")]
    if len(ours) != 1:
        return []
    fields = [field.strip(" \t") for field in ours[0].split(";")]
    if fields[0] != "v=TLSRPTv1":
        return []
    for field in fields[1:]:
        name, equals, value = field.partition("=")
        if equals and name.strip(" \t") == "rua":
            uris = [uri.strip(" \t") for uri in value.split(",")]
            return [uri for uri in uris if uri.lower().startswith(("mailto:", "https:"))]
    return []


def classify(reason: str, detail: str, *, dane: bool) -> str:
    """The result type (RFC 8460 4.3) of a session turned away at TLS: `reason` the session's
    (`Reason.value`: "tls-not-offered", "tls-refused", "tls-failed", "tls-injected"), `detail` what the handshake
    or the TLSA match said."""
    if reason in ("tls-not-offered", "tls-refused"):
        return STARTTLS_NOT_SUPPORTED
    if reason == "tls-injected":
        # Plaintext after the 220 to STARTTLS (an injection): the host offered and accepted
        # STARTTLS, so not `starttls-not-supported` ("did not support STARTTLS"), and no
        # certificate was presented to be found wrong: RFC 8460's "general failure for a reason not
        # matching a category above".
        return VALIDATION_FAILURE
    text = detail.lower()
    if "expired" in text or "not yet valid" in text:
        return CERTIFICATE_EXPIRED
    if "hostname mismatch" in text or "ip address mismatch" in text or "does not match" in text:
        return CERTIFICATE_HOST_MISMATCH
    if dane and "no tlsa record" in text:
        return CERTIFICATE_NOT_TRUSTED  # (the TLSA records are DANE's trust anchors)
    if "self-signed" in text or "self signed" in text or "unable to get" in text or "unknown ca" in text:
        return CERTIFICATE_NOT_TRUSTED
    if "certificate verify failed" in text or "does not chain" in text:
        return CERTIFICATE_NOT_TRUSTED
    return VALIDATION_FAILURE


def classify_fetch(error: BaseException) -> str:
    """The result type of an MTA-STS policy fetch that failed (RFC 8460 4.3.2.2)."""
    # (aiohttp's ClientConnectorCertificateError holds the ssl module's as `certificate_error`)
    underneath = getattr(error, "certificate_error", None) or error.__cause__
    if isinstance(error, ssl.SSLCertVerificationError) or isinstance(underneath, ssl.SSLCertVerificationError):
        return STS_WEBPKI_INVALID
    if isinstance(error, PolicyError) and not str(error).startswith("https://"):
        return STS_POLICY_INVALID
    return STS_POLICY_FETCH_ERROR


def note_opened(
    counts: Counts,
    domain: str | None,
    sts: Applied | None,
    dane: Any,
    host: str,
    address: str,
    local: str,
    *,
    on_tls: bool,
) -> None:
    """A session opened to the MX `host` at `address` under `sts` (an MTA-STS policy) or `dane`
    (a `dane.HostPolicy`): a success, unless it is one that the policy would refuse (what a
    `testing` policy lets go: no STARTTLS, a host its patterns do not allow) or DANE whose TLSA
    records are none of them usable (`tlsa-invalid`). Under DANE the certificate matched (or
    the session would have failed)."""
    if dane is not None:
        if domain is None:
            return
        if dane.records:
            counts.success(domain, tlsa_policy(_tlsa(dane.records)))
        else:
            reason = f"no TLSA record of {dane.name} is usable for SMTP (RFC 7672 3.1.3)"
            counts.failure(domain, tlsa_policy(_tlsa(dane.published)), TLSA_INVALID, sending_ip=local,
                           mx_host=host, receiving_ip=address, reason=reason)  # fmt: skip
        return
    if sts is None:
        return
    policy = sts_policy(sts)
    if not on_tls:
        counts.failure(sts.domain, policy, STARTTLS_NOT_SUPPORTED, sending_ip=local, mx_host=host,
                       receiving_ip=address, reason="STARTTLS not offered")  # fmt: skip
    elif not sts.policy.allows(host):
        counts.failure(sts.domain, policy, VALIDATION_FAILURE, sending_ip=local, mx_host=host,
                       receiving_ip=address, reason=f"MX host {host} matches no mx of the policy")  # fmt: skip
    else:
        counts.success(sts.domain, policy)


def note_refused(
    counts: Counts,
    domain: str | None,
    sts: Applied | None,
    dane: Any,
    host: str,
    address: str,
    local: str,
    failure: tuple[str, str],
) -> None:
    """A session to the MX `host` at `address` that failed the TLS of `dane` or `sts`:
    `failure` its result type and what it said."""
    if dane is not None:
        if domain is not None:
            policy = tlsa_policy(_tlsa(dane.records or dane.published))
            counts.failure(domain, policy, failure[0], sending_ip=local, mx_host=host, receiving_ip=address,
                           reason=failure[1])  # fmt: skip
        return
    if sts is not None:
        counts.failure(sts.domain, sts_policy(sts), failure[0], sending_ip=local, mx_host=host,
                       receiving_ip=address, reason=failure[1])  # fmt: skip


def note_lookup_failed(counts: Counts, domain: str | None, host: str, why: str) -> None:
    """The TLSA lookup of the MX `host` failed (perhaps a bogus answer): `dnssec-invalid`."""
    if domain is not None:
        counts.failure(domain, tlsa_policy(()), DNSSEC_INVALID, mx_host=host, reason=why)


def _tlsa(records: Iterable[Any]) -> list[tuple[int, int, int, bytes]]:
    return [(r.usage, r.selector, r.mtype, r.data) for r in records]
