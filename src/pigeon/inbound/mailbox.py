"""A mailbox source: watches one IMAP folder and hands each message to its target once.

One round:
 1. `UID SEARCH` the configured criteria (default UNSEEN);
 2. claim up to `batch` of the UIDs (see `arbitration`), or, while other nodes' heartbeats run,
    up to this node's share of what nobody holds (`_share`), the next batch likewise, so that
    a backlog smaller than two batches is not one node's alone; a UID another node holds is left to
    it (and looked at again when its holder's heartbeat would run out, if it stops); one whose
    handoff is done is acknowledged again (its holder may have died just after the handoff),
    one refused for good gets the failure action;
 3. fetch the claimed messages with `BODY.PEEK[]`, which does not set \\Seen;
 4. hand them to the target, `concurrency` at a time (or a batch at once where it can),
    while the next batch is claimed, fetched, and prepared by the target where it can do
    part of the work unseen by the application (a Maildir's files in tmp/: `_prepare`);
    one batch handed over at a time;
 5. each accepted handoff has its claim marked done at once, and is committed with the
    handoffs that completed meanwhile (`commit`), without waiting for the mark while the claim
    is surely ours (`_settle_accepted`): their InboundDelivery records written to
    the log file, then the messages acknowledged at the source (\\Seen, move, or delete and
    expunge), one IMAP command per group; the log is fsynced once per batch, in the
    background. What the target refused for now is given back with a backoff every node
    respects; what it refused for good goes to the failed folder (its record fsynced first).
Then round again while there is work; otherwise wait for the server's IDLE push (or poll).

An acknowledgement the server refuses (a full or read-only `move_to`, a missing label, a
folder the user may not delete from) leaves a message handed over yet still in the folder,
where the next search would find it. It is marked `$PigeonDone` instead (`$PigeonFailed` for
one to set aside), a keyword every search leaves out: it is never handed over again, however
long the refusal lasts, whether the done mark outlives it (24 h) or not, and without Redis
across restarts too. The mailbox is "degraded" with the refusal as its `error` until the
acknowledgement works; it is tried again every `_HELD_RETRY` seconds and at each new session.
A server that refuses the keyword too leaves the done mark alone to keep it from the target:
each claim that finds it (the message still there) makes it last another 24 h.

A removal (a deletion, a move without MOVE) is two commands, STORE \\Deleted then EXPUNGE: the
keyword goes with \\Deleted in the STORE, so a node killed between the two (or whose server
went away) leaves a message that says it was handed over. Every search leaves \\Deleted out,
so nothing else would look at it again: the same search finds it, at each new session (this
node's or another's) and every `_LEFTOVERS_EVERY` seconds, and it is expunged by UID. A message
someone else flagged \\Deleted carries no keyword, and is left alone (but by a server without
UIDPLUS, whose plain EXPUNGE removes them all, as any removal there: `_warn_plain_expunge`).

A stop (SIGTERM) starts no claim, fetch or handoff (`halt`): the handoffs on the wire finish
and are recorded and acknowledged; the rest of the batch in hand is given back untried, for the
next start or another node, which then hands each over once.

A crash anywhere loses nothing: until the acknowledgement the message is still in the folder,
and a dead node's claims are taken over within seconds (its heartbeat stops).

What a kill -9 can repeat: only handoffs in flight. A mailbox makes at most `concurrency`
requests to its target at once, and starts none while twice `concurrency` handoffs are between
their request and the server's answer to their acknowledgement (a batch target: one batch at
a time). A node killed alone repeats, at most, those not yet marked done (the done mark tells
the node that takes over to acknowledge only): the node that takes their claims over cannot
tell which of them the dead node handed over, and records each it hands over
`taken_over_from` the dead node; so does every record of the message until it is handed over,
a failed attempt's and those after its backoff, whichever node makes them (the dead node's
token waits with the backoff: see `arbitration`; in Redis only, so a Redis that loses its data
meanwhile loses it too, as the README says). A node killed with Redis repeats, at most,
all of them.
A node stopped (SIGSTOP) or stalled past its heartbeat counts as dead: its handoffs in flight
may be repeated likewise, and those it completes once it runs again are said (a WARNING) and
recorded `repeated_by_takeover` (`_warn_taken_over`). Each repeat carries the same dedupe key.

A node never hands over again what it handed over itself and has not acknowledged at the source
yet (`_unacked`): not when its session was lost before the acknowledgement, nor when Redis lost
the done marks meanwhile. It acknowledges them first thing in its next session, and puts their
done marks back, as its claims, when Redis lost its data (so other nodes leave them alone). Nor
does its next start: their done marks outlive the process (in Redis, or in the spool without it:
`marks`), and the start (or node) that finds them acknowledges and records them as ORPHANED. A
stop that leaves such messages says so (`_warn_unacknowledged`).

Every handoff has its InboundDelivery record across kill -9: the record is in the log file
(written: the kernel has it, whatever becomes of this process) before the message is
acknowledged, or, when the log cannot take it (a full disk), in the spool's outbox (committed:
`Outbox.keep_unwritten`), which the next start logs from; and a message the node died before
acknowledging is found by the node that takes over its done mark (`Standing.ORPHANED`), which
acknowledges it and writes the record on its behalf: `recovered_from` names the dead node, and
`detail` starts with "recovered:". So each dedupe key the application received has at least one
record; it has two (the second with `recovered_from`) only when the node died in the instant
between writing its record and acknowledging. A handoff repeated because its node died
before marking it done is recorded by the node that repeated it, `taken_over_from` the dead node
(the first attempt, whose answer never arrived anywhere, has none). The log is fsynced once per batch, in the
background, and when the watcher stops: a crash of the whole machine (power loss) can lose
the records of the handoffs acknowledged since the last fsync, about the last batch. If the
log cannot be written or fsynced (a failing disk), acknowledging goes on, and the error is
logged; only if the spool cannot keep the records either are they in memory alone, which that
ERROR says (a kill -9 then loses them).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import errno
import functools
import itertools
import logging
import random
import re
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from pigeon.config.patterns import host_port
from pigeon.config.schema import MailboxConfig
from pigeon.config.secret_file import first_line
from pigeon.inbound.arbitration import BEAT_TTL, UNKNOWN_TAKER, Arbiter, ArbitrationUnavailable, Claim, Standing
from pigeon.inbound.commit import Accepted, BackgroundSync, Commits, GroupCommit
from pigeon.inbound.imap import ConnectFailed, CopiedOnly, ImapError, ImapSession, uid_set
from pigeon.inbound.message import InboundMessage
from pigeon.inbound.notes import Note, Notes, NotesUnavailable
from pigeon.inbound.sasl import token_problem
from pigeon.inbound.targets.base import Handoff, Prepared, Target, Verdict, not_before
from pigeon.logs.outbox import Outbox
from pigeon.logs.records import InboundDelivery, InboundFailure, Record
from pigeon.logs.writer import LogWriter
from pigeon.metrics import Metrics
from pigeon.redaction import redact
from pigeon.tls import client_context

_log = logging.getLogger(__name__)
_Record = TypeVar("_Record", InboundDelivery, InboundFailure)

_FAILED_FLAG: Final = "$PigeonFailed"
_DONE_FLAG: Final = "$PigeonDone"  # handed over; acknowledging it was refused (see the module)
_COPIED_FLAG: Final = "$PigeonCopied"  # ... by a move without MOVE that copied it: only its removal is due
# + the node's name: "this node took it", set by nodes without [redis] only; nodes with it look
# for it too (`_look_for_other_nodes`), so that one node left without it on their mailbox shows.
_NODE_KEYWORD: Final = "$PigeonNode_"
_KEYWORD_UNSAFE: Final = re.compile(r"[^A-Za-z0-9_.-]")
SINGLE_NODE_RISK: Final = (
    "no [redis]: claims are held in this process only; another node watching this mailbox "
    "would hand every message over again"
)
_MAX_RECONNECT_DELAY: Final = 60.0
_STABLE_SESSION: Final = 30.0  # seconds a session must last (or acknowledge mail) to reconnect at 1 s
_HELD_PAUSE: Final = 2.0  # seconds before asking again about a message another node holds
_AFTER_HEARTBEAT: Final = 0.2  # ... or this long after its holder's heartbeat would run out
_WAITING_PAUSE: Final = 0.5  # ... or one in backoff (at least)
_SEARCH_SERVES: Final = 5.0  # seconds of batches one search's list is used for
_FETCH_BUDGET: Final = 16 * 1024 * 1024  # bytes of message bodies per FETCH
_BATCH_BUDGET: Final = 64 * 1024 * 1024  # bytes of message bodies per batch (the first message may be more)
_SIZES_AHEAD: Final = 1000  # UIDs of batches to come whose sizes are asked for with a batch's
# Messages of a batch that get this node's keyword (no [redis]): enough to notice another node
# taking the same batch (nodes without Redis all take the oldest first), and a flag change costs
# the server about as much as fetching the message (Dovecot renames a Maildir file for each).
_MARKED: Final = 32
_KNOCK_EVERY: Final = 1.0  # seconds between TCP knocks at a server that refuses connections
_UNREACHABLE: Final = frozenset({errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN})
_NOTE_REFRESH: Final = 2.0  # seconds between reads of the mailbox's note (another node's, maybe)
_RENEWAL_SAID_EVERY: Final = 60.0  # seconds between the lines saying claims still cannot be renewed
_COMMIT_WINDOW: Final = 0.005  # seconds: under load, acknowledgements (IMAP commands) at most this often
_HELD_RETRY: Final = 30.0  # seconds between tries of the acknowledgements the server refused
# ... and between looks, when none is known to wait, for what another node left half done (see
# `_acknowledge`): a node killed between flagging \Deleted and expunging may never come back.
_LEFTOVERS_EVERY: Final = 300.0
# What Dovecot adds to each tagged answer, "(0.001 + 0.000 secs)": left out where refusals are
# compared, or each would be a new one.
_SERVER_TIMING: Final = re.compile(r"\s*\(\d+\.\d+(?: \+ \d+\.\d+)* secs\)")


def _chunks(uids: list[int], size: int) -> list[list[int]]:
    return [uids[start : start + size] for start in range(0, len(uids), size)]


def _by_bytes(claims: list[Claim], sizes: dict[int, int], budget: int) -> list[list[Claim]]:
    """Claims in groups whose messages add up to at most `budget` bytes (one message
    alone may be more): one FETCH per group keeps a batch of big messages out of memory."""
    groups: list[list[Claim]] = []
    total = 0
    for claim in claims:
        size = sizes.get(claim.uid, 0)
        if not groups or total + size > budget:
            groups.append([])
            total = 0
        groups[-1].append(claim)
        total += size
    return groups


def _lower(flags: Iterable[str]) -> set[str]:
    return {flag.lower() for flag in flags}


def _if_tried(answer: Handoff) -> Handoff | None:
    """A target's answer; None for a handoff it did not start (halted: the node stops)."""
    return answer if answer.tried else None


def retry_delay(attempts: int, first: float, cap: float) -> float:
    """Delay before attempt `attempts + 1`: doubling from `first` up to `cap`, with jitter."""
    delay = min(cap, first * float(2 ** max(0, attempts - 1)))
    return delay * random.uniform(0.8, 1.0)


@dataclass(slots=True)
class _Fetched:
    """A batch fetched, to be handed over."""

    ready: list[tuple[Claim, InboundMessage]]  # claimed, to hand over
    recovered: list[Accepted]  # handed over by a dead node: to record and acknowledge
    too_big: list[tuple[Claim, int]]  # claimed and over max_message_size: refused for good
    uidvalidity: int
    now: float
    # A batch target's work on `ready` done ahead, unseen by the application (`Target.prepare`):
    # while the batch before is handed over.
    prepared: asyncio.Task[Prepared | None] | None = None


@dataclass(slots=True)
class _Takeover:
    """What this mailbox took over from one dead node after the line that said so: its later
    batches are summed into one closing line, not a line each (one takeover, one line)."""

    claims: int  # in all: held by the dead node, to hand over again
    dones: int  # in all: handed over by it, to acknowledge and record for it
    first: int  # how many the first line named
    ongoing: bool = True  # took some in the round under way


def _taken_over(claims: int, dones: int) -> str:
    """What a takeover line says of the messages taken over: what becomes of each kind."""
    what = []
    if claims:
        what.append(f"{claims} it held and may have handed over already, to hand over again (their "
                    f"records say taken_over_from)")  # fmt: skip
    if dones:
        what.append(f"{dones} it had handed over, to acknowledge and record for it (recovered_from)")
    return "; ".join(what)


class MailboxWatcher:
    """Runs until cancelled; reconnects with backoff after any error."""

    def __init__(
        self,
        config: MailboxConfig,
        target: Target,
        arbiter: Arbiter,
        log: LogWriter,
        metrics: Metrics,
        *,
        retry_interval: float,
        max_retry_interval: float,
        node: str = "",
        notes: Notes | None = None,
        outbox: Outbox | None = None,
    ) -> None:
        self.config = config
        self.target = target
        self._arbiter = arbiter
        self._log = log
        self._outbox = outbox  # keeps the records the log cannot take, before the acknowledgement
        self._unkept = 0  # records acknowledged while in memory alone (neither log nor spool took them)
        self._metrics = metrics
        self._retry = (retry_interval, max_retry_interval)
        port = config.port or (993 if config.tls == "implicit" else 143)
        self.port = port
        self.identity = f"{config.username}@{config.host.lower()}:{port}/{config.folder}"
        self.source = f"imap:{config.name}"
        self.last_poll: float | None = None
        self.connected = False  # false from the moment the connection is lost (`_lost`)
        self._loss_said = False  # the session's loss was logged
        self.last_error: str | None = None
        self.held: dict[str, Claim] = {}
        self._elsewhere: dict[int, float] = {}  # UID: monotonic time to ask about it again
        self._settled_before: set[int] = set()  # UIDs found done/failed by another node once
        self._orphans: dict[str, Claim] = {}  # done marks taken from dead nodes, not yet recorded
        self._takeovers: dict[str, _Takeover] = {}  # dead node (as logs name it): taken over, said once
        # What this node handed over (or recovered for a dead node) and has not acknowledged at
        # the source yet, by claim key: never handed over again, whatever Redis says (it may have
        # lost the done marks) and across sessions (one lost before the acknowledgement). The
        # first round of each session acknowledges them (`_retry_held`); a lapse of our
        # heartbeat (Redis lost its data, say) puts their done marks back (`_renew_forever`).
        self._unacked: dict[str, Claim] = {}
        self._known_sizes: dict[int, int] = {}  # UID: size, in `_sizes_session`'s folder
        self._sizes_session: ImapSession | None = None
        self._dones: GroupCommit[Claim] = GroupCommit(self._mark_done)  # marked as soon as accepted
        self._unmarked = 0  # handoffs not marked done while Redis was away (said once, then counted)
        self._claims_paused = False  # told "claims paused": say when they resume
        self._syncs = BackgroundSync(self._sync_log)  # one fsync of the log per batch, off its path
        self._stopping = False
        self._refused = False  # the last connection was refused: knock for the server's return
        self._acknowledged = False  # in this session
        self._between_batches = asyncio.Event()  # clear while a batch is in hand
        self._between_batches.set()
        self._tls_context: ssl.SSLContext | None = None
        # Since when the mailbox has not been doing its job (cannot connect, search or
        # claim); None while it works. It has not worked yet when it starts.
        self._trouble_since: float | None = time.monotonic()
        # Without shared arbitration, this node's keyword on what it takes: another node's
        # keyword on a message we took says that node takes them too (each hands it over).
        # With it, this node marks nothing, but the keyword of a node without it says that node
        # runs beside it (unless a leftover: see `_leftovers`).
        self._keyword = f"{_NODE_KEYWORD}{_KEYWORD_UNSAFE.sub('_', node)[:30]}" if node else ""
        self.conflict: str | None = None
        self._conflicting: set[str] = set()  # other nodes' keywords already warned about
        # With shared arbitration, keywords that may be leftovers, no sign of a node running
        # beside this one: a node without [redis] stopped with its batch unacknowledged (as a
        # rollout to Redis does) leaves its keyword on up to `_MARKED` messages. Those were in
        # the folder when this node started: (UIDVALIDITY, the highest UID its first search
        # found), and the UIDs among them that carried another node's keyword when this node
        # first asked for their sizes (in `_sizes_session`). One set later, or on a message
        # that came later, was set by a node that ran while this one did.
        self._started_at: tuple[int, int] | None = None
        self._leftovers: set[int] = set()
        # What the target said when it refused a whole batch for now (accepting none): a dead
        # application, or its Redis or database down. None again once it accepts one.
        self.target_error: str | None = None
        # What the server said when it last refused to acknowledge or set aside messages at the
        # source; None again once that works for every message it refused.
        self.source_error: str | None = None
        self._refusal_said_at = float("-inf")  # monotonic: when the refusal was last logged
        # Why the last fetch of a batch failed (the server stalled mid-answer, or answered what
        # cannot be read), and how many in a row did; None again once one works. A session that
        # searches and claims works, so without it /healthz said "ok" between the failures.
        self.fetch_error: str | None = None
        self._fetch_failures = 0
        # Whether messages marked `_DONE_FLAG` or `_FAILED_FLAG` wait for their acknowledgement
        # (None: not known in this session yet, so looked for), and when to try them again.
        self._held_at_source: bool | None = None
        self._held_retry_at = 0.0  # monotonic
        self._expunge_warned = False  # said once: this server's EXPUNGE removes others' \Deleted too
        # The mailbox's note (`notes`): the last problem any node saw on it, as last read.
        self._notes = notes if notes is not None else Notes()
        self._node = node or "this node"
        self.note: Note | None = None
        self._noted: Note | None = None  # the note this watcher wrote, while its problem lasts
        self._note_pending: tuple[str, Note] | None = None  # ("write" or "resolve", note) to send
        self._note_wake = asyncio.Event()
        self._chores: set[asyncio.Task[None]] = set()  # what prepared ahead and not handed over, undone

    # --- status ------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        """The mailbox's part of /healthz. `status`: "down" when it has not been able to
        connect, search or claim for `down_after` (Redis not answering counts from its first
        unanswered heartbeat, whether mail waits or not); "degraded" for less than that, or when
        another node was seen handing over its messages too, or while its target refuses
        whole batches for now; "ok" otherwise. A mailbox handing a backlog over is "ok" from
        its first claim, however long the batch takes. "degraded" too while the server refuses
        to acknowledge (or set aside) messages: they are handed over, and marked so they are
        never handed over again, but not where they should be.

        A failing target never makes it "down": the mailbox does its job, and nothing is lost
        (the messages wait at the source), while a 503 would take the node's SMTP listener out
        of a load balancer too. `error` names the target and what it last said, or what it
        found wrong when it first connected (`Target.problem`: a table missing, say), which
        keeps the mailbox "degraded" until a handoff works. Until its first search, after the
        node starts, it is "degraded" too, `error` saying so ("not connected yet ...")."""
        status = "ok"
        trouble, error = self._trouble_since, self.last_error
        outage = self._arbiter.outage()
        if outage is not None:
            # Redis does not answer the heartbeats: no claim would be, whether or not mail is
            # waiting (an idle mailbox included), from the moment the first went unanswered.
            since, why = outage
            trouble = since if trouble is None else min(trouble, since)
            error = error or why
        if trouble is not None:
            status = "down" if time.monotonic() - trouble >= self.config.down_after else "degraded"
        elif any(
            e is not None
            for e in (self.conflict, self.fetch_error, self.target_error, self.source_error, self.target.problem)
        ):
            status = "degraded"
        problem = f"target {self.target.name}: {self.target.problem}" if self.target.problem else None
        error = error or self.fetch_error or self.source_error or self.target_error or problem
        if trouble is not None and error is None:
            # It has not worked yet since the node started, and nothing failed yet either (a
            # target's problem found at start is a reason, and said): what it is at, not
            # "degraded" with no reason.
            connecting = f"not connected yet (connecting to {self.config.host}:{self.port})"
            error = "connected; not searched yet" if self.connected else connecting
        health: dict[str, Any] = {
            "status": status,
            "connected": self.connected,
            "last_poll": self.last_poll,
            "error": redact(error) if error else None,  # /healthz is public
            "target": self.target.name,
            "claims": len(self.held),
            "arbitration": "redis" if self._arbiter.shared else "local",
        }
        if not self._arbiter.shared:
            health["warning"] = SINGLE_NODE_RISK
        if self.conflict is not None:
            health["conflict"] = self.conflict
        # Why the mailbox was last in trouble, on whichever node: `error` says this node's side.
        health["note"] = self.note.as_dict() if self.note is not None else None
        return health

    # --- lifecycle ---------------------------------------------------------------------------
    async def run(self) -> None:
        delay = 1.0
        renewer = asyncio.create_task(self._renew_forever(), name=f"renew {self.config.name}")
        noting = asyncio.create_task(self._notes_forever(), name=f"notes {self.config.name}")
        outages = asyncio.create_task(self._outages_forever(), name=f"outages {self.config.name}")
        try:
            while not self._stopping:
                try:
                    session = await self._open()
                except Exception as error:  # refused, unreachable, or aioimaplib's own errors
                    self._failed_connection(error)
                except asyncio.CancelledError as error:
                    self._unless_cancelled(error)
                else:
                    self.connected, self.last_error, self._refused = True, None, False
                    _log.info("mailbox %s: connected to %s (UIDVALIDITY %d)", self.config.name,
                              self.identity, session.uidvalidity)  # fmt: skip
                    connected_at = time.monotonic()
                    self._acknowledged = False
                    self._held_at_source, self._held_retry_at = None, 0.0  # looked for in each session
                    self._loss_said = False
                    self._warn_plain_expunge(session)
                    # The connection's loss is said (log, /healthz) when it happens, not when
                    # the session's work notices it: a handoff may hold that up for a while.
                    losing = asyncio.create_task(self._notice_loss(session), name=f"loss {self.config.name}")
                    try:
                        await self._watch(session)
                    except Exception as error:  # IMAP, network, TLS, or aioimaplib's own errors
                        if session.lost:
                            self._lost(session)
                        else:
                            self._failed_connection(error)
                    except asyncio.CancelledError as error:
                        self._unless_cancelled(error)
                    finally:
                        losing.cancel()
                        self.connected = False
                        await session.close()
                    if self._acknowledged or time.monotonic() - connected_at > _STABLE_SESSION:
                        # A session that worked (for a while, or far enough to acknowledge
                        # mail): what ended it is a new outage, so reconnect at once. A server
                        # that restarts mid-backlog is back in a second, not in 2, 4, 8 s.
                        delay = 1.0
                    # (one that fails as soon as it opens keeps backing off)
                if self._stopping:
                    break
                await self._pause(delay * random.uniform(0.5, 1.0))
                delay = min(_MAX_RECONNECT_DELAY, delay * 2)
        finally:
            # Claims in hand were given back by the round that took them (see `_round`).
            renewer.cancel()
            noting.cancel()
            outages.cancel()
            self._end_takeovers(everything=True)
            self._warn_unacknowledged()
            await self._syncs.wait()  # the last batch's records, on disk before we go

    def _warn_unacknowledged(self) -> None:
        """The node stops with messages handed over and not acknowledged at the source (its
        server went away in between, say): said, with what becomes of them. Their done marks
        keep them from the target (in Redis, or in the spool: `marks`) unless they were lost."""
        if not self._unacked or not self._stopping:  # (a watcher started again keeps them)
            return
        count = len(self._unacked)
        uids = uid_set(sorted(claim.uid for claim in self._unacked.values()))
        lost = self._arbiter.marks_lost()
        # (Marking them done failed while Redis did not answer: no mark keeps those.)
        unmarked = sum(1 for claim in self._unacked.values() if claim.unsettled)
        who = "the next start" if not self._arbiter.shared else "the next start (or another node)"
        if lost is not None:
            then = f"their done marks do not outlive this process ({lost}): the next start hands them over again"
        elif unmarked:
            then = (f"{who} acknowledges them without handing them over again, but for {unmarked} that could not be "
                    "marked done (Redis did not answer), which may be handed over again")  # fmt: skip
        else:
            then = f"{who} acknowledges them without handing them over again"
        _log.warning("mailbox %s: %d message%s handed over and not acknowledged at the source (UIDs %s): %s",
                     self.config.name, count, "" if count == 1 else "s", uids, then)  # fmt: skip

    def halt(self) -> None:
        """The node stops: no claim, fetch or handoff starts from now on; those on the wire
        finish (and are recorded and acknowledged), the rest of the batch in hand is given
        back untried. `stop` then waits for them."""
        self._stopping = True

    async def stop(self, grace: float) -> None:
        """Finish the handoffs in flight (up to `grace` seconds; `halt`); the caller then cancels `run`."""
        self._stopping = True
        try:
            await asyncio.wait_for(self._between_batches.wait(), grace)
        except TimeoutError:
            pass

    def _unless_cancelled(self, error: asyncio.CancelledError) -> None:
        """A cancellation nobody asked of this task (one a library let out of a command it
        cancelled itself) must not end the watcher: no mail would be fetched again, and
        nothing would say so. It costs a reconnect; a real one goes on up."""
        task = asyncio.current_task()
        if task is None or task.cancelling() or self._stopping:
            raise error
        _log.error("mailbox %s: a stray cancellation ended the session; reconnecting", self.config.name,
                   exc_info=error)  # fmt: skip
        self._failed_connection(error)

    async def _pause(self, seconds: float) -> None:
        """The wait before reconnecting. While the server refuses connections (down, or
        restarting), a TCP knock every `_KNOCK_EVERY` ends it as soon as the port accepts
        again: the mailbox is back within a second or two of its server, not at the end of a
        backoff grown to a minute. A server that accepts and then fails (a refused login)
        gets the whole backoff: knocking would not tell it is any better."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0 and not self._stopping:
            await asyncio.sleep(min(_KNOCK_EVERY, left))
            if self._refused and deadline - time.monotonic() > 0 and await self._knock():
                _log.info("mailbox %s: %s accepts connections again; reconnecting", self.config.name,
                          host_port(self.config.host, self.port))  # fmt: skip
                return

    async def _knock(self) -> bool:
        """Whether the server's port accepts a TCP connection now (closed at once)."""
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(self.config.host, self.port), _KNOCK_EVERY)
        except (OSError, TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    async def _notice_loss(self, session: ImapSession) -> None:
        await session.until_lost()
        self._lost(session)

    def _lost(self, session: ImapSession) -> None:
        """The server closed the session's connection, or said BYE: /healthz says so at once
        (`connected: false`), and so does the log, once per session; the watcher reconnects as
        soon as the handoffs under way, if any, have their answers."""
        self.connected = False
        if self._loss_said:
            return
        self._loss_said = True
        then = "reconnecting" if self._between_batches.is_set() else "reconnecting once the handoffs under way end"
        self._failed_connection(ImapError(session.lost_reason), then=then)

    def _failed_connection(self, error: BaseException, *, then: str = "reconnecting") -> None:
        # Refused or unreachable: the server (or its host) is down, and its return shows as a
        # port that accepts again (`_pause`).
        self._refused = isinstance(error, OSError) and (
            error.errno in _UNREACHABLE or "Multiple exceptions" in str(error)  # each address of a name
        )
        if self._trouble_since is None:
            self._trouble_since = time.monotonic()
        text = f"{type(error).__name__}: {redact(str(error))}" if str(error) else type(error).__name__
        if isinstance(error, ConnectFailed):  # it names the server, and the setting to change
            text = redact(str(error))
        if text != self.last_error:
            self._problem(text)
            _log.warning("mailbox %s (%s): %s; %s", self.config.name, self.identity, text, then)
        else:  # (said once as a warning; each retry that fails the same way, quietly)
            _log.info("mailbox %s (%s): again %s; %s", self.config.name, self.identity, text, then)
        self.last_error = text
        self._metrics.inbound_errors.labels(self.config.name).inc()

    async def _open(self) -> ImapSession:
        config = self.config
        if config.tls != "none" and self._tls_context is None:
            self._tls_context = client_context(verify=config.tls_verify, cafile=config.ca_file)
        secret = config.password
        if config.password_file is not None:
            secret = await asyncio.to_thread(first_line, config.password_file)
        if config.auth == "xoauth2" and (problem := token_problem(secret or "")) is not None:
            where = f"password_file {config.password_file}" if config.password_file is not None else "password"
            raise ImapError(f'auth = "xoauth2": {problem} ({where}): nothing sent to the server')
        session = await ImapSession.open(
            config.host,
            self.port,
            tls=config.tls,
            tls_context=self._tls_context,
            username=config.username,
            secret=secret or "",
            auth=config.auth,
            folder=config.folder,
            command_timeout=config.timeout,
        )
        try:
            for folder in (config.move_to if config.after_delivery == "move" else None, config.failed_folder):
                if folder:
                    await session.create(folder)
        except BaseException:
            await session.close()
            raise
        return session

    # --- the rounds --------------------------------------------------------------------------
    async def _watch(self, session: ImapSession) -> None:
        config = self.config
        while not self._stopping:
            if session.lost:
                raise ImapError("the server closed the connection")
            try:
                worked, waiting = await self._round(session)
                if self._claims_paused:
                    # The round asked Redis nothing (nothing new to claim): claims resume on an
                    # answer from it, not on the silence of a round that needed none.
                    await self._arbiter.ping()
            except ArbitrationUnavailable as error:
                # No claims without Redis: nothing is handed over, nothing is lost. Keep the
                # IMAP session and ask again shortly.
                self._pause_claims(str(error))
                await asyncio.sleep(1.0)
                continue
            self._works()
            if worked:
                continue
            # Idle until new mail, or until the first message held elsewhere or in backoff is
            # worth asking about again (a lease that may have run out, a backoff that ends).
            wait = float(config.poll_interval)
            if waiting and self._elsewhere:
                wait = max(0.2, min(wait, min(self._elsewhere.values()) - time.monotonic()))
            if self._claims_paused:  # a round when the pause ends says claims resumed
                wait = max(0.2, min(wait, self._arbiter.paused_for() + 0.1))
            await self._idle(session, wait)

    def _pause_claims(self, why: str) -> None:
        """Redis does not answer (`why`): no claims until it does. Said once per outage, by
        whichever notices first: a round's claim, or the heartbeat (`_outages_forever`)."""
        if self._trouble_since is None:
            self._trouble_since = time.monotonic()
        # (Paused with no error: Redis answered, in the pause after it lost its data; it is away again.)
        if not self._claims_paused or self.last_error is None:
            _log.warning("mailbox %s: %s; claims paused", self.config.name, why.rstrip("."))
            self._problem(f"{why.rstrip('.')}; claims paused")
        self.last_error = why
        self._claims_paused = True

    async def _outages_forever(self) -> None:
        """Pause claims as soon as the heartbeat finds Redis gone, busy or idle: a mailbox
        handing a batch over to a slow target would otherwise say so only once the batch ends
        and its next claim fails, seconds later. (The round after it asks Redis again, and
        says claims resumed once it answers: `_watch`.)"""
        while True:
            await self._arbiter.outage_signal().wait()
            outage = self._arbiter.outage()
            if outage is not None:
                self._pause_claims(outage[1])

    async def _idle(self, session: ImapSession, wait: float) -> None:
        """Wait for new mail (or `wait` seconds), or for Redis to stop answering: the round
        that follows then says claims are paused at once, not at the next poll."""
        if not self._arbiter.shared:
            await session.wait_for_mail(wait, idle=self.config.idle)
            return
        down = self._arbiter.outage_signal()
        waking = asyncio.create_task(down.wait())

        def wake(task: asyncio.Task[Any]) -> None:
            if not task.cancelled():
                session.wake()

        waking.add_done_callback(wake)
        try:
            await session.wait_for_mail(wait, idle=self.config.idle)
        finally:
            waking.cancel()

    def _works(self) -> None:
        """The mailbox was searched, and what it found claimed: it does its job, however long
        the batches it hands over take (the first of a big backlog can take minutes)."""
        if self._claims_paused and self._arbiter.paused_for() <= 0:
            # (Redis back without its data: claims stay paused until holders could put theirs
            # back, as the arbiter said; "resumed" is said when that pause is over, not before.)
            self._claims_paused = False
            _log.info("mailbox %s: arbitration answers again; claims resumed", self.config.name)
        self.last_error = None
        self._trouble_since = None
        self._maybe_resolved()

    def _answered(self) -> None:
        """The server answered a search or an acknowledgement: `last_poll` (and its gauge)
        moves while a backlog is handed over, not only once per round."""
        self.last_poll = time.time()
        self._metrics.inbound_last_poll.labels(self.config.name).set(self.last_poll)

    async def _round(self, session: ImapSession) -> tuple[bool, bool]:
        """One search-claim-handoff round. (handed anything over, others hold some)."""
        config = self.config
        await self._retry_held(session)
        uids = await session.search(f"{config.search} UNDELETED NOT KEYWORD {_FAILED_FLAG} NOT KEYWORD {_DONE_FLAG}")
        self._answered()
        if self._started_at is None or self._started_at[0] != session.uidvalidity:
            self._started_at = (session.uidvalidity, max(uids, default=0))
        searched = set(uids)
        self._orphans = {key: claim for key, claim in self._orphans.items() if claim.uid in searched}
        if not uids:
            self._end_takeovers(everything=True)
            self._elsewhere.clear()
            self._settled_before.clear()
            self._target_idle()
            # Nothing to claim: an idle mailbox still asks Redis, so that an outage shows in
            # its health (down after `down_after`) before mail arrives that it could not claim.
            await self._arbiter.ping()
            return False, False
        self._settled_before.intersection_update(uids)
        self._known_sizes = {uid: size for uid, size in self._known_sizes.items() if uid in searched}
        self._leftovers.intersection_update(searched)
        # What another node held a moment ago is not asked about again until its holder had
        # time to finish: with N nodes, most claims would otherwise be wasted round trips.
        moment = time.monotonic()
        self._elsewhere = {uid: until for uid, until in self._elsewhere.items() if until > moment}
        candidates = [uid for uid in uids if uid not in self._elsewhere]
        waiting = len(candidates) < len(uids)
        # Nodes start at different places in the list, so they rarely reach for the same
        # messages; one node alone still takes the oldest first.
        size = self._share(len(candidates))
        if len(candidates) > size and self._arbiter.shared:
            turn = random.randrange(-(-len(candidates) // size)) * size
            candidates = candidates[turn:] + candidates[:turn]
        pending = collections.deque(candidates)  # UIDs not asked about yet in this round
        limit = size  # claims the batch being gathered takes at most
        claimed: list[Claim] = []
        done: list[Claim] = []
        failed: list[Claim] = []
        taken: list[Claim] = []  # every claim of this round's batches
        worked = False
        # The batch being handed over while the next is claimed and fetched: the mailbox
        # and the target work at the same time. One at a time, so what a kill can repeat
        # stays what one batch can.
        handing: asyncio.Task[bool] | None = None
        # One search serves many batches (a big backlog is not searched again for each), for
        # a few seconds at most, so new mail is not kept waiting behind it.
        until = moment + _SEARCH_SERVES
        try:
            while pending:
                if self._stopping or session.lost:
                    break
                if not claimed:  # a new batch: its share of what is left (see `_share`)
                    limit = self._share(len(pending))
                chunk = [pending.popleft() for _ in range(min(len(pending), limit - len(claimed)))]
                keys = [(f"{self._arbiter_prefix}{session.uidvalidity}:{uid}", uid) for uid in chunk]
                answers = await self._arbiter.claim(keys, config.lease)
                self._works()
                waiting = self._sort(answers, claimed, done, failed) or waiting
                if time.monotonic() < until:
                    # Held elsewhere a moment ago and worth another look now (its holder may
                    # have died): looked at within this round, not after the whole list.
                    pending.extend(self._due_again(searched))
                if claimed and (len(claimed) >= limit or not pending):
                    self._between_batches.clear()
                    batch, claimed = claimed, []
                    taken += batch
                    fetched = await self._fetching(session, self._fetch_batch(session, batch, pending), batch)
                    fetched.prepared = self._prepare(fetched)
                    if handing is not None:
                        previous, handing = handing, None
                        try:
                            worked = await previous or worked
                        except BaseException:
                            self._unprepare(fetched)
                            raise
                    handing = asyncio.create_task(self._hand_over(session, fetched))
                    if time.monotonic() > until:
                        break
            if handing is not None:
                previous, handing = handing, None
                worked = await previous or worked
        except BaseException as error:
            if handing is not None:
                # The batch in hand is finished first (or, when we are cancelled, stopped
                # too): its handoffs are recorded and acknowledged as usual.
                if not isinstance(error, Exception):
                    handing.cancel()
                await asyncio.wait([handing])
                if not handing.cancelled() and handing.exception() is not None:
                    _log.warning("mailbox %s: %s", config.name, handing.exception())
            raise
        finally:
            # Whatever was claimed and not settled (an error in the middle) is given back at
            # once rather than left to expire: no node would touch it for a whole lease.
            await self._give_back([c for c in taken + claimed if self.held.get(c.key) is c])
            self._between_batches.set()
            self._end_takeovers(everything=not pending)
        if done:
            # Our own handoffs that Redis forgot (claimed again just now): done marks again.
            await self._mark_done([c for c in done if c.standing is Standing.CLAIMED])
            await self._acknowledge(session, [c.uid for c in done])
        if failed:
            await self._fail_at_source(session, [c.uid for c in failed])
        return worked, waiting

    async def _fetching(self, session: ImapSession, fetch: Awaitable[_Fetched], batch: list[Claim]) -> _Fetched:
        """`fetch`, whose failure (but by the connection's loss, said as such) keeps the mailbox
        "degraded", its `error` saying why, until a fetch works: the session's searches and
        claims work between the failures, and /healthz said "ok" while nothing was fetched."""
        try:
            fetched = await fetch
        except Exception as error:
            if not session.lost:
                self._fetch_failures += 1
                times = f" ({self._fetch_failures} fetches failed in a row)" if self._fetch_failures > 1 else ""
                uids = uid_set(c.uid for c in batch)
                self.fetch_error = redact(f"cannot fetch UIDs {uids}: {type(error).__name__}: {error}{times}")
            raise
        if self.fetch_error is not None:
            _log.info("mailbox %s: fetching works again", self.config.name)
            self.fetch_error = None
            self._maybe_resolved()
        self._fetch_failures = 0
        return fetched

    def _share(self, unclaimed: int) -> int:
        """How many of `unclaimed` messages (not known to be held elsewhere) the next batch
        claims: `batch`, or, while other nodes' heartbeats run, no more than this node's share,
        ceil(unclaimed / live nodes). One node taking a whole backlog smaller than two batches
        (a batch, and the next claimed while it is handed over) would leave the others idle
        with a slow target; the rest is claimed by whoever comes next, this node included."""
        batch = self.config.batch
        live = self._arbiter.live if self._arbiter.shared else 1
        if live <= 1:
            return batch
        return max(1, min(batch, -(-unclaimed // live)))

    def _sort(self, answers: list[Claim], claimed: list[Claim], done: list[Claim], failed: list[Claim]) -> bool:
        """File each claim's answer where it belongs; True if another node holds some."""
        config = self.config
        now = time.monotonic()
        waiting = False
        # Dead node as logs name it: (claims, done marks) taken over from it.
        taken: collections.defaultdict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
        for claim in answers:
            standing = claim.standing
            if claim.key in self._unacked:
                # Handed over by us and not acknowledged yet (its record written): whatever Redis
                # says now (a claim: it lost the done mark), acknowledged, never handed over again.
                # A claim is made a done mark again first (`_round`).
                done.append(claim)
                continue
            if standing is Standing.DONE and claim.key in self._orphans:
                claim = self._orphans[claim.key]  # taken over earlier and not recorded yet
                standing = claim.standing
            if standing is Standing.CLAIMED:
                claimed.append(claim)
                self.held[claim.key] = claim  # renewed from now on
                if claim.previous and not claim.carried:  # (carried: logged when it was taken over)
                    taken[claim.previous_node][0] += 1
            elif standing is Standing.ORPHANED:
                # Handed over by a node that died before acknowledging it (maybe before
                # recording it): fetched, recorded and acknowledged with the batch.
                claimed.append(claim)
                self._orphans[claim.key] = claim
                taken[claim.previous_node][1] += 1
            elif (
                standing in (Standing.DONE, Standing.FAILED)
                and claim.uid in self._settled_before
                and claim.holder in ("", self._arbiter.token)
            ):
                # Settled, yet still here a while later: by us, and acknowledging it failed
                # (then its record is written), or by a node without heartbeat. Finish the job;
                # doing it twice is harmless. A live node's done mark is left to that node,
                # which may be about to write its record: if it dies first, the mark is
                # ORPHANED and whoever takes it writes the record.
                (done if standing is Standing.DONE else failed).append(claim)
            else:
                waiting = True
                if standing is Standing.WAITING:  # in backoff (or claims paused): nothing to do before it ends
                    pause = max(_WAITING_PAUSE, claim.retry_in)
                else:  # another node holds it, or has just settled it and is acknowledging
                    pause = min(_HELD_PAUSE, config.lease / 3)
                    if claim.retry_in > 0:  # its node's heartbeat runs out then, if it stopped
                        pause = min(pause, claim.retry_in + _AFTER_HEARTBEAT)
                    if standing is not Standing.HELD:
                        self._settled_before.add(claim.uid)
                self._elsewhere[claim.uid] = now + pause
        for node, (claims, dones) in taken.items():
            # One takeover, one line: a dead node's messages come in as many claims as the
            # batches that reach them (a line each was 14 lines in 4 s for one takeover); the
            # later ones are summed, and said in one closing line (`_end_takeovers`).
            takeover = self._takeovers.get(node)
            if takeover is not None:
                takeover.claims += claims
                takeover.dones += dones
                takeover.ongoing = True
                continue
            self._takeovers[node] = _Takeover(claims, dones, claims + dones)
            if not self._arbiter.shared:  # (done marks only: an earlier run of this node left them)
                _log.info("mailbox %s: %d message%s handed over by an earlier run of this node, %s, which stopped "
                          "before the source took their acknowledgement: acknowledging them now, without handing them "
                          "over again, and recording them (recovered_from)", config.name, dones,
                          "" if dones == 1 else "s", node)  # fmt: skip
                continue
            count = claims + dones
            _log.info("mailbox %s: took over %d message%s from node %s, whose heartbeat stopped: %s", config.name,
                      count, "" if count == 1 else "s", node, _taken_over(claims, dones))  # fmt: skip
        return waiting

    def _end_takeovers(self, *, everything: bool) -> None:
        """At the end of a round: the takeovers it took nothing more for end (`everything`: all
        of them, the round having gone through the whole list its search found, or the watcher
        stopping), each with one line of what came after its first one, if anything did. A
        takeover goes on through the rounds of one backlog, each serving a few seconds of it."""
        for node, takeover in list(self._takeovers.items()):
            if takeover.ongoing and not everything:
                takeover.ongoing = False
                continue
            del self._takeovers[node]
            count = takeover.claims + takeover.dones
            more = count - takeover.first
            if not more:
                continue
            if not self._arbiter.shared:
                _log.info("mailbox %s: %d more message%s handed over by an earlier run of this node, %s, in later "
                          "batches: %d in all, acknowledged without handing them over again", self.config.name, more,
                          "" if more == 1 else "s", node, count)  # fmt: skip
                continue
            _log.info("mailbox %s: took over %d more message%s from node %s in later batches: %d in all, %s",
                      self.config.name, more, "" if more == 1 else "s", node, count,
                      _taken_over(takeover.claims, takeover.dones))  # fmt: skip

    def _due_again(self, searched: set[int]) -> list[int]:
        now = time.monotonic()
        due = [uid for uid, until in self._elsewhere.items() if until <= now and uid in searched]
        for uid in due:
            del self._elsewhere[uid]
        return due

    async def _give_back(self, claims: list[Claim]) -> None:
        for claim in claims:
            self.held.pop(claim.key, None)
        if claims:
            try:
                await self._arbiter.release(claims)
            except ArbitrationUnavailable:
                pass  # they expire after the lease

    @property
    def _arbiter_prefix(self) -> str:
        return f"inbound:{self.identity}:"

    async def _fetch_batch(self, session: ImapSession, claims: list[Claim], upcoming: Iterable[int]) -> _Fetched:
        """A batch of claimed messages fetched (and the orphaned ones among them); what is
        gone from the mailbox given back. `upcoming`: the UIDs of the batches to come, whose
        sizes are asked for with this batch's."""
        config = self.config
        # Acknowledged by another node since our search (seen there, or moved or deleted: then
        # not there at all) is not ours to hand over: after Redis lost the "done" marks, the
        # claim alone would not know. The flags that say so come with the bodies, fetched
        # after the claim.
        seen = ("\\Seen",) if config.after_delivery == "seen" else ()
        skip = {flag.lower() for flag in (*seen, _FAILED_FLAG, _DONE_FLAG)}
        uids = [c.uid for c in claims]
        sizes = await self._sizes(session, uids, upcoming)
        claims = await self._within_budget(claims, sizes)
        uids = [c.uid for c in claims]
        # Without shared arbitration, this node's keyword goes on what it takes before the
        # fetch that reads their flags (sent together: the server takes them in order): on the
        # first `_MARKED` of the batch, which another node taking the batch takes too.
        marking = None
        if self._keyword and not self._arbiter.shared:
            marking = session.flag_first(uids[:_MARKED], self._keyword)
        try:
            fetched = await self._fetch_bodies(session, claims, sizes)
        finally:
            marked = marking is not None and await self._mark_taken(session, marking)
        if marked:
            self._look_for_other_nodes({uid: flags for uid, (flags, _) in fetched.items()})
        elif self._arbiter.shared:
            # A node without [redis] heeds no claim: what it marks, it hands over too. The flags of
            # every claimed message still there are looked at, not only of those this node hands
            # over: one the other node acknowledged since our search (\Seen) carries its keyword.
            fresh = {uid: flags for uid, (flags, _) in fetched.items() if uid not in self._leftovers}
            self._look_for_other_nodes(fresh, shared=True)
        orphans = [c for c in claims if c.standing is Standing.ORPHANED]
        claims = [c for c in claims if c.standing is Standing.CLAIMED]
        too_big = [c for c in claims if sizes.get(c.uid, 0) > config.max_message_size]
        if too_big:  # not fetched: their flags asked for alone
            described = await session.describe([c.uid for c in too_big])
            too_big = [c for c in too_big if c.uid in described and not skip & _lower(described[c.uid][1])]
        bodies = {uid: raw for uid, (flags, raw) in fetched.items() if not skip & _lower(flags)}
        for claim in orphans:
            if claim.uid not in bodies:  # its node acknowledged it after all (its record came first)
                del self._orphans[claim.key]
        orphans = [c for c in orphans if c.uid in bodies]
        big = {c.key for c in too_big}
        await self._give_back([c for c in claims if c.uid not in bodies and c.key not in big])
        wanted = [c for c in claims if c.uid in bodies]
        now = time.time()
        ready: list[tuple[Claim, InboundMessage]] = []
        recovered: list[Accepted] = []
        for claim in orphans + wanted:
            raw = bodies[claim.uid]
            message = InboundMessage.of(
                raw, self.source, now, mailbox=self.identity, uidvalidity=session.uidvalidity, uid=claim.uid
            )
            if claim.standing is Standing.ORPHANED:
                detail = f"recovered: handed over by node {claim.previous_node}, which stopped before acknowledging it"
                recovered.append(Accepted(claim, message, Handoff(Verdict.ACCEPTED, detail)))
            else:
                ready.append((claim, message))
        too_big_sizes = [(claim, sizes[claim.uid]) for claim in too_big]
        return _Fetched(ready, recovered, too_big_sizes, session.uidvalidity, now)

    async def _hand_over(self, session: ImapSession, fetched: _Fetched) -> bool:
        """Hand a fetched batch over and settle it (and record and acknowledge the orphaned
        messages among it). False if none was there."""
        config = self.config
        ready, recovered, now = fetched.ready, fetched.recovered, fetched.now
        # Acknowledged at once when idle; under load at most every _COMMIT_WINDOW, or as soon
        # as half as many handoffs as may run at once wait for it.
        enough = max(1, config.concurrency // 2)
        commits = Commits(session, functools.partial(self._commit, session), window=_COMMIT_WINDOW, enough=enough)
        await commits.add(recovered)
        try:
            answers = await self._deliver(ready, commits, fetched) if ready else []
        finally:
            self._unprepare(fetched)  # (when it was not handed over)
            if recovered or ready:
                self._syncs.soon()  # one fsync for the batch's records, off the handoffs' path
        for uids, error in commits.check():
            _log.warning("mailbox %s: cannot acknowledge UIDs %s: %s", config.name, uid_set(uids), error)
        settled = [(c, m, a) for (c, m), a in zip(ready, answers, strict=True) if a is not None]
        await self._give_back([c for (c, _), a in zip(ready, answers, strict=True) if a is None])
        later = [(c, m, a) for c, m, a in settled if a.verdict is Verdict.TRANSIENT]
        never = [(c, m, a) for c, m, a in settled if a.verdict is Verdict.PERMANENT]
        if later and not any(a.accepted for _, _, a in settled):
            self._target_failing(later[-1][2].detail)
        for claim, size in fetched.too_big:
            answer = Handoff(Verdict.PERMANENT, f"{size} bytes is over max_message_size ({config.max_message_size})")
            stub = InboundMessage(b"", self.source, now, self.identity, fetched.uidvalidity, claim.uid, dedupe_key="")
            never.append((claim, stub, answer))
        if later:
            await self._settle_later(later)
        if never:
            await self._settle_never(session, never, {claim.key: size for claim, size in fetched.too_big})
        return bool(settled or fetched.too_big or recovered)

    def _target_idle(self) -> None:
        """Nothing left to hand over (what the target refused was removed at the source, say):
        its last refusal is no longer the mailbox's trouble."""
        self._target_cleared("nothing left for target %s; its last refusal no longer counts")

    def _target_cleared(self, why: str) -> None:
        """The target's error, if any, is over; `why` (with the target's name for %s) is logged,
        at INFO: the trouble was a WARNING, its end is good news."""
        if self.target_error is not None:
            self.target_error = None
            _log.info("mailbox %s: " + why, self.config.name, self.target.name)
            self._maybe_resolved()

    def _target_failing(self, detail: str) -> None:
        """The target refused a whole batch for now: the mailbox says so (degraded) until it
        accepts a message again. Said once as a warning; the InboundFailure records say each."""
        if self.target_error is None:
            _log.warning("mailbox %s: target %s refused every handoff of a batch for now: %s", self.config.name,
                         self.target.name, detail)  # fmt: skip
            self._problem(f"target {self.target.name} refused every handoff of a batch for now: {detail}")
        self.target_error = f"target {self.target.name}: {detail}"

    async def _within_budget(self, claims: list[Claim], sizes: dict[int, int]) -> list[Claim]:
        """The claims whose messages fit in `_BATCH_BUDGET` bytes (the first always does,
        and orphans stay); the others are given back untried, for a later batch. A batch of
        big messages is held in memory whole, and two batches at once: this bounds both."""
        total = 0
        kept: list[Claim] = []
        spare: list[Claim] = []
        for claim in claims:
            size = sizes.get(claim.uid, 0)
            if claim.standing is Standing.CLAIMED and kept and total + size > _BATCH_BUDGET:
                spare.append(claim)
                continue
            total += size
            kept.append(claim)
        await self._give_back(spare)
        return kept

    async def _fetch_bodies(
        self, session: ImapSession, claims: list[Claim], sizes: dict[int, int]
    ) -> dict[int, tuple[tuple[str, ...], bytes]]:
        """(flags, raw) by UID of the claimed messages still there and not too big, and of
        the orphaned ones: as few FETCHes as the byte budget allows."""
        limit = self.config.max_message_size
        wanted = [c for c in claims if c.standing is Standing.ORPHANED or sizes.get(c.uid, limit + 1) <= limit]
        fetched: dict[int, tuple[tuple[str, ...], bytes]] = {}
        for group in _by_bytes(wanted, sizes, _FETCH_BUDGET):
            fetched.update(await session.fetch([c.uid for c in group]))
        return fetched

    async def _mark_taken(self, session: ImapSession, marking: Awaitable[None]) -> bool:
        """Whether this node's keyword went on the messages it took (without shared
        arbitration); a server that takes no keywords stops the marking for good."""
        try:
            await marking
        except ImapError as error:
            if session.lost:
                return False  # the fetch says so
            # A server that takes no keywords: no detection, and nothing else changes.
            _log.info("mailbox %s: cannot mark messages with %s (%s): another node taking them would go unnoticed",
                      self.config.name, self._keyword, error)  # fmt: skip
            self._keyword = ""
            return False
        return True

    async def _sizes(self, session: ImapSession, uids: list[int], upcoming: Iterable[int]) -> dict[int, int]:
        """The sizes of the messages still there, by UID. A message's size never changes, so
        it is asked for once per session, with those of the batches to come (one FETCH for
        many batches, not one per batch)."""
        if self._sizes_session is not session:
            self._sizes_session, self._known_sizes = session, {}
            self._leftovers = set()
        known = self._known_sizes
        unknown = [uid for uid in uids if uid not in known]
        if unknown:
            ahead = [uid for uid in itertools.islice(upcoming, _SIZES_AHEAD) if uid not in known]
            described = await session.describe(unknown + ahead)
            known.update((uid, size) for uid, (size, _) in described.items())
            if self._arbiter.shared and self._started_at is not None:
                there = self._started_at[1]
                self._leftovers.update(u for u, (_, flags) in described.items() if u <= there and self._others(flags))
        return {uid: known[uid] for uid in uids if uid in known}

    def _others(self, flags: Iterable[str]) -> list[str]:
        """The keywords of other nodes (taking messages without [redis]) among `flags`. This
        node's own is left out: it may have run without [redis] before, under the same name."""
        mine = self._keyword.lower()
        return [f for f in flags if f.lower().startswith(_NODE_KEYWORD.lower()) and f.lower() != mine]

    def _look_for_other_nodes(self, marked: dict[int, tuple[str, ...]], *, shared: bool = False) -> None:
        """Another node's keyword on a message we took: that node hands it over too. `shared`:
        this node claims in Redis, and the other, without [redis], heeds none of its claims."""
        for uid, flags in sorted(marked.items()):
            for keyword in self._others(flags):
                node = keyword[len(_NODE_KEYWORD) :]
                at = time.strftime("%Y-%m-%d %H:%M:%S")
                if shared:
                    self.conflict = (
                        f"UID {uid} was also taken by node {node!r} at {at}: that node watches this mailbox "
                        "without [redis], and hands every message over whatever the nodes with [redis] claim"
                    )
                    advice = f"give node {node!r} the same [redis] url as this node, or stop it"
                else:
                    self.conflict = (
                        f"UID {uid} was also taken by node {node!r} at {at}: several nodes watch this mailbox "
                        "without [redis], and each hands every message over"
                    )
                    advice = "give the nodes a shared [redis] url, or watch it from one node"
                if keyword.lower() not in self._conflicting:
                    self._conflicting.add(keyword.lower())
                    self._problem(self.conflict)
                    _log.warning("mailbox %s: %s; %s", self.config.name, self.conflict, advice)

    def _prepare(self, fetched: _Fetched) -> asyncio.Task[Prepared | None] | None:
        """A batch target starts on the batch's work that the application cannot see (a
        Maildir's files in tmp/), while the batch before is handed over. What it may see
        still waits for the batch before to be acknowledged: what a kill can repeat is
        unchanged."""
        if not self.target.batches or not fetched.ready:
            return None
        return asyncio.create_task(self.target.prepare([m for _, m in fetched.ready]))

    def _unprepare(self, fetched: _Fetched) -> None:
        """What was prepared for a batch that is not handed over after all, undone once ready."""
        task, fetched.prepared = fetched.prepared, None
        if task is None:
            return

        def undo(done: asyncio.Task[Prepared | None]) -> None:
            if done.cancelled() or done.exception() is not None or (prepared := done.result()) is None:
                return
            chore = asyncio.create_task(prepared.discard())
            self._chores.add(chore)
            chore.add_done_callback(self._chores.discard)

        task.add_done_callback(undo)

    async def _take_prepared(self, fetched: _Fetched) -> Prepared | None:
        """The outcome of `_prepare`, now the batch is handed over (None: nothing ahead)."""
        task = fetched.prepared
        if task is None:
            return None
        prepared = await asyncio.shield(task)  # cancelled here, it is undone by `_unprepare`
        fetched.prepared = None
        return prepared

    async def _deliver(
        self, ready: list[tuple[Claim, InboundMessage]], commits: Commits, fetched: _Fetched
    ) -> list[Handoff | None]:
        """Hand the messages over; each accepted one is marked done and committed (recorded,
        acknowledged) with whatever else completed meanwhile.

        A target that takes a batch in one step (Sidekiq, PostgreSQL) is committed as one
        group right after it; one taking a request per message (webhook, Maildir) has each
        committed as it completes, with whatever completed meanwhile. None: not handed over
        (the claim is not ours any more, or the session was lost), to be given back.
        """
        target = self.target
        holds = self._arbiter.holds
        if target.batches:
            prepared = await self._take_prepared(fetched)
            ours = [holds(c) and not self._stopping for c, _ in ready]
            handed = [m for (_, m), mine in zip(ready, ours, strict=True) if mine]
            started = time.monotonic()
            if not handed and prepared is not None:
                await prepared.discard()
            answers = iter(await target.deliver_prepared(handed, prepared) if handed else [])
            duration = (time.monotonic() - started) / max(1, len(handed))
            result = [_if_tried(next(answers)) if mine else None for mine in ours]
            accepted = [
                Accepted(c, m, a, duration) for (c, m), a in zip(ready, result, strict=True) if a and a.accepted
            ]
            await self._settle_accepted(accepted, commits)
            return result
        # `concurrency` requests to the target at once, and no new one while twice that many
        # handoffs are between their request and their acknowledgement: commits overlap new
        # requests, and what a kill can repeat stays bounded.
        gate = asyncio.Semaphore(self.config.concurrency)
        in_flight = asyncio.Semaphore(2 * self.config.concurrency)

        async def one(claim: Claim, message: InboundMessage) -> Handoff | None:
            async with in_flight:
                async with gate:
                    # Checked per message: the last of a batch may start long after the first,
                    # and a lease that ran out meanwhile may be another node's claim by now. A
                    # stopping node starts none (`halt`): it finishes those on the wire.
                    if not commits.usable or not holds(claim) or self._stopping:
                        return None
                    started = time.monotonic()
                    (answer,) = await target.deliver_many([message])
                if not answer.tried:  # the target is halted (the node stops)
                    return None
                if answer.accepted:
                    await self._settle_accepted([Accepted(claim, message, answer, time.monotonic() - started)], commits)
            return answer

        return list(await asyncio.gather(*(one(c, m) for c, m in ready)))

    async def _settle_accepted(self, accepted: list[Accepted], commits: Commits) -> None:
        """Mark the claims done at once, and commit the handoffs (records, then acknowledgement
        at the source) with whatever else completed meanwhile: the time between the target
        accepting and the claim or the source saying so is when a node's death alone makes a
        duplicate.

        A handoff accepted while its claim is surely ours (`Arbiter.holds`: our heartbeat
        cannot have run out, so no node can have taken it over) is committed without waiting
        for its done mark: its acknowledgement never waits on a Redis slow to answer, or not
        answering at all (cut off from it, a node would acknowledge only after its timeouts,
        when another node may have taken the claim over and handed the message over again).

        One accepted after our heartbeat may have run out is marked done first, which tells
        whether another node took it over (`Claim.taken_by`), then committed; when Redis cannot
        tell (it does not answer), it is said and recorded as possibly repeated all the same."""
        if accepted:
            self._target_cleared("target %s accepts messages again")
        for item in accepted:
            self.held.pop(item.claim.key, None)  # marked done: nothing left to renew
            self._unacked[item.claim.key] = item.claim
            item.lapsed = not self._arbiter.holds(item.claim)
        sure = [a for a in accepted if not a.lapsed]
        unsure = [a for a in accepted if a.lapsed]
        steps: list[Awaitable[None]] = []
        if sure:
            steps += (self._dones.add([a.claim for a in sure]), commits.add(sure))
        if unsure:
            steps.append(self._settle_lapsed(unsure, commits))
        await asyncio.gather(*steps)

    async def _settle_lapsed(self, accepted: list[Accepted], commits: Commits) -> None:
        """Handoffs accepted after our heartbeat may have run out (see `_settle_accepted`)."""
        claims = [a.claim for a in accepted]
        if self._arbiter.outage() is None:
            await self._dones.add(claims)  # (sets `taken_by`, or `unsettled` when Redis went away)
            await commits.add(accepted)
            return
        # Redis does not answer now: nothing would tell before its timeouts, and the message waits
        # at the source meanwhile, where another node may find it.
        for claim in claims:
            claim.unsettled = True
        await asyncio.gather(self._dones.add(claims), commits.add(accepted))

    async def _commit(self, session: ImapSession, group: list[Accepted]) -> None:
        """Write a group of accepted handoffs' records to the log file, then acknowledge the
        messages at the source (one command). A node killed at any point leaves either a
        record, or a done mark whose taker writes the record (or a claim whose taker hands the
        message over again, and records that). The fsync comes once per batch (`_hand_over`)."""
        action = self._ack_action()
        records: list[Record] = []
        for accepted in group:
            duration = None if accepted.duration is None else round(accepted.duration, 6)
            claim, message, answer = accepted.claim, accepted.message, accepted.answer
            recovered_from = claim.previous if claim.standing is Standing.ORPHANED else None
            repeated = bool(claim.taken_by) or (accepted.lapsed and claim.unsettled)
            if claim.taken_by:
                self._warn_taken_over(claim, message)
            elif repeated:
                self._warn_maybe_taken_over(claim, message)
            record = self._record(
                InboundDelivery,
                claim,
                message,
                answer,
                duration=duration,
                acknowledged=action,
                recovered_from=recovered_from,
                repeated_by_takeover=repeated,
            )
            records.append(record)
        self._metrics.inbound_messages.labels(self.source, self.target.name, "delivered").inc(len(group))
        await self._write_kept(records)  # in the file, or the spool: what a kill -9 cannot take back
        for accepted in group:
            self._orphans.pop(accepted.claim.key, None)
            self._unacked[accepted.claim.key] = accepted.claim  # (a recovered one: ours now)
        await self._acknowledge(session, [a.claim.uid for a in group])

    def _warn_taken_over(self, claim: Claim, message: InboundMessage) -> None:
        """The target accepted a message whose claim another node had taken over meanwhile: this
        node's heartbeat ran out during the handoff (the process stopped or stalled), so the
        other node took it for dead and may have handed the message over too."""
        # (`taken_by` is "another node" when the node that took it over is not known any more)
        taker = claim.taken_by if claim.taken_by == UNKNOWN_TAKER else f"node {claim.taken_by}"
        _log.warning("mailbox %s: UID %d (Message-ID %s) of %s was accepted by %s after %s took its claim over "
                     "(this node's heartbeat had run out: stopped or stalled for more than %.0fs): it may have "
                     "reached the application twice, with the same dedupe key %s", self.config.name, claim.uid,
                     message.message_id or "none", self.identity, self.target.name, taker, BEAT_TTL,
                     message.dedupe_key)  # fmt: skip

    def _warn_maybe_taken_over(self, claim: Claim, message: InboundMessage) -> None:
        """The target accepted a message after this node's heartbeat may have run out, and Redis
        did not answer to tell whether another node took its claim over meanwhile."""
        _log.warning("mailbox %s: UID %d (Message-ID %s) of %s was accepted by %s after this node's heartbeat may have "
                     "run out (Redis does not answer: this node cannot tell whether another took its claim over): it "
                     "may have reached the application twice, with the same dedupe key %s", self.config.name,
                     claim.uid, message.message_id or "none", self.identity, self.target.name,
                     message.dedupe_key)  # fmt: skip

    async def _mark_done(self, claims: list[Claim]) -> None:
        if not claims:
            return
        try:
            await self._arbiter.done(claims)
        except ArbitrationUnavailable as error:
            # Delivered is delivered: acknowledge at the source regardless, which is what keeps
            # the message from being handed over again. Said once an outage, not at every batch.
            for claim in claims:
                claim.unsettled = True
            if not self._unmarked:
                _log.warning("mailbox %s: could not mark handoffs done (they are acknowledged at the source all "
                             "the same): %s", self.config.name, error)  # fmt: skip
            self._unmarked += len(claims)
            return
        if self._unmarked:
            _log.info("mailbox %s: handoffs are marked done again; %d could not be while arbitration was away",
                      self.config.name, self._unmarked)  # fmt: skip
            self._unmarked = 0

    async def _write_kept(self, records: list[Record]) -> None:
        """Write `records` to the log file now; those it cannot take (a full disk) are kept in
        the spool's outbox before this returns, so that what follows (an acknowledgement at the
        source) never leaves a handoff whose record only this process's memory holds."""
        if self._outbox is None:
            for record in records:
                self._log.write(record)
            self._log.flush()
            return
        written = self._outbox.write_numbered(records)
        self._log.flush()
        try:
            kept = await self._outbox.keep_unwritten(written)
        except OSError as error:
            unkept = sum(1 for ticket, _, _ in written if not self._log.written(ticket))
            self._unkept += unkept
            _log.error("mailbox %s: %d inbound records are in memory only, acknowledging anyway: the log cannot "
                       "take them (%s) and the spool cannot keep them (%s); a kill -9 would lose them",
                       self.config.name, unkept, self._log.error, error)  # fmt: skip
            return
        if kept and not self._unkept:
            _log.debug("mailbox %s: %d inbound records kept in the spool's outbox until the log takes them",
                       self.config.name, kept)  # fmt: skip

    async def _sync_log(self) -> None:
        try:
            await self._log.sync()
        except OSError as error:
            # The application has the messages: holding their acknowledgement back until the
            # log disk is fixed would hand them over again and again. Said instead: loudly when
            # only this process's memory holds records the file could not take.
            if self._outbox is not None and not self._unkept:
                _log.warning("mailbox %s: the event log cannot be written or fsynced (%s): the records it could not "
                             "take are kept in the spool's outbox until it can; acknowledging",
                             self.config.name, error)  # fmt: skip
                return
            _log.error("mailbox %s: inbound records may not be durable, acknowledging anyway: %s",
                       self.config.name, error)  # fmt: skip

    async def _settle_later(self, later: list[tuple[Claim, InboundMessage, Handoff]]) -> None:
        first, cap = self._retry
        delays = [(c, not_before(retry_delay(c.attempts + 1, first, cap), a, cap)) for c, _, a in later]
        for claim, _ in delays:
            self.held.pop(claim.key, None)
        try:
            await self._arbiter.backoff(delays)
        except ArbitrationUnavailable:
            pass  # the claims expire by themselves after the lease: a later retry, no loss
        now = time.time()
        self._metrics.inbound_messages.labels(self.source, self.target.name, "deferred").inc(len(later))
        for (claim, message, answer), (_, delay) in zip(later, delays, strict=True):
            self._log.write(self._record(InboundFailure, claim, message, answer, next_attempt=now + delay))

    async def _settle_never(
        self, session: ImapSession, never: list[tuple[Claim, InboundMessage, Handoff]], sizes: dict[str, int]
    ) -> None:
        """`sizes`: of the messages not fetched (over max_message_size), by claim key, as the
        server says them (RFC822.SIZE)."""
        # Marked failed first: if setting it aside fails, the next round (ours or another
        # node's) finds the mark and sets it aside without handing it over again. And
        # recorded durably first, as a delivery is: a message set aside has its record.
        for claim, _, _ in never:
            self.held.pop(claim.key, None)
        action = self._failure_action()
        failures: list[Record] = []
        for claim, message, answer in never:
            _log.warning("mailbox %s: UID %d refused for good by %s: %s", self.config.name, claim.uid,
                         self.target.name, answer.detail)  # fmt: skip
            record = self._record(
                InboundFailure, claim, message, answer, size=sizes.get(claim.key), permanent=True, action=action
            )
            failures.append(record)
        self._metrics.inbound_messages.labels(self.source, self.target.name, "failed").inc(len(never))
        await self._write_kept(
            failures
        )  # in the file (or spool) before the failed mark, which lets others set it aside
        with contextlib.suppress(ArbitrationUnavailable):
            await asyncio.gather(self._arbiter.failed([c for c, _, _ in never]), self._sync_log())
        await self._fail_at_source(session, [c.uid for c, _, _ in never])

    def _record(
        self,
        kind: type[_Record],
        claim: Claim,
        message: InboundMessage,
        answer: Handoff,
        *,
        size: int | None = None,
        **extra: Any,
    ) -> _Record:
        """`size`: the server's, for a message whose body was not fetched (then `message` is
        a stub, its dedupe key empty). Every attempt at a message taken over from a dead node,
        which may have handed it over before it died, says so (`taken_over_from`): failures
        too, whichever node makes it, until it is handed over."""
        return kind(
            timestamp=time.time(),
            source=self.source,
            target=self.target.name,
            dedupe_key=message.dedupe_key,
            size=len(message.raw) if size is None else size,
            message_id=message.message_id,
            mailbox=self.identity,
            uidvalidity=message.uidvalidity,
            uid=claim.uid,
            attempt=claim.attempts + 1,
            detail=answer.detail,
            taken_over_from=claim.taken_over_from or None,
            **extra,
        )

    def _ack_action(self) -> str:
        """What acknowledging a message at the source does, as its record says it."""
        config = self.config
        if config.after_delivery == "move" and config.move_to:
            return f"moved to {config.move_to}"
        return "deleted" if config.after_delivery == "delete" else "seen"

    async def _acknowledge(self, session: ImapSession, uids: Sequence[int], *, copied: bool = False) -> bool:
        """Acknowledge handed-over messages at the source; if the server refuses, mark them
        `_DONE_FLAG` instead (see `_at_source`). `copied`: a move without MOVE copied them
        already, only their removal is due. True when acknowledged as configured."""
        config = self.config
        # A removal (a deletion, or a move without MOVE) stores \Deleted with the keywords
        # `_retry_held` searches for, in one command: a node stopped between that and the
        # EXPUNGE (killed, or the server gone) leaves a message that says it was handed over,
        # and the next session (this node's or another's) finishes the job.
        copy_marks = f"{_DONE_FLAG} {_COPIED_FLAG}"
        act: Callable[[Sequence[int]], Awaitable[None]]
        if config.after_delivery == "move" and config.move_to:
            folder = config.move_to
            if copied:
                act = functools.partial(session.delete, marks=copy_marks)
            else:
                act = functools.partial(session.move, folder=folder, marks=copy_marks)
        elif config.after_delivery == "delete":
            act = functools.partial(session.delete, marks=_DONE_FLAG)
        else:
            act = functools.partial(session.flag, flags="\\Seen")
        outcome = await self._at_source(session, uids, "acknowledge", act, _DONE_FLAG)
        if outcome != "refused":  # acknowledged, or flagged so that no search finds it again
            prefix = f"{self._arbiter_prefix}{session.uidvalidity}:"
            keys = [f"{prefix}{uid}" for uid in uids]
            for key in keys:
                self._unacked.pop(key, None)
            self._arbiter.acknowledged(keys)
        if outcome != "done":
            return False
        self._acknowledged = True
        self._answered()
        return True

    def _failure_action(self) -> str:
        folder = self.config.failed_folder
        return f"moved to {folder}" if folder else f"flagged \\Seen {_FAILED_FLAG}"

    async def _fail_at_source(self, session: ImapSession, uids: Sequence[int], *, copied: bool = False) -> bool:
        """Set aside messages refused for good; if the server refuses to move them to the
        failed folder, flag them `_FAILED_FLAG` instead (as without one). True when set aside
        as configured."""
        folder = self.config.failed_folder
        if not folder:
            act = functools.partial(session.flag, flags=f"\\Seen {_FAILED_FLAG}")
            return await self._at_source(session, uids, "set aside", act, None) == "done"
        marks = f"{_FAILED_FLAG} {_COPIED_FLAG}"  # (see `_acknowledge`)
        if copied:
            act = functools.partial(session.delete, marks=marks)
        else:
            act = functools.partial(session.move, folder=folder, marks=marks)
        return await self._at_source(session, uids, "set aside", act, f"\\Seen {_FAILED_FLAG}") == "done"

    # --- acknowledgements the server refuses --------------------------------------------------
    async def _at_source(
        self,
        session: ImapSession,
        uids: Sequence[int],
        what: str,
        act: Callable[[Sequence[int]], Awaitable[None]],
        mark: str | None,
    ) -> str:
        """Do `act` at the source for `uids` (an acknowledgement, or setting aside). When the
        server refuses it (a full or read-only folder, a label that is missing), the messages
        are flagged `mark` instead, a keyword the search leaves out: whatever becomes of their
        done marks, they are not handed over again. The mailbox is degraded, and the act tried
        again later (`_retry_held`). A lost session raises, as any command. "done" when done,
        "flagged" when flagged `mark` instead, "refused" when neither.

        A message gone from the folder (expunged by another client, or moved by a node that took
        it over) needs nothing done: a refusal because some are (`NO [EXPUNGEISSUED]`) is no
        refusal, and `act` is done again for the others, once."""
        try:
            try:
                await act(uids)
            except ImapError as error:
                if session.lost or "EXPUNGEISSUED" not in str(error).upper():
                    raise
                present = await session.present(uids)
                if len(present) == len(uids):
                    raise
                _log.info("mailbox %s: UIDs %s are gone from %s already: nothing to %s there", self.config.name,
                          uid_set(set(uids) - set(present)), self.config.folder, what)  # fmt: skip
                uids = present
                await act(uids)
        except ImapError as error:
            if session.lost:
                raise
            if mark is not None and isinstance(error, CopiedOnly):  # in its destination already: only removal is due
                mark = f"{mark} {_COPIED_FLAG}"
            afterwards = "tried again next round"
            flagged = False
            if mark is not None:
                try:
                    await session.flag(uids, mark)
                except ImapError as again:
                    if session.lost:
                        raise
                    # Their done (or failed) marks keep them from the target while they are
                    # found in the folder: each claim that finds one makes it last.
                    afterwards = f"nor can they be flagged {mark} ({again}); tried again next round"
                else:
                    flagged = True
                    self._held_at_source = True
                    self._held_retry_at = time.monotonic() + _HELD_RETRY
                    every = f"{_HELD_RETRY:.0f}s"
                    afterwards = f"flagged {mark} instead, so as not to be handed over again; tried again every {every}"
            self._source_refused(what, uids, error, afterwards)
            return "flagged" if flagged else "refused"
        self._source_works()
        return "done"

    def _source_refused(self, what: str, uids: Sequence[int], error: ImapError, afterwards: str) -> None:
        """The server refused to acknowledge or set aside `uids`: said (a WARNING when the
        refusal is new; the same again, at INFO, once per `_HELD_RETRY`, however many groups of
        handoffs it refuses meanwhile), counted, and the mailbox degraded until it works."""
        self._metrics.inbound_errors.labels(self.config.name).inc()
        text = f"cannot {what} messages at the source: {redact(_SERVER_TIMING.sub('', str(error)))}"
        now = time.monotonic()
        if text == self.source_error and now - self._refusal_said_at < _HELD_RETRY:
            return
        self._refusal_said_at = now
        if text != self.source_error:
            _log.warning("mailbox %s: cannot %s UIDs %s: %s; %s", self.config.name, what, uid_set(uids), error,
                         afterwards)  # fmt: skip
            self._problem(text)
        else:
            _log.info("mailbox %s: again cannot %s UIDs %s: %s; %s", self.config.name, what, uid_set(uids), error,
                      afterwards)  # fmt: skip
        self.source_error = text

    def _source_works(self) -> None:
        """An acknowledgement went through: the refusal, if any, is over once no message
        waits flagged for its own."""
        if self.source_error is None or self._held_at_source:
            return
        _log.info("mailbox %s: acknowledging at the source works again", self.config.name)
        self.source_error = None
        self._maybe_resolved()

    async def _retry_held(self, session: ImapSession) -> None:
        """Try again the acknowledgements (and set-asides) the server refused, and finish those
        a node stopped in the middle of (flagged \\Deleted, not expunged: see `_acknowledge`):
        the messages flagged for it, found by search. At each new session, then every
        `_HELD_RETRY` seconds while some are left, and every `_LEFTOVERS_EVERY` otherwise."""
        if time.monotonic() < self._held_retry_at:
            return
        self._held_retry_at = time.monotonic() + _HELD_RETRY
        config = self.config
        acknowledge = functools.partial(self._acknowledge, session)
        aside = functools.partial(self._fail_at_source, session)
        # (what to search, what to do with it): a message a move without MOVE copied already
        # only has its removal due. Moves leave a message marked \Deleted (by a mail client)
        # alone; a deletion whose EXPUNGE was refused finds its messages marked so.
        kinds: list[tuple[str, Callable[[list[int]], Awaitable[bool]]]] = []
        if config.after_delivery == "seen":
            kinds.append((f"UNSEEN UNDELETED KEYWORD {_DONE_FLAG}", acknowledge))
        else:
            scope = "UNDELETED " if config.after_delivery == "move" else ""
            kinds.append((f"{scope}KEYWORD {_DONE_FLAG} NOT KEYWORD {_COPIED_FLAG}", acknowledge))
            kinds.append((f"KEYWORD {_DONE_FLAG} KEYWORD {_COPIED_FLAG}", functools.partial(acknowledge, copied=True)))
        if config.failed_folder:
            kinds.append((f"UNDELETED KEYWORD {_FAILED_FLAG} NOT KEYWORD {_COPIED_FLAG}", aside))
            kinds.append((f"KEYWORD {_FAILED_FLAG} KEYWORD {_COPIED_FLAG}", functools.partial(aside, copied=True)))
        held, found = not await self._acknowledge_unacked(session), 0
        for criteria, act in kinds:
            uids = await session.search(criteria)
            found += len(uids)
            for chunk in _chunks(uids, config.batch):
                if not await act(chunk):
                    held = True
                    break
        if found and not held:
            # Refused before, or left half done (by a node stopped between \Deleted and EXPUNGE).
            _log.warning("mailbox %s: %d message%s handed over (or set aside) earlier and flagged so, their "
                         "acknowledgement refused or cut short, %s done at the source now", config.name,
                         found, "" if found == 1 else "s", "is" if found == 1 else "are")  # fmt: skip
        self._held_at_source = held
        if not held:
            self._held_retry_at = time.monotonic() + _LEFTOVERS_EVERY
        self._source_works()

    async def _acknowledge_unacked(self, session: ImapSession) -> bool:
        """Acknowledge what this node handed over and could not acknowledge yet (its session
        was lost in between, say): before anything is claimed, so that neither this node nor
        another hands it over again, whatever Redis remembers. True when none is left."""
        prefix = f"{self._arbiter_prefix}{session.uidvalidity}:"
        stale = [key for key in self._unacked if not key.startswith(prefix)]
        for key in stale:  # a new UIDVALIDITY: those UIDs name nothing any more
            del self._unacked[key]
        uids = sorted(claim.uid for claim in self._unacked.values())
        if not uids:
            return True
        _log.info("mailbox %s: acknowledging %d message%s handed over before at the source: UIDs %s",
                  self.config.name, len(uids), "" if len(uids) == 1 else "s", uid_set(uids))  # fmt: skip
        for chunk in _chunks(uids, self.config.batch):
            await self._acknowledge(session, chunk)
        return not self._unacked

    def _warn_plain_expunge(self, session: ImapSession) -> None:
        """Without UIDPLUS, removing a message takes a plain EXPUNGE, which also removes every
        other message marked \\Deleted in the folder (by a mail client, not expunged yet):
        said once per mailbox."""
        config = self.config
        if self._expunge_warned or session.has("UIDPLUS"):
            return
        moves = bool(config.after_delivery == "move" and config.move_to) or bool(config.failed_folder)
        removes = config.after_delivery == "delete" or (moves and not session.has("MOVE"))
        if removes:
            self._expunge_warned = True
            _log.warning("mailbox %s: %s offers no UIDPLUS: removing the messages handed over (or set aside) takes "
                         "a plain EXPUNGE, which also removes every other message marked \\Deleted in %s and not "
                         "expunged yet", config.name, host_port(config.host, self.port), config.folder)  # fmt: skip

    # --- notes -------------------------------------------------------------------------------
    def _problem(self, text: str) -> None:
        """A new problem with the mailbox, seen from this node: the mailbox's note from now on
        (written in the background: a Redis that is away is often the problem)."""
        note = Note(redact(text), self._node, time.time())
        self.note = self._noted = note
        self._note_pending = ("write", note)
        self._note_wake.set()

    def _maybe_resolved(self) -> None:
        """The mailbox works again from here: the note this node wrote says so, unless
        another node's note replaced it."""
        problems = (self.last_error, self.fetch_error, self.target_error, self.source_error)
        if self._noted is None or any(e is not None for e in problems):
            return
        note, self._noted = self._noted, None
        if self._note_pending == ("write", note):  # never written (Redis away): written resolved
            self._note_pending = ("write", dataclasses.replace(note, resolved_at=time.time()))
        else:
            self._note_pending = ("resolve", note)
        self._note_wake.set()

    async def _notes_forever(self) -> None:
        """Send this node's note when it changes, and read the mailbox's every
        `_NOTE_REFRESH` seconds (another node's, maybe)."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._note_wake.wait(), _NOTE_REFRESH)
            self._note_wake.clear()
            pending, self._note_pending = self._note_pending, None
            try:
                if pending is not None:
                    action, note = pending
                    if action == "write":
                        await self._notes.write(self.identity, note)
                    else:
                        await self._notes.resolve(self.identity, note, time.time())
                self.note = await self._notes.read(self.identity)
            except NotesUnavailable:
                if pending is not None and self._note_pending is None:
                    self._note_pending = pending  # sent once Redis answers, unless replaced
            except Exception:  # a bug here must not end the notes for good
                _log.exception("mailbox %s: notes", self.config.name)

    # --- leases ------------------------------------------------------------------------------
    async def _renew_forever(self) -> None:
        """Every third of a lease, and at once when our heartbeat was found to have lapsed (a
        claim may have been taken over meanwhile, or lost with Redis's data: this puts it
        back, or finds it `lost`). After a lapse, the done marks of what this node handed over
        and has not acknowledged yet are put back too (`_unacked`): other nodes must not take
        those for new mail once the pause after Redis's data loss ends."""
        interval = max(0.1, self.config.lease / 3)
        pause = interval
        restore = False  # done marks to put back (a lapse was seen; not done yet)
        # While renewals fail (Redis away): since when (monotonic), how many, and when that was
        # last said. Said once per outage, then every `_RENEWAL_SAID_EVERY` at most with a
        # count, and when a renewal works again: not a WARNING every second of the outage.
        failing_since: float | None = None
        failures, said_at = 0, 0.0
        while True:
            lapse = self._arbiter.lapse_signal()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(lapse.wait(), pause)
            restore = restore or lapse.is_set()
            pause = interval
            claims = list(self.held.values())
            dones = list(self._unacked.values()) if restore else []
            if not claims and not dones:
                restore = False
                failing_since = None  # nothing left to renew (the batch ended): nothing to say works again
                continue
            try:
                if claims:
                    await self._arbiter.renew(claims, self.config.lease)
                if dones:
                    await self._arbiter.restore_done(dones)
                restore = False
            except ArbitrationUnavailable as error:
                now = time.monotonic()
                if failing_since is None:
                    failing_since, failures, said_at = now, 1, now
                    _log.warning("mailbox %s: cannot renew %d claims (%d done marks): %s; trying again every "
                                 "second", self.config.name, len(claims), len(dones), error)  # fmt: skip
                else:
                    failures += 1
                    if now - said_at >= _RENEWAL_SAID_EVERY:
                        said_at = now
                        _log.warning("mailbox %s: still cannot renew %d claims (%d done marks): %d attempts failed "
                                     "in %.0fs: %s", self.config.name, len(claims), len(dones), failures,
                                     now - failing_since, error)  # fmt: skip
                pause = min(1.0, interval)  # again soon, not a third of a lease later
                continue
            if failing_since is not None:
                _log.info("mailbox %s: claims renewed again, after %d failed attempts in %.0fs", self.config.name,
                          failures, time.monotonic() - failing_since)  # fmt: skip
                failing_since = None
