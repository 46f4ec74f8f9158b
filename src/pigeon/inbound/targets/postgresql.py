"""PostgreSQL: a job row per message, `ON CONFLICT (dedupe_key) DO NOTHING`.

Besides the raw bytes, a row has the message's Subject, From and To decoded to text
(`subject`, `from_header`, `to_header`), where the table has those columns.

The unique dedupe key is the fence (Kleppmann's term): whatever arbitration let through twice,
the table holds one row per message. A batch is one `executemany` in one transaction, its rows in
dedupe key order (so that two nodes' batches of the same messages never deadlock; a deadlock or
serialization failure all the same is tried again at once, `_CONFLICTED`). Every
database error is "later": a missing table or a failover must not send mail to the failed
folder. Except a row the database refuses for what it holds (class 22, a NUL byte in text) or for
a constraint of the table's (class 23: a NOT NULL, a CHECK, a UNIQUE other than dedupe_key's, a
foreign key, on a table the operator made): that batch goes in row by row, the others' rows are
committed, and the refused one is a permanent failure for its message (said in one line, without
PostgreSQL's `DETAIL: Failing row contains (...)`, the whole row, raw message and all).

A pooled connection the server dropped (PostgreSQL restarted, while this node was stopped or
idle) fails the first batch that uses it, with whatever state asyncpg's protocol was left in
("cannot switch to state 15; another operation (2) is in progress"): it is terminated, so the
pool connects afresh for the next batch, and the handoff says plainly that the connection was
lost (`ConnectionLost`).

Nodes that start together on a new database each find the table missing, and each makes it
(`_create_table`): one at a time, behind a transaction-scoped advisory lock, each looking again
once it holds the lock; a creator that takes no such lock (an earlier version, the application)
and wins the race is taken for what it is: the table is there. Two `CREATE TABLE IF NOT EXISTS`
at once otherwise both find no table, and the second fails on the catalog's unique index
(`pg_class_relname_nsp_index`), which would be said as an outage.

What was learnt of the table (made, its columns) holds until the table changes under the node:
dropped (`42P01`), or replaced by one of other columns, an older Pigeon's without the decoded
header columns (`42703`). Such a batch forgets it all and tries once more (`_forget`): the table
is made again (create_table = true) or said missing with what to do (false), its columns learnt
again, and the waiting mail goes in without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Final, NoReturn

import asyncpg

from pigeon.config.schema import PostgresqlTarget as PostgresqlConfig
from pigeon.inbound.headers import decoded as decoded_fields
from pigeon.inbound.headers import header_fields
from pigeon.inbound.message import InboundMessage, header_block
from pigeon.inbound.targets.base import Handoff, Target, Verdict
from pigeon.redaction import redact

_log = logging.getLogger(__name__)


def create_table_sql(table: str) -> str:
    """The table `create_table` makes. The README prints it, for those who make it themselves
    (a test keeps the two the same: change both)."""
    return f"""
        CREATE TABLE IF NOT EXISTS {table} (
            id          bigserial PRIMARY KEY,
            dedupe_key  text NOT NULL UNIQUE,
            message_id  text,
            source      text NOT NULL,
            mailbox     text,
            uid         bigint,
            sender      text,
            recipients  text[],
            raw         bytea NOT NULL,
            subject     text,
            from_header text,
            to_header   text,
            received_at timestamptz NOT NULL,
            created_at  timestamptz NOT NULL DEFAULT now(),
            status      text NOT NULL DEFAULT 'pending'
        )"""


# The columns every row is inserted with, in the order of `_row`.
_COLUMNS: Final = ("dedupe_key", "message_id", "source", "mailbox", "uid", "sender", "recipients", "raw", "received_at")
# The decoded header fields (`InboundMessage.metadata`) and the columns that hold them. A table
# made before they existed has none of them: its rows go in without them, as before.
_DECODED_COLUMNS: Final = {"subject": "subject", "from": "from_header", "to": "to_header"}

# What the role lacks, of what the insert needs, on an existing table: INSERT on the columns it
# names; SELECT on dedupe_key, which ON CONFLICT (dedupe_key) reads (PostgreSQL asks for it,
# though no row is returned); USAGE (or UPDATE) on each sequence the default of a column it
# leaves out draws from (bigserial's id; an identity column needs none). A table made with
# LIKE ... INCLUDING DEFAULTS draws from the other table's sequence: that one is named.
_LACKING_SQL: Final = """
    WITH t AS (SELECT to_regclass($1) AS oid)
    SELECT
        (SELECT coalesce(array_agg(a.attname::text ORDER BY a.attnum), '{}') FROM pg_attribute a, t
          WHERE a.attrelid = t.oid AND a.attname = ANY($2::text[]) AND NOT a.attisdropped
            AND NOT has_column_privilege(t.oid, a.attnum, 'INSERT')) AS insert,
        (SELECT coalesce(array_agg(a.attname::text ORDER BY a.attnum), '{}') FROM pg_attribute a, t
          WHERE a.attrelid = t.oid AND a.attname = 'dedupe_key' AND NOT a.attisdropped
            AND NOT has_column_privilege(t.oid, a.attnum, 'SELECT')) AS "select",
        (SELECT coalesce(array_agg(DISTINCT s.oid::regclass::text), '{}')
           FROM pg_attrdef ad JOIN t ON ad.adrelid = t.oid
           JOIN pg_attribute a ON a.attrelid = ad.adrelid AND a.attnum = ad.adnum
           JOIN pg_depend d ON d.classid = 'pg_attrdef'::regclass AND d.objid = ad.oid
                           AND d.refclassid = 'pg_class'::regclass
           JOIN pg_class s ON s.oid = d.refobjid AND s.relkind = 'S'
          WHERE NOT a.attisdropped AND a.attname <> ALL($2::text[])
            -- (guarded: the planner may ask before it joins, of a relation that is no sequence)
            AND CASE WHEN s.relkind = 'S' THEN NOT has_sequence_privilege(s.oid, 'USAGE, UPDATE') END) AS sequences,
        quote_ident(current_user) AS role"""

# What a connection in hand fails with when the server dropped it: gone (or shut down), or the
# protocol left mid-operation by a message it never finished reading. Never a timeout: the
# server is slow then, not gone.
_LOST: Final = (
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.InternalClientError,
    ConnectionError,
)


# What a CREATE TABLE fails with when another session made the table (or its sequence, or its
# row type) between our look and our CREATE: `IF NOT EXISTS` looks before it locks anything.
_MADE_MEANWHILE: Final = (
    asyncpg.exceptions.UniqueViolationError,
    asyncpg.exceptions.DuplicateTableError,
    asyncpg.exceptions.DuplicateObjectError,
)


# What an insert fails with when the table changed since it was learnt: dropped (42P01), made
# again with other columns (42703), or with another type for a column a statement reads
# (asyncpg's cached statement then no longer fits: 0A000). Learning it again may mend all three.
_CHANGED: Final = (
    asyncpg.exceptions.UndefinedTableError,
    asyncpg.exceptions.UndefinedColumnError,
    asyncpg.exceptions.InvalidCachedStatementError,
)


# What a row is refused with for good, whenever it is tried: its values (class 22) or a constraint
# of the table's (class 23). A unique violation is one on another UNIQUE than dedupe_key's (ON
# CONFLICT (dedupe_key) takes those): a different message with, say, the same Message-ID where
# the operator made message_id unique. Its message is not the one in the table, so not "already
# there": it is refused, and goes where refused mail goes (failed_folder), not silently dropped.
# (A copy of the same message that another node commits meanwhile, and that trips that other
# constraint first, is the row tried alone: ON CONFLICT finds it then, "already in".)
_REFUSED_ROW: Final = (asyncpg.DataError, asyncpg.IntegrityConstraintViolationError)

# What an insert's transaction fails with when another transaction's locks crossed its own: a
# deadlock (40P01) or a serialization failure (40001). The transaction was rolled back, and the
# same batch goes in if tried again (PostgreSQL's own advice), so it is, at once, this many times
# more, before it is said as the database refusing it for now.
_CONFLICTED: Final = (asyncpg.exceptions.DeadlockDetectedError, asyncpg.exceptions.SerializationError)
_CONFLICT_RETRIES: Final = 3


def _dedupe_key(row: tuple[object, ...]) -> str:
    """A row's dedupe key (its first column), the order a batch's rows are inserted in."""
    return str(row[0])


# The longest a database error is said, in a handoff's detail (and so in /healthz).
_SAID_AT_MOST: Final = 300


def _said(error: BaseException) -> str:
    """A database error in one line of bounded length: its message and SQLSTATE. Not its
    DETAIL, which for a NOT NULL or CHECK is `Failing row contains (...)`: the whole row, the
    raw message as hex, after a line break."""
    if isinstance(error, asyncpg.PostgresError):
        text = f"{error.message} (SQLSTATE {error.sqlstate})"
    else:
        text = str(error) or type(error).__name__
    text = " ".join(text.split())
    return text if len(text) <= _SAID_AT_MOST else f"{text[: _SAID_AT_MOST - 3]}..."


# What to do about a table that is missing, with create_table = false.
_CREATE_IT: Final = "create it (its columns: see the PostgreSQL target in the README), or set create_table = true"


def _creation_lock(table: str) -> int:
    """The advisory lock (a bigint, per database) that every node making `table` takes."""
    return int.from_bytes(hashlib.sha256(f"pigeon create_table {table}".encode()).digest()[:8], "big", signed=True)


def _closed(connection: asyncpg.Connection) -> bool:
    try:
        return bool(connection.is_closed())
    except asyncpg.exceptions.InterfaceError:  # closed, and given back to the pool already
        return True


def _lost(connection: asyncpg.Connection, error: Exception) -> bool:
    """Whether `error`, raised while `connection` was in use, says the connection is dead."""
    if isinstance(error, _LOST) or _closed(connection):
        return True
    # The same broken protocol state, as the connection (not the protocol) words it.
    return isinstance(error, asyncpg.exceptions.InterfaceError) and "another operation is in progress" in str(error)


class ConnectionLost(Exception):
    """A pooled connection turned out dead; it was discarded (the next batch connects afresh)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__("the connection was lost (PostgreSQL restarted?); reconnecting")
        self.error = error


class TimedOut(Exception):
    """Connecting, or a statement, took longer than the target's `timeout`: says which, and
    what most often holds an insert that long."""

    def __init__(self, config: PostgresqlConfig, *, connected: bool) -> None:
        limit = f"timeout = {config.timeout:g}s of target {config.name}"
        if connected:
            super().__init__(
                f"a statement got no answer within {limit}: a lock on table {config.table} may be holding it "
                "(a transaction that holds one, LOCK TABLE, ALTER TABLE: see pg_locks)"
            )
        else:
            super().__init__(f"no connection within {limit}")


class TableMissing(Exception):
    """The table is not there, and the target may not make it (create_table = false); says what to do."""


class NotPermitted(Exception):
    """The database refused the insert for want of a privilege; says which GRANTs give it."""


def _grants(table: str, role: str, *, insert: bool, select: bool, sequences: Sequence[str]) -> str:
    """The GRANT statements that give `role` what it lacks to insert rows as this target does."""
    privileges = (["INSERT"] if insert else []) + (["SELECT (dedupe_key)"] if select else [])
    statements = [f"GRANT {', '.join(privileges)} ON {table} TO {role}"] if privileges else []
    statements += [f"GRANT USAGE ON SEQUENCE {sequence} TO {role}" for sequence in sequences]
    return "; ".join(statements)


class PostgresqlTarget(Target):
    kind = "postgresql"
    batches = True

    def __init__(self, config: PostgresqlConfig) -> None:
        super().__init__(config.name)
        self._config = config
        self._pool: asyncpg.Pool | None = None
        self._connecting = asyncio.Lock()
        self._decoded: bool | None = None  # whether the table has the decoded header columns (None: not known yet)
        self._prepared = False  # the table made if it was missing
        self._checked = False  # whether the table was checked for (and our right to insert into it)
        self._preparing = asyncio.Lock()
        self._outage: str | None = None  # what the database last failed with, while it fails
        self._changed: str | None = None  # the change to the table last said, until a batch goes in
        self._insert = self._insert_sql(decoded=False)

    def _columns(self) -> tuple[str, ...]:
        """The columns the insert names, as far as the table's are known."""
        return _COLUMNS + (tuple(_DECODED_COLUMNS.values()) if self._decoded else ())

    def _insert_sql(self, *, decoded: bool) -> str:
        columns = _COLUMNS + (tuple(_DECODED_COLUMNS.values()) if decoded else ())
        values = ", ".join(f"${n}" for n in range(1, len(columns) + 1))
        return (f"INSERT INTO {self._config.table} ({', '.join(columns)}) VALUES ({values}) "
                "ON CONFLICT (dedupe_key) DO NOTHING")  # fmt: skip

    async def _learn_columns(self, connection: asyncpg.Connection) -> None:
        """Whether the table has the decoded header columns: asked once it exists."""
        if self._decoded is not None:
            return
        names = await connection.fetch(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped",
            self._config.table,
        )
        if not names:
            return  # no table yet (create_table = false): the insert says so
        present = {row["attname"] for row in names}
        self._decoded = set(_DECODED_COLUMNS.values()) <= present
        self._insert = self._insert_sql(decoded=self._decoded)
        if not self._decoded:
            _log.info(
                "target %s: table %s has no %s columns: rows go in without the decoded header fields "
                "(ALTER TABLE %s ADD COLUMN subject text, ADD COLUMN from_header text, ADD COLUMN to_header text)",
                self.name, self._config.table, "/".join(_DECODED_COLUMNS.values()), self._config.table,
            )  # fmt: skip

    async def _connect(self) -> asyncpg.Pool:
        """The pool, made once. With no connection in it until one is needed (min_size 0):
        making it never fails for a database that is down, so neither does start-up."""
        async with self._connecting:  # one pool, however many deliveries ask at once
            if self._pool is None:
                config = self._config
                self._pool = await asyncpg.create_pool(
                    config.dsn,
                    min_size=0,
                    max_size=config.pool_size,
                    timeout=config.timeout,
                    command_timeout=config.timeout,
                )
            return self._pool

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[asyncpg.Connection]:
        """A connection from the pool; one that turns out dead is terminated, so that the pool
        does not hand it out again, and `ConnectionLost` raised."""
        pool = await self._connect()
        connected = False
        try:
            async with pool.acquire() as connection:
                connected = True
                try:
                    yield connection
                except Exception as error:
                    if not _lost(connection, error):
                        raise
                    if not _closed(connection):  # (a closed one went back to the pool, to be replaced)
                        connection.terminate()
                    _log.debug("target %s: connection to PostgreSQL discarded: %r", self.name, error)
                    raise ConnectionLost(error) from error
        except TimeoutError as error:
            raise TimedOut(self._config, connected=connected) from error

    async def _prepare(self, connection: asyncpg.Connection) -> None:
        """The table made if missing (and allowed), its columns learnt: on the first
        connection that works, not at start, when the database may be down."""
        config = self._config
        if (self._prepared or not config.create_table) and self._decoded is not None and self._checked:
            return
        async with self._preparing:  # one CREATE, however many mailboxes share the target
            if config.create_table and not self._prepared:
                # Only when missing: CREATE ... IF NOT EXISTS needs the CREATE privilege even
                # when the table exists, which a role that may only insert into the
                # application's table lacks (PostgreSQL 15+ default).
                if await connection.fetchval("SELECT to_regclass($1)", config.table) is None:
                    await self._create_table(connection)
                self._prepared = True
            await self._learn_columns(connection)  # first: the columns inserted are those checked
            if not self._checked:
                await self._check_table(connection)

    async def _create_table(self, connection: asyncpg.Connection) -> None:
        """Make the table, which was missing a moment ago: other nodes may be making it at the
        same time (they started together on a new database). The advisory lock (which needs no
        privilege) lets one make it at a time, and each looks again once it holds it; one that
        made it without the lock, between our look and our CREATE, made it all the same."""
        table = self._config.table
        try:
            async with connection.transaction():
                await connection.execute("SELECT pg_advisory_xact_lock($1)", _creation_lock(table))
                if await connection.fetchval("SELECT to_regclass($1)", table) is None:
                    await connection.execute(create_table_sql(table))
        except _MADE_MEANWHILE:
            if await connection.fetchval("SELECT to_regclass($1)", table) is None:
                raise
            _log.debug("target %s: table %s was made by another node meanwhile", self.name, table)

    async def _check_table(self, connection: asyncpg.Connection) -> None:
        """Whether the table exists and we may insert into it, asked on the first connection
        that works (at start, unless the database is down then): without this a table nobody
        made (create_table = false) or a missing GRANT is first heard of when mail arrives. Said
        as an ERROR and kept as the target's `problem` until a batch goes in; the node runs on
        (the table may be made later)."""
        table = self._config.table
        exists = await connection.fetchval("SELECT to_regclass($1) IS NOT NULL", table)
        self._checked = True
        if not exists:
            self.problem, fix = self._no_table(), _CREATE_IT
        else:
            lacking = await self._lacking(connection)
            if lacking is None:
                return
            self.problem, fix = self._not_ours(*lacking)
        _log.error("target %s: %s: messages wait unacknowledged at their source until it can; %s", self.name,
                   self.problem, fix)  # fmt: skip

    def _no_table(self) -> str:
        """The target's `problem` when its table is missing and it may not make it."""
        where = f"PostgreSQL at {redact(self._config.dsn)}"
        return f"table {self._config.table} does not exist in {where} (create_table = false)"

    async def _lacking(self, connection: asyncpg.Connection) -> tuple[str, str, str] | None:
        """(the role, what it lacks to run the insert, the GRANTs that give it), or None when
        it lacks nothing (or there is no table). Each privilege the statement needs is asked
        for, not INSERT alone: without SELECT on dedupe_key the role may insert rows, but not
        with ON CONFLICT, and every batch would fail."""
        table, columns = self._config.table, self._columns()
        insert, select, sequences, role = await connection.fetchrow(_LACKING_SQL, table, list(columns))
        lacks = []
        if insert:  # (on some columns only: column privileges)
            lacks.append("INSERT" if len(insert) == len(columns) else f"INSERT on {', '.join(insert)}")
        if select:
            lacks.append("SELECT on dedupe_key (which ON CONFLICT (dedupe_key) reads)")
        lacks += [f"USAGE on sequence {sequence} (a column's default draws from it)" for sequence in sequences]
        if not lacks:
            return None
        statements = _grants(table, role, insert=bool(insert), select=bool(select), sequences=sequences)
        return role, ", ".join(lacks), statements

    def _not_ours(self, role: str, lacks: str, statements: str) -> tuple[str, str]:
        """The target's `problem` when the role lacks privileges, and its fix."""
        where = f"PostgreSQL at {redact(self._config.dsn)}"
        problem = f"role {role} may not insert into table {self._config.table} in {where}: it lacks {lacks}"
        return problem, f"run, as the owner: {statements}"

    async def start(self) -> None:
        """Connect once to make the table; a database that is down is said (once), and the
        first message tries again: the node starts all the same."""
        try:
            async with self._connection() as connection:
                await self._prepare(connection)
        except Exception as error:
            self._failing(error)
        else:
            self._answering()

    def _failing(self, error: BaseException) -> str:
        """The error as a handoff's detail; the first of an outage is logged (each refused
        handoff has its InboundFailure record: a line for each would only repeat them)."""
        said = _said(error) if isinstance(error, asyncpg.PostgresError) else str(error)
        detail = f"PostgreSQL at {redact(self._config.dsn)}: {redact(said) or type(error).__name__}"
        if self._outage is None:
            _log.warning("target %s: %s; messages wait unacknowledged at their source until their rows are "
                         "committed", self.name, detail)  # fmt: skip
            self._outage = detail
        return detail

    def _answering(self) -> None:
        if self._outage is not None:
            _log.info("target %s: PostgreSQL at %s answers again; rows are committed", self.name,
                      redact(self._config.dsn))  # fmt: skip
            self._outage = None

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()

    async def deliver(self, message: InboundMessage) -> Handoff:
        return (await self.deliver_many([message]))[0]

    async def deliver_many(self, messages: Sequence[InboundMessage]) -> list[Handoff]:
        try:
            async with self._connection() as connection:
                try:
                    answers = await self._insert_batch(connection, messages)
                except _CHANGED as error:
                    # The table changed under what was learnt of it: learn it again, and try
                    # once more (nothing of the batch was committed: its transaction failed).
                    self._forget(error)
                    try:
                        answers = await self._insert_batch(connection, messages)
                    except _CHANGED as again:
                        self._forget(again)  # (a change still going on: learnt again next time)
                        if isinstance(again, asyncpg.UndefinedTableError):
                            await self._missing(connection, again)
                        raise
        except Exception as error:  # down, failing over, misconfigured: later, never lost
            return [Handoff(Verdict.TRANSIENT, self._failing(error))] * len(messages)
        self._answering()
        self.problem = None  # a batch went in: the table is there, and ours to insert into
        self._changed = None
        return answers

    async def _insert_batch(self, connection: asyncpg.Connection, messages: Sequence[InboundMessage]) -> list[Handoff]:
        """The batch in one transaction, each message's answer; the table made and learnt first."""
        await self._prepare(connection)
        # The statement and its rows from one look at what is known of the table: another
        # batch may learn it again while this one runs.
        insert, decoded = self._insert, bool(self._decoded)
        rows = [self._row(m, decoded=decoded) for m in messages]
        # Inserted in dedupe key order, whatever the mailbox's: each insert locks its key's slot
        # in the unique index until commit, and two nodes' batches of the same messages in
        # opposite orders (a folder holding them twice) would each wait for the other (40P01).
        # In one order, the later waits for the earlier and then finds its rows there.
        ordered = sorted(rows, key=_dedupe_key)
        try:
            for tries_left in range(_CONFLICT_RETRIES, -1, -1):
                try:
                    async with connection.transaction():
                        there = await self._there(connection, rows)
                        await connection.executemany(insert, ordered)
                    break
                except _CONFLICTED:
                    # Nothing of the batch was committed: tried again at once, not taken for
                    # the database refusing (another unique constraint of the operator's, or
                    # a SERIALIZABLE default_transaction_isolation, can still make one).
                    if not tries_left:
                        raise
        except asyncpg.InsufficientPrivilegeError as error:
            await self._not_permitted(connection, error)
        except _REFUSED_ROW:
            # One row the database refuses must not hold the others back: row by row, the
            # refused one is a permanent failure, the rest go in.
            return [await self._insert_one(connection, insert, row) for row in rows]
        return self._answers(rows, there)

    def _forget(self, error: asyncpg.PostgresError) -> None:
        """Forget what was learnt of the table, which changed since (dropped, made again with
        other columns): the next `_prepare` makes it if missing and learns its columns again.
        Said once per change: not by a batch that finds it forgotten already, nor again for a
        change that learning does not mend (a column the insert needs missing, failing every try)."""
        said = redact(_said(error))
        if self._decoded is not None and said != self._changed:
            again = "making it if missing and learning its columns" if self._config.create_table else "learning it"
            _log.warning("target %s: table %s changed under the insert (%s): %s again", self.name,
                         self._config.table, said, again)  # fmt: skip
        self._changed = said
        self._prepared = False
        self._decoded = None
        self._insert = self._insert_sql(decoded=False)

    def _inserted(self) -> Handoff:
        return Handoff(Verdict.ACCEPTED, f"inserted into {self._config.table}")

    def _already(self) -> Handoff:
        """A copy ON CONFLICT (dedupe_key) skipped: the same bytes were there (a duplicate)."""
        return Handoff(Verdict.ACCEPTED, f"duplicate: already in {self._config.table} (same dedupe key)")

    async def _there(self, connection: asyncpg.Connection, rows: Sequence[tuple[object, ...]]) -> set[str]:
        """The batch's dedupe keys already in the table (reading dedupe_key only, which ON
        CONFLICT needs the role to read anyway). Not RETURNING, which would say exactly which
        rows went in, but needs a row-level security SELECT policy too. A copy another node
        commits between this and the insert is said as inserted: the table holds one row all
        the same."""
        keys = [row[0] for row in rows]
        found = await connection.fetch(
            f"SELECT dedupe_key FROM {self._config.table} WHERE dedupe_key = ANY($1::text[])", keys
        )
        return {record["dedupe_key"] for record in found}

    def _answers(self, rows: Sequence[tuple[object, ...]], there: set[str]) -> list[Handoff]:
        """Each row's answer: inserted, or skipped as a duplicate (there before the batch, or
        earlier in it: the same bytes twice)."""
        answers, seen = [], set(there)
        for row in rows:
            answers.append(self._already() if row[0] in seen else self._inserted())
            seen.add(str(row[0]))
        return answers

    async def _missing(self, connection: asyncpg.Connection, error: asyncpg.UndefinedTableError) -> NoReturn:
        """Raise `TableMissing` when it is the table that is missing, with create_table = false:
        with what to do, as said at start (the table dropped since, or mail already waiting
        then); kept as the target's `problem` until a batch goes in."""
        table = self._config.table
        if self._config.create_table or await connection.fetchval("SELECT to_regclass($1)", table) is not None:
            raise error  # another relation (a trigger's, say)
        self.problem = self._no_table()
        raise TableMissing(f"table {table} does not exist (create_table = false): {_CREATE_IT}") from error

    async def _not_permitted(self, connection: asyncpg.Connection, error: asyncpg.InsufficientPrivilegeError) -> None:
        """Raise `NotPermitted`: the database's refusal, with what the role lacks and the GRANTs
        that give it, as said at start (a grant revoked since, say); kept as the target's
        `problem` until a batch goes in."""
        lacking = await self._lacking(connection)
        if lacking is None:  # not one of the privileges the insert needs (row-level security, a trigger's)
            raise error
        role, lacks, statements = lacking
        self.problem, fix = self._not_ours(role, lacks, statements)
        raise NotPermitted(f"{error}: role {role} lacks {lacks}; {fix}") from error

    def _row(self, message: InboundMessage, *, decoded: bool) -> tuple[object, ...]:
        row: tuple[object, ...] = (
            message.dedupe_key,
            message.message_id,
            message.source,
            message.mailbox,
            message.uid,
            message.sender,
            list(message.recipients) or None,
            message.raw,
            datetime.datetime.fromtimestamp(message.received_at, datetime.UTC),
        )
        if decoded:
            fields = decoded_fields(header_fields(header_block(message.raw)))
            row += tuple(fields[name] for name in _DECODED_COLUMNS)
        return row

    async def _insert_one(self, connection: asyncpg.Connection, insert: str, row: tuple[object, ...]) -> Handoff:
        try:
            status = await connection.execute(insert, *row)
        except _REFUSED_ROW as error:
            return Handoff(Verdict.PERMANENT, f"PostgreSQL refused the row: {redact(_said(error))}")
        return self._already() if status == "INSERT 0 0" else self._inserted()
