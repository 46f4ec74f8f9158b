"""Bounce classification: a rule table from reply text to a class a sender can act on.

Rules are regular expressions matched against the reply as one line,
`"<code> <enhanced code> <text>"`; the first match wins. The built-in table covers the
RFC 3463 enhanced codes and the common wordings of large providers; user rule files
(TOML, `[[rule]] class = "..." pattern = "..."`) are tried first, in the order given.
Classes follow KumoMTA's names so existing tooling reads them.

A deferral (4xx) is classified by the same table: its `TransientFailure` record says why
(`QuotaIssues` for a full mailbox, `PolicyRelated` for a provider's rate limit or block,
`BadConnection` for a host that did not answer) as a bounce's does. Where an enhanced code
means the same in class 4 as in class 5 (X.2.2, X.4.3 ...), its rule reads both.

Words a rule looks for inside other text (`spf`, `dkim`, `dmarc`) are matched as words
(`\bspf\b`): an address or host name in a reply (`x@unspfoo.com`) is not what the server says.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pigeon.smtp.replies import Reply

_BUILT_IN: Final[list[tuple[str, str]]] = [
    # Pigeon's own answers when DNS says a domain takes no mail (NXDOMAIN, no MX and no
    # address, a null MX) carry 5.1.2 or 5.1.10: a broken domain, not a dead mailbox. No MX
    # host with an address is 5.4.4 "host or domain name not found" (Postfix's words too).
    ("DNSFailure", r"^[45]\d\d [45]\.4\.3\b|\bNXDOMAIN\b|no MX and no address|null MX|host or domain name not found"),
    # A provider slowing a sender down (Gmail's 4.7.28 "unusual rate of unsolicited mail ...
    # rate limited", Yahoo's 4.7.0 [TSS04], Microsoft's 4.7.500 "server busy"): its words
    # ("unsolicited", "spam") would read as content, but a deferral of class 4.7 is about the
    # sender's rate or standing, not this message. Greylisting (Postgrey's "450 4.2.0 ...
    # Greylisted", others' 4.7.1 or none) is the receiver's policy for a sender it does not
    # know yet, whatever enhanced code comes with it: PolicyRelated, as a 4.7.x deferral is
    # (KumoMTA's TransientFailure class is not in this table: the record's type says "for now").
    ("PolicyRelated", r"^4\d\d 4\.7\.\d+\b|^4\d\d .*\brate.limit|^4\d\d .*\bgr[ae]y.?list"),
    # Then enhanced status codes: they are the server saying what it means.
    ("InvalidRecipient", r"^5\d\d 5\.1\.(1|2|3|6|10)\b"),
    ("InvalidSender", r"^5\d\d 5\.1\.(7|8)\b"),
    ("InactiveMailbox", r"^5\d\d 5\.2\.1\b"),
    (
        "QuotaIssues",
        r"^[45]\d\d [45]\.2\.2\b|over ?quota|mailbox (is )?full|quota exceeded|insufficient storage"
        r"|exceeded storage allocation",  # (RFC 5321's standard text for 552)
    ),
    ("MessageExpired", r"^5\d\d 5\.4\.7\b"),
    ("RoutingErrors", r"^[45]\d\d [45]\.4\.(4|6)\b|mail loop|too many hops"),
    ("TooManyRecipients", r"^[45]\d\d [45]\.5\.3\b|too many recipients"),
    # (x.5.0 says only "a protocol status": it comes after the wordings, below.)
    ("ProtocolErrors", r"^[45]\d\d [45]\.5\.[1-9]\b"),
    # Gmail's "552 5.7.0 ... its content presents a potential security issue" (and others' 5.7.1)
    # is about this message's content, not the sender's standing that a 5.7.x says otherwise.
    (
        "ContentRelated",
        r"^5\d\d 5\.6\.\d+\b|^5\d\d 5\.3\.4\b|message (is )?too (big|large)|size limit"
        r"|potential security issue",
    ),
    # The enhanced codes come before the spam wordings (Gmail's 5.7.26 speaks of spam too); the
    # words "spf", "dkim" and "dmarc" after them: a spam reply may name SPF's result in passing.
    ("AuthenticationFailed", r"^5\d\d 5\.7\.(8|25|26|27)\b"),
    ("RelayDenied", r"^5\d\d 5\.7\.1\b.*relay|relay(ing)? (access )?denied|not permitted to relay"),
    ("SpamBlock", r"blocklist|blacklist|block ?list|spamhaus|\bRBL\b|listed at|poor reputation"),
    ("SpamContent", r"spam|junk|unsolicited"),
    ("VirusRelated", r"virus|malware|infected"),
    ("AuthenticationFailed", r"\b(dmarc|dkim|spf)\b"),
    ("PolicyRelated", r"^5\d\d 5\.7\.\d+\b|policy|rejected for policy reasons"),
    # A mailbox that exists but takes no mail ("550 Mailbox disabled for this recipient",
    # Yahoo's "This mailbox is disabled", "This account has been disabled or discontinued"):
    # before the unknown-user wordings, Yahoo's "dd" among them.
    ("InactiveMailbox", r"\b(mailbox|account) (is |has been )?(disabled|deactivated|inactive)\b"),
    # The wordings, and RFC 5321's standard texts for 550, 551 and 553 (a bare 554 "Transaction
    # failed" says nothing of why: Uncategorized). Yahoo refuses an unknown user with "554
    # delivery error: dd This user doesn't have a yahoo.com account" or "dd Requested mailbox is
    # unavailable": its "dd" says the address takes no delivery.
    ("InvalidRecipient", r"user unknown|no such user|unknown (user|recipient)|does not exist|recipient rejected"),
    ("InvalidRecipient", r"^5\d\d .*\bdelivery error: dd\b"),
    ("InvalidRecipient", r"^55[013] .*(mailbox (is )?unavailable|user not local|mailbox name not allowed)"),
    # Microsoft's mailboxes refuse an unknown user with "550 5.5.0 Requested action not taken:
    # mailbox unavailable": the wording says why, the 5.5.0 only that it is no success.
    ("ProtocolErrors", r"^[45]\d\d [45]\.5\.0\b"),
    ("BadConfiguration", r"^5\d\d 5\.3\.\d+\b"),
    # X.4.1 and X.4.2 say no answer, or a bad connection: what Pigeon says itself (451 4.4.1
    # "cannot connect", 451 4.4.2 "closed the connection"). A server that answers 5.4.1 did
    # answer: that is Microsoft's Exchange Online refusing a recipient not in its directory
    # ("550 5.4.1 Recipient address rejected: Access denied"; its "Relay Access Denied" is
    # RelayDenied, above).
    ("BadConnection", r"^4\d\d 4\.4\.(1|2)\b"),
    ("InvalidRecipient", r"^5\d\d 5\.4\.1\b"),
]


_CACHED_LINE: Final = 512
_CLASSIFIED_TEXT: Final = 16 * 1024  # characters of a reply the rules read
"""The longest reply whose class is remembered: servers say the same short things over and over."""


@dataclass(frozen=True, slots=True)
class Rule:
    label: str
    pattern: re.Pattern[str]


class RuleFileError(Exception):
    """A rule file cannot be used; the message names the file and the rule."""


class Classifier:
    """Assigns a bounce class to a reply."""

    def __init__(self, rules: list[Rule] | None = None) -> None:
        built_in = [Rule(label, re.compile(pattern, re.IGNORECASE)) for label, pattern in _BUILT_IN]
        self._rules = (rules or []) + built_in
        self._cache: dict[str, str] = {}

    @classmethod
    def from_files(cls, paths: list[Path]) -> Classifier:
        rules: list[Rule] = []
        for path in paths:
            rules += load_rules(path)
        return cls(rules)

    def classify_all(self, replies: Sequence[Reply]) -> list[str]:
        """The class of each 5xx reply ("" for the others): an `Attempt`'s classifications."""
        return [self.classify(reply) if reply.code >= 500 else "" for reply in replies]

    def classify(self, reply: Reply) -> str:
        line = str(reply)
        label = self._cache.get(line)
        if label is None:
            # What says why is at a reply's start; the rest of a long reply (a remote server
            # chooses its length) only costs each rule's search a scan of it.
            head = line[:_CLASSIFIED_TEXT]
            label = next((rule.label for rule in self._rules if rule.pattern.search(head)), UNCATEGORIZED)
            if len(line) > _CACHED_LINE:
                return label  # not kept: a server may send long text, all different, as often as it likes
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[line] = label
        return label


UNCATEGORIZED: Final = "Uncategorized"
"""The class of a reply no rule matched."""


def known_classes(rule_files: Sequence[Path] = ()) -> list[str]:
    """The bounce classes a record may carry: those of `rule_files` (`[delivery] bounce_rules`;
    one that cannot be read gives none: the node refuses it at load), the built-in table's, and
    `Uncategorized`; each once, in that order."""
    labels: list[str] = []
    for path in rule_files:
        try:
            labels += [rule.label for rule in load_rules(path)]
        except RuleFileError:
            continue
    labels += [label for label, _ in _BUILT_IN]
    return list(dict.fromkeys([*labels, UNCATEGORIZED]))


def load_rules(path: Path) -> list[Rule]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise RuleFileError(f"{path}: cannot read bounce rules: {error}") from None
    rules: list[Rule] = []
    items = data.get("rule", [])
    if not isinstance(items, list):
        raise RuleFileError(f"{path}: write each rule as a [[rule]] table with class = and pattern =")
    for number, item in enumerate(items, start=1):
        if not isinstance(item, dict):
            raise RuleFileError(f"{path}: rule {number} is not a [[rule]] table")
        label, pattern = item.get("class"), item.get("pattern")
        if not isinstance(label, str) or not isinstance(pattern, str):
            raise RuleFileError(f'{path}: rule {number} needs class = "..." and pattern = "..."')
        try:
            rules.append(Rule(label, re.compile(pattern, re.IGNORECASE)))
        except re.error as error:
            raise RuleFileError(f"{path}: rule {number}: bad pattern: {error}") from None
    return rules
