"""The queue engine in one process, with fakes whose completions a test releases in any order.

`World` builds the real `pigeon.queue` (active set, settlement, rules, ready queues, scheduler,
admin) and the real `pigeon.delivery.dispatcher`, around fakes for everything that completes
later: route lookups (`FakeRoutes`), delivery agents (`FakeAgent`), spool commits
(`MemorySpool`: a commit first *lands* — its rows are visible to readers, as after SQLite's
COMMIT in the commit thread — then is *answered* — its future resolves, as when the loop
runs the callback), and DSN stores (written, then committed with the outcome they report).
Nothing completes by itself: each pending completion is a `Pending` the test picks and
releases, so a test can walk every order.

Between two releases `World.quiesce()` runs the event loop until nothing is runnable. The
clock is fake and only moves when the test says; no timer of the engine's is reached (idle
timeouts are an hour), so a run is a pure function of the order of releases.

The world records what a user would see: the log records (only once their commit is
answered), every attempt an agent began (message, recipients, site, and the replies it
got), and every admin operation's start and answer, so invariants are checked on outcomes.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from pigeon.delivery.agent import Agent, Work
from pigeon.delivery.dsn import Failure
from pigeon.delivery.reactor import Reactor
from pigeon.delivery.routes import Destination, Kind, TlsPolicy
from pigeon.delivery.sites import SiteHealth
from pigeon.logs.records import Record
from pigeon.message import Envelope, Message, Recipient, SpoolId
from pigeon.metrics import Counts
from pigeon.node.engine import build_engine
from pigeon.queue.admin import Admin
from pigeon.queue.attempt import Attempt, Unroutable
from pigeon.queue.names import scheduled_queue
from pigeon.queue.policy import QueuePolicies, QueuePolicy
from pigeon.queue.retry import RetryPolicy
from pigeon.queue.rules import Selector
from pigeon.shaping.rules import Shaping
from pigeon.shaping.throttles import Throttles
from pigeon.smtp.replies import Reply
from pigeon.spool.body import Body, BodyWriter
from pigeon.spool.shards import Spools
from pigeon.spool.spool import NewMessage, Settling, SpoolWriteError

OK = Reply(250, "2.0.0", ("ok",))
LATER = Reply(451, "4.3.0", ("try later",))
NO = Reply(550, "5.1.1", ("no such user",))
TERMINAL = ("Delivery", "Bounce", "Expiration", "AdminBounce")
_T = TypeVar("_T")


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass(eq=False)
class Pending:
    """A completion the test may release: `kind` is lookup, attempt, land, answer or dsn.
    `message`, `site` and `domain` say what it touches, when it touches one thing."""

    kind: str
    label: str
    release: Callable[[], None]
    order: int = 0
    message: int | None = None
    site: str | None = None
    domain: str | None = None

    def __repr__(self) -> str:
        return f"<{self.kind} {self.label}>"


# --- the spool ----------------------------------------------------------------------------------
@dataclass
class _Row:
    queue: str
    created: float
    size: int
    attempts: int
    due: float
    envelope: bytes
    body: int


class MemorySpool:
    """The `Spool` protocol in memory; writes wait in `world.pending` until released."""

    directory = Path("/nonexistent/memory-spool")

    def __init__(self, world: World, shard: int = 0) -> None:
        self._world = world
        self._shard = shard
        self.rows: dict[int, _Row] = {}
        self.bodies: dict[int, bytes] = {}
        self.refs: dict[int, int] = {}
        self.saved_rules: dict[str, bytes] = {}
        self.marks: collections.Counter[int] = collections.Counter()  # marks written, by message
        self._ids = itertools.count(1)

    @property
    def shard(self) -> int:
        return self._shard

    @property
    def count(self) -> int:
        return len(self.rows)

    def new_ids(self, n: int) -> list[SpoolId]:
        return [SpoolId((next(self._ids) << 6) | self._shard) for _ in range(n)]

    def body_writer(self, body_id: SpoolId) -> BodyWriter:
        raise NotImplementedError

    def store(
        self, body: Body, messages: list[NewMessage], records: Sequence[tuple[int, bytes]] = ()
    ) -> asyncio.Future[None]:
        raise NotImplementedError

    def put(
        self, message_id: SpoolId, queue: str, envelope: Envelope, created: float, body: bytes, due: float | None = None
    ) -> Message:
        """A reception, committed at once (the intake's part is not under test here)."""
        self.bodies[message_id] = body
        due = created if due is None else due
        self.rows[message_id] = _Row(queue, created, len(body), 0, due, _ENCODER.encode(envelope), message_id)
        return self._message(message_id, self.rows[message_id])

    # --- reads (always what has landed) --------------------------------------------------------
    def due(self, now: float, after: tuple[float, int], limit: int) -> list[Message]:
        found = sorted((row.due, spool_id) for spool_id, row in self.rows.items() if row.due <= now)
        return [self._message(i, self.rows[i]) for due, i in found if (due, i) > after][:limit]

    def get(self, spool_id: int) -> Message | None:
        row = self.rows.get(spool_id)
        return self._message(spool_id, row) if row is not None else None

    def peek(self, spool_id: int) -> tuple[str, bytes | None] | None:
        row = self.rows.get(spool_id)
        if row is None:
            return None
        return row.queue, None if "@" in row.queue else row.envelope

    def body(self, body_id: int) -> bytes:
        return self.bodies[body_id]

    def stored_body(self, body_id: int) -> bytes:
        return self.bodies[body_id]

    def scan(self, after: int, limit: int) -> list[Message]:
        return [self._message(i, self.rows[i]) for i in sorted(self.rows) if i > after][:limit]

    def queue_counts(self, now: float, held: float) -> list[tuple[str, int, int, int, float, int, int, float | None]]:
        counts: dict[str, list[float]] = {}
        nexts: dict[str, float] = {}
        for spool_id, row in self.rows.items():
            entry = counts.setdefault(row.queue, [0, 0, 0, row.created, spool_id, 0])
            entry[0] += 1
            entry[1] += row.due <= now
            entry[2] += row.due >= held
            entry[3] = min(entry[3], row.created)
            entry[4] = min(entry[4], spool_id)
            if now < row.due < held:
                entry[5] += 1
                nexts[row.queue] = min(nexts.get(row.queue, row.due), row.due)
        return [
            (q, int(c[0]), int(c[1]), int(c[2]), c[3], int(c[4]), int(c[5]), nexts.get(q)) for q, c in counts.items()
        ]

    def rules(self) -> list[tuple[str, bytes]]:
        return list(self.saved_rules.items())

    def outbox(self, seqs: Sequence[int] | None = None) -> list[tuple[int, bytes]]:
        return []

    # --- writes (pending until released) -------------------------------------------------------
    def settle(
        self,
        message: Message,
        remaining: Envelope | None,
        *,
        attempts: int,
        due: float,
        records: Sequence[tuple[int, bytes]] = (),
        queue: str | None = None,
    ) -> asyncio.Future[None]:
        apply = self.settling(Settling(message, remaining, attempts, due, records, queue))
        return self._world.commit(f"settle {message.id:x}", apply, message=message.id)

    def settling(self, outcome: Settling) -> Callable[[], None]:
        """What committing `outcome` does to the rows (alone, or with the DSN that reports it)."""
        spool_id, remaining, records = outcome.message.id, outcome.remaining, outcome.records
        attempts, due, queue = outcome.attempts, outcome.due, outcome.queue

        def apply() -> None:
            row = self.rows.get(spool_id)
            if row is None:
                return
            if remaining is None:
                del self.rows[spool_id]
                left = self.refs.get(row.body, 1) - 1
                if left <= 0:
                    self.bodies.pop(row.body, None)
                    self.refs.pop(row.body, None)
                else:
                    self.refs[row.body] = left
            else:
                row.attempts, row.due, row.envelope = attempts, due, _ENCODER.encode(remaining)
                if queue is not None:
                    row.queue = queue
            self._world.outbox_landed(records)

        return apply

    def rewrite_envelope(self, spool_id: int, envelope: Envelope, *, attempts: int) -> asyncio.Future[None]:
        def apply() -> None:
            row = self.rows.get(spool_id)
            if row is not None and row.attempts == attempts:
                row.envelope = _ENCODER.encode(envelope)

        # (A message's second mark, its first answered or not, is an option of its own: a hold
        # after a rebind, each written while an attempt was on the wire.)
        self.marks[spool_id] += 1
        again = f"#{self.marks[spool_id]}" if self.marks[spool_id] > 1 else ""
        return self._world.commit(f"mark {spool_id:x}{again}", apply, message=spool_id)

    def make_due(self, rows: Sequence[tuple[int, float]], due: float) -> asyncio.Future[int]:
        def apply() -> int:
            changed = 0
            for spool_id, read in rows:
                row = self.rows.get(spool_id)
                if row is not None and row.due == read and row.due > due:  # (as SqliteSpool's)
                    row.due = due
                    changed += 1
            return changed

        return self._world.commit(f"make_due {len(rows)}", apply)

    def save_rule(self, rule_id: str, rule: bytes | None) -> asyncio.Future[None]:
        def apply() -> None:
            if rule is None:
                self.saved_rules.pop(rule_id, None)
            else:
                self.saved_rules[rule_id] = rule

        return self._world.commit(f"rule {rule_id}", apply)

    def outbox_written(self, seqs: Sequence[int]) -> asyncio.Future[None]:
        raise NotImplementedError

    def outbox_add(self, records: Sequence[tuple[int, bytes]]) -> asyncio.Future[None]:
        raise NotImplementedError

    def _message(self, spool_id: int, row: _Row) -> Message:
        return Message(
            id=SpoolId(spool_id),
            queue=row.queue,
            envelope=_DECODER.decode(row.envelope),
            created=row.created,
            size=row.size,
            body_id=SpoolId(row.body),
            attempts=row.attempts,
            due=row.due,
        )


def _cancel(admin: Admin, *, rule_id: str, kind: str) -> Awaitable[dict[str, Any]]:
    return admin.cancel(rule_id, kind)


def _copy(done: asyncio.Future[None], future: asyncio.Future[object]) -> None:
    error = done.exception()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(None)


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Envelope)


# --- records -------------------------------------------------------------------------------------
class Records:
    """The outbox and the log: terminal records appear once their commit is answered."""

    def __init__(self, world: World) -> None:
        self._world = world
        self._sealed: dict[int, Record] = {}
        self._seq = itertools.count(1)
        self.log: list[Record] = []

    def seal(self, spool: Any, records: Sequence[Record]) -> list[tuple[int, bytes]]:
        sealed = []
        for record in records:
            seq = next(self._seq)
            self._sealed[seq] = record
            sealed.append((seq, b""))
        return sealed

    def committed(self, spool: Any, sealed: Sequence[tuple[int, bytes]]) -> None:
        for seq, _ in sealed:
            self.log.append(self._sealed.pop(seq))

    def write(self, record: Record) -> int:
        self.log.append(record)
        return 0


# --- routes and agents -----------------------------------------------------------------------------
def destination(site: str) -> Destination:
    return Destination(site, (), TlsPolicy.DISABLED, False, Kind.SMTP)


class FakeRoutes:
    """Every lookup waits for the test. `sites` maps a routing domain to its site; a domain
    not in it is unroutable (550)."""

    def __init__(self, world: World, sites: dict[str, str]) -> None:
        self._world = world
        self.sites = sites
        self.cache: dict[str, Destination] = {}

    def cached(self, domain: str, target: str | None = None) -> Destination | None:
        return self.cache.get(domain)

    def reserved_for(self, domain: str) -> frozenset[str] | None:
        return None

    async def destination(self, domain: str, target: str | None = None) -> Destination:
        future: asyncio.Future[Destination] = asyncio.get_running_loop().create_future()

        def release() -> None:
            site = self.sites.get(domain)
            if site is None:
                future.set_exception(Unroutable(Reply(550, "5.1.2", (f"{domain}: no such domain",)), "DNSFailure"))
            else:
                future.set_result(destination(site))

        self._world.add(Pending("lookup", domain, release, domain=domain, site=self.sites.get(domain)))
        return await future


@dataclass
class Attempted:
    """An attempt an agent began: what a receiving server would have seen."""

    step: int
    message: SpoolId
    recipients: tuple[str, ...]
    site: str
    replies: tuple[Reply, ...] = ()


class FakeAgent:
    batch = 1
    separately = False

    def __init__(self, world: World, site: str) -> None:
        self._world = world
        self._site = site

    def usable(self) -> bool:
        return True

    async def deliver(self, work: Sequence[Work]) -> list[Attempt]:
        return [await self._one(item) for item in work]

    async def _one(self, work: Work) -> Attempt:
        world = self._world
        recipients = tuple(r.address for r in work.message.envelope.recipients)
        seen = Attempted(world.steps, work.message.id, recipients, self._site)
        world.attempted.append(seen)
        future: asyncio.Future[list[Reply]] = asyncio.get_running_loop().create_future()

        def release() -> None:
            future.set_result(world.answer(world, seen))

        label = f"{work.message.id:x}@{self._site}"
        world.add(Pending("attempt", label, release, message=work.message.id, site=self._site))
        replies = await future
        seen.replies = tuple(replies)
        classes = ["NoSuchUser" if reply.code >= 500 else "" for reply in replies]
        return Attempt(replies, classes, self._site, f"{self._site} [127.0.0.1]:25")

    async def close(self) -> None:
        pass

    def final(self) -> list[Attempt]:
        return []


# --- the world --------------------------------------------------------------------------------------
@dataclass
class AdminCall:
    name: str
    started: int
    answered: int | None = None
    result: dict[str, Any] | None = None
    selector: Selector | None = None


@dataclass
class World:
    """See the module docstring. Build with `await World.build(...)`."""

    clock: FakeClock = field(default_factory=FakeClock)
    dsn: bool = True
    retry_interval: float = 300.0
    max_age: float = 86_400.0
    delay_warning: float = 0.0
    connection_limit: int = 2
    max_active: int = 10_000
    shaping: Shaping | None = None
    """The dispatcher's limits (default: `connection_limit`, idle for an hour)."""
    throttles: Throttles | None = None
    """Where the dispatcher asks for connection slots and message slots (default: in memory)."""
    reactor: Reactor | None = None
    """Shaping that reacts to the replies (default: none)."""
    site_retry_interval: float = 60.0
    """Until the first probe of a site found down (then twice as long, up to 10 times this)."""
    opener: Callable[[Destination, str | None], Awaitable[Agent]] | None = None
    """Opens agents instead of `FakeAgent` (to fail, or to be a real agent)."""
    answer: Callable[[World, Attempted], list[Reply]] = field(default=lambda world, seen: [OK] * len(seen.recipients))
    """What the receiving server says to an attempt (the test's script)."""

    pending: list[Pending] = field(default_factory=list)
    attempted: list[Attempted] = field(default_factory=list)
    admin_calls: list[AdminCall] = field(default_factory=list)
    notices: list[tuple[SpoolId, str]] = field(default_factory=list)
    reported: list[Failure] = field(default_factory=list)  # what each stored DSN says, as notices
    opened: list[str] = field(default_factory=list)
    """The site of every `FakeAgent` opened (a connection, to the dispatcher)."""
    steps: int = 0
    landed: list[int] = field(default_factory=list)
    """The outbox seqs of the records of every commit that landed."""
    failing_notices: int = 0
    """How many of the next DSN stores fail."""
    failing_commits: int = 0
    """How many of the next commits to land fail (nothing written, the future raises)."""
    rules_cancelled_at: int = 1 << 62
    """The step at which `drain` cancelled the standing rules."""
    _order: itertools.count[int] = field(default_factory=itertools.count)
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.spool = MemorySpool(self)
        self.records = Records(self)
        self.routes = FakeRoutes(self, {})
        retry = RetryPolicy(self.retry_interval, self.retry_interval * 4, self.max_age, 0.0)
        policy = QueuePolicy(retry, self.dsn, delay_warning=self.delay_warning)
        self.policies = QueuePolicies(policy)
        self.spools = Spools([self.spool])

    def build(self, sites: dict[str, str]) -> World:
        """Wire the engine (inside a running loop)."""
        self.routes.sites = sites
        shaping = self.shaping or Shaping(connection_limit=self.connection_limit, idle_timeout=3600.0)
        engine = build_engine(
            spools=self.spools,
            primary=self.spool,
            log=self.records,
            outbox=self.records,
            counts=Counts(),
            policies=self.policies,
            routes=self.routes,
            agents={Kind.SMTP: self.opener or self._open, Kind.TARGET: self.opener or self._open},
            shaping=lambda query: shaping,
            body=lambda message: self.spool.body(message.body_id),
            notifier=self._notify,
            max_active=self.max_active,
            throttles=self.throttles,
            reactor=self.reactor,
            sites=SiteHealth(self.site_retry_interval, self.site_retry_interval * 10, clock=self.clock),
            clock=self.clock,
            pause=lambda seconds: asyncio.sleep(0),
        )
        self.active, self.settlement, self.rules = engine.active, engine.settlement, engine.rules
        self.dispatcher, self.scheduler, self.admin = engine.dispatcher, engine.scheduler, engine.admin
        self.ready = engine.ready
        return self

    async def _open(self, destination: Destination, source: str | None = None) -> Agent:
        self.opened.append(destination.site)
        return FakeAgent(self, destination.site)

    # --- the fakes' side ---------------------------------------------------------------------------
    def add(self, pending: Pending) -> None:
        pending.order = next(self._order)
        self.pending.append(pending)

    def commit(self, label: str, apply: Callable[[], _T], message: int | None = None) -> asyncio.Future[_T]:
        future: asyncio.Future[_T] = asyncio.get_running_loop().create_future()

        def land() -> None:
            if self.failing_commits:
                self.failing_commits -= 1
                error = SpoolWriteError("spool write failed: disk I/O error (a test's)")
                self.add(Pending("answer", label, lambda: future.set_exception(error), message=message))
                return
            result = apply()
            self.add(Pending("answer", label, lambda: future.set_result(result), message=message))

        self.add(Pending("land", label, land, message=message))
        return future

    def outbox_landed(self, records: Sequence[tuple[int, bytes]]) -> None:
        # Records reach the log when the commit is answered (Records.committed); those of a
        # commit that landed and was not answered are logged at the next start (`restarted`).
        self.landed.extend(seq for seq, _ in records)

    def _notify(self, message: Message, failures: list[Failure], settles: Settling) -> asyncio.Future[object]:
        """A DSN: written (a "dsn" completion: the report built, maybe signed), then stored
        in one commit with the outcome it reports, as the intake does."""
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        settle = self.spools.of(message.id).settling(settles)  # type: ignore[attr-defined]

        def release() -> None:
            if self.failing_notices:
                self.failing_notices -= 1
                future.set_exception(SpoolWriteError("DSN not stored: disk full (a test's)"))
                return

            def apply() -> None:
                for failure in failures:
                    self.notices.append((message.id, failure.recipient.address))
                    self.reported.append(failure)
                settle()

            stored = self.commit(f"dsn+settle {message.id:x}", apply, message=message.id)
            stored.add_done_callback(lambda done: _copy(done, future))

        self.add(Pending("dsn", f"{message.id:x}", release, message=message.id))
        return future

    # --- the test's side -----------------------------------------------------------------------------
    def inject(
        self,
        recipients: Sequence[str],
        *,
        campaign: str | None = None,
        tenant: str | None = None,
        sender: str = "sender@origin.test",
        created: float | None = None,
        due: float | None = None,
        admit: bool = True,
        target: str | None = None,
    ) -> SpoolId:
        """A message as the intake stores it (one domain, or an `[[inbound]]` route's `target`:
        routed here by its domain all the same), then hands it to the scheduler (`admit`;
        otherwise it waits in the spool until a tick reads it)."""
        domain = recipients[0].rpartition("@")[2]
        queue = f"{campaign}:{domain}" if campaign else domain
        if tenant:
            queue = scheduled_queue(domain, tenant, campaign)
        queue = f"inbound:{target}" if target is not None else queue
        envelope = Envelope(sender, [Recipient(r) for r in recipients], campaign=campaign, tenant=tenant, target=target)
        spool_id = self.spool.new_ids(1)[0]
        created = self.clock() if created is None else created
        message = self.spool.put(spool_id, queue, envelope, created, b"Subject: x\r\n\r\nbody\r\n", due)
        if admit:
            self.scheduler.admit([message])
        return spool_id

    def of_kind(self, kind: str) -> list[Pending]:
        return sorted((p for p in self.pending if p.kind == kind), key=lambda p: p.order)

    async def release_all(self, kind: str | None = None, *, but: str | None = None) -> None:
        """Release what is pending (of one kind, or all `but` one kind), oldest first, until
        none is left."""
        await self.quiesce()
        while batch := [p for p in self.pending if (kind is None or p.kind == kind) and p.kind != but]:
            await self.release(min(batch, key=lambda p: p.order))

    def logged(self, kind: str | None = None) -> list[Any]:
        return [r for r in self.records.log if kind is None or type(r).__name__ == kind]

    def tick(self) -> None:
        """The scheduler's tick: load what is due, expire what waited too long."""
        self.scheduler.load()
        self.scheduler.sweep()

    def due_waiting(self) -> bool:
        """Whether a row is due and not in memory (a tick would load it)."""
        now = self.clock()
        return any(row.due <= now and spool_id not in self.active for spool_id, row in self.spool.rows.items())

    def start_admin(self, name: str, call: Callable[[Admin], Awaitable[dict[str, Any]]]) -> AdminCall:
        record = AdminCall(name, self.steps)
        self.admin_calls.append(record)

        async def run() -> None:
            record.result = await call(self.admin)
            record.answered = self.steps

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return record

    def bounce(self, selector: Selector, *, duration: float | None = None, reason: str = "r") -> AdminCall:
        return self.start_admin(
            "bounce", lambda a: a.bounce(selector, reason=reason, operator="op", duration=duration, rule_id=None)
        )

    def suspend(self, selector: Selector, *, rule_id: str = "hold", duration: float | None = None) -> AdminCall:
        return self.start_admin(
            "suspend", lambda a: a.suspend(selector, reason="", operator="op", duration=duration, rule_id=rule_id)
        )

    def resume(self, rule_id: str = "hold") -> AdminCall:
        return self.start_admin("resume", lambda a: a.cancel(rule_id, "suspend"))

    def rebind(self, selector: Selector, *, queue: str | None = None, routing_domain: str | None = None) -> AdminCall:
        return self.start_admin(
            "rebind", lambda a: a.rebind(selector, queue=queue, routing_domain=routing_domain, operator="op")
        )

    def reroute(self, domain: str, site: str) -> int:
        """A reload's new [[route]]: `domain`'s mail goes to `site` now (lookups answer so),
        and what waits for its old route is routed again: how many messages were."""
        self.routes.sites = {**self.routes.sites, domain: site}
        self.routes.cache.pop(domain, None)
        return self.scheduler.reroute(lambda routed, target: routed == domain and target is None)

    def admin_running(self) -> bool:
        return any(call.answered is None for call in self.admin_calls)

    async def release(self, pending: Pending) -> None:
        self.pending.remove(pending)
        self.steps += 1
        pending.release()
        await self.quiesce()

    async def quiesce(self) -> None:
        """Run the loop until nothing is runnable (no timer of the engine's is ever due)."""
        loop = asyncio.get_running_loop()
        ready: collections.deque[Any] = loop._ready  # type: ignore[attr-defined]
        idle = 0
        for _ in range(10_000):
            await asyncio.sleep(0)
            idle = idle + 1 if not ready else 0
            if idle >= 2:
                break
        for task in list(self._tasks):
            if task.done() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def drain(self, *, max_steps: int = 2000) -> None:
        """Release everything, oldest first, cancel every standing rule and let time pass
        until the spool is empty: every message reaches its end."""
        for step in range(max_steps):
            await self.quiesce()
            if self.pending:
                await self.release(min(self.pending, key=lambda p: p.order))
                continue
            if self.admin_running():
                raise AssertionError("an admin operation waits for nothing the world holds")
            for rule in list(self.rules):
                self.rules_cancelled_at = min(self.rules_cancelled_at, self.steps)
                self.start_admin("cancel", functools.partial(_cancel, rule_id=rule.id, kind=rule.kind))
                await self.quiesce()
                break
            else:
                if self.due_waiting():
                    self.tick()
                elif self.spool.rows:
                    self.clock.now = min(row.due for row in self.spool.rows.values()) + 0.001
                    self.tick()
                elif not len(self.active):
                    return
                else:
                    raise AssertionError(f"messages stuck in memory: {list(self.active)}")
            del step
        raise AssertionError(f"not drained after {max_steps} steps: {self.pending} {list(self.active)}")

    async def restarted(self, sites: dict[str, str], *, stop: bool) -> World:
        """This world's node stopped (`stop`: SIGTERM, which commits what it submitted, and
        cuts the attempts on the wire before their content went, reporting none) or died
        (kill -9: whatever had not landed is lost), then started again over the same spool: a
        new engine, its records those that were logged plus those of commits that landed
        unanswered (the outbox's, logged at start; notes such as `AdminHold` are lost so, as
        the README says). What the servers saw stays seen. The new world has loaded nothing."""
        if stop:
            while landing := [p for p in self.pending if p.kind in ("land", "answer")]:
                await self.release(min(landing, key=lambda p: p.order))
        await self.close()  # (the cut attempts report nothing: `FakeAgent.final`)
        self.pending.clear()
        replayed = [self.records._sealed.pop(seq) for seq in self.landed if seq in self.records._sealed]
        after = World(
            clock=self.clock, dsn=self.dsn, retry_interval=self.retry_interval, max_age=self.max_age, answer=self.answer
        )
        after.spool.rows, after.spool.bodies, after.spool.refs = self.spool.rows, self.spool.bodies, self.spool.refs
        after.spool.saved_rules = self.spool.saved_rules
        after.records.log = [*self.records.log, *replayed]
        after.attempted, after.notices, after.reported = list(self.attempted), list(self.notices), list(self.reported)
        return after.build(sites)

    async def close(self) -> None:
        await self.dispatcher.drain(0)
        for task in list(self._tasks):
            task.cancel()

    # --- what a user sees -------------------------------------------------------------------------------
    def terminal(self) -> dict[tuple[str, str], list[str]]:
        """(message id, recipient) -> the terminal records it got, in order."""
        found: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
        for record in self.records.log:
            kind = type(record).__name__
            if kind in TERMINAL:
                found[(record.id, record.recipient)].append(kind)  # type: ignore[attr-defined]
        return found

    def accepted(self) -> collections.Counter[tuple[SpoolId, str]]:
        """How often each (message, recipient) was accepted by a receiving server."""
        counted: collections.Counter[tuple[SpoolId, str]] = collections.Counter()
        for seen in self.attempted:
            for recipient, reply in zip(seen.recipients, seen.replies, strict=False):
                if reply.code < 300:
                    counted[(seen.message, recipient)] += 1
        return counted
