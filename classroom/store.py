"""The answer store: every quiz attempt and exercise check, written as it happens, in one SQLite file.

    store = AnswerStore()                        # $DANTINOX_ANSWERS_DB, else the user's data directory
    store.add(Attempt(key=new_key(), learner="ada", ...), outbox=True)
    store.attempts("ada", "kv-cache"); store.reset("ada", "kv-cache"); store.pending()

Writes are idempotent on the attempt's key, so delivering the same attempt twice never counts it twice.
The file uses WAL and a busy timeout so several kernels (or one service) can write at once; a reset hides
earlier attempts from resume and score but never deletes them. Standard library and platformdirs only.

An exercise check (`classroom.exercise_catalogue`) is an attempt too: its entry_id is the exercise's id, its
`mistake` the known wrong solution the check recognised. The schema only ever gains nullable columns, added
when a writer opens an older file (`_MIGRATIONS`); a file opened read-only is never changed, and a column it
lacks reads as NULL, so every earlier answer file stays readable.

SQLite's locks are POSIX locks, which belong to the process and are dropped when the process closes *any*
descriptor of the file (sqlite.org/howtocorrupt.html, section 2.2). So this module never opens an existing
database file itself, and every AnswerStore of one process on one file shares one set of connections: a second
store on the same path (two quizzes, a re-run cell) adds no descriptor that could be closed under the first.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import math
import os
import re
import sqlite3
import sys
import threading
import uuid
import weakref
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import quote

import platformdirs

ENV_VAR = "DANTINOX_ANSWERS_DB"
BUSY_TIMEOUT_S = 30.0
READ_TIMEOUT_S = 2.0  # a read-only store's wait for a lock
MAX_TEXT = 20_000  # characters in one question or response: a quiz line, not a document
_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")
_MISTAKE = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
_SHA256 = re.compile(r"[0-9a-f]{64}")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS attempts (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL UNIQUE,
    learner TEXT NOT NULL,
    entry_id TEXT NOT NULL,
    check_index INTEGER NOT NULL,
    question TEXT NOT NULL,
    params TEXT NOT NULL,
    response TEXT NOT NULL,
    expected TEXT NOT NULL,
    correct INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    time REAL NOT NULL,
    content_version TEXT NOT NULL,
    hidden INTEGER NOT NULL DEFAULT 0,
    delivered INTEGER,  -- NULL not for delivery, 0 in the outbox, 1 acknowledged, -1 refused (set aside)
    refusal TEXT,  -- why the service refused it (delivered = -1)
    mistake TEXT  -- an exercise check's recognised wrong solution (NULL: none, or a quiz answer)
);
CREATE INDEX IF NOT EXISTS attempts_by_learner ON attempts (learner, entry_id, check_index);
CREATE INDEX IF NOT EXISTS attempts_outbox ON attempts (delivered) WHERE delivered = 0;
"""
# columns later versions added, in order, with their type: an older file gains them when a writer opens it
_MIGRATIONS = (("refusal", "TEXT"),  # refused attempts set aside
               ("mistake", "TEXT"))  # exercise checks


class KeyConflict(ValueError):
    """An attempt's key is already stored for another learner: refused, never acknowledged as delivered."""


def _expect(ok: bool, name: str, what: str, got: Any) -> None:
    if not ok:
        shown = repr(got)
        raise ValueError(f"attempt.{name}: expected {what}, got {shown[:80]}")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    if _is_int(x):
        return abs(x) <= _LARGEST  # an integer past float's range is no number SQLite or a formula can use
    return isinstance(x, float) and math.isfinite(x)


_LARGEST = int(sys.float_info.max)


@dataclass(frozen=True)
class Attempt:
    """One answer to one check, exactly as the learner saw and gave it."""

    key: str  # idempotency key (uuid4 hex), unique per attempt
    learner: str  # $JUPYTERHUB_USER in a hub, else the OS user
    entry_id: str  # the content entry the check belongs to
    check_index: int  # position of the check in the entry
    question: str  # the question text as shown, parameters substituted
    params: dict = field(hash=False)  # the parameters of a parameterised question ({} if none)
    response: str  # number as typed, or the chosen option's text
    expected: str  # the keyed answer as shown
    correct: bool
    attempt: int  # 1-based per (learner, entry_id, check_index), counted since the last reset
    time: float  # unix seconds
    content_version: str  # sha256 hex of the entry's YAML file (of the exercise catalogue for an exercise)
    mistake: str | None = None  # exercise checks: the known wrong solution recognised; None for a quiz answer

    def __post_init__(self) -> None:
        _expect(isinstance(self.key, str) and bool(_KEY.fullmatch(self.key)), "key",
                "1-64 letters, digits, '-' or '_' (a uuid4 hex)", self.key)
        for name in ("learner", "entry_id"):
            value = getattr(self, name)
            _expect(isinstance(value, str) and 0 < len(value) <= 200 and value.strip() == value, name,
                    "a non-empty name without surrounding spaces", value)
        _expect(_is_int(self.check_index) and self.check_index >= 0, "check_index", "an integer >= 0",
                self.check_index)
        for name in ("question", "response", "expected"):
            value = getattr(self, name)
            _expect(isinstance(value, str) and len(value) <= MAX_TEXT, name, f"text up to {MAX_TEXT} characters",
                    value)
        _expect(isinstance(self.params, dict) and all(isinstance(k, str) and _is_number(v)
                                                      for k, v in self.params.items()),
                "params", "an object of names to finite numbers", self.params)
        _expect(isinstance(self.correct, bool), "correct", "true or false", self.correct)
        _expect(_is_int(self.attempt) and self.attempt >= 1, "attempt", "an integer >= 1", self.attempt)
        _expect(_is_number(self.time) and self.time >= 0, "time", "unix seconds (a finite number >= 0)", self.time)
        _expect(isinstance(self.content_version, str) and bool(_SHA256.fullmatch(self.content_version)),
                "content_version", "a sha256 hex digest (64 lowercase hex digits)", self.content_version)
        _expect(self.mistake is None or (isinstance(self.mistake, str) and bool(_MISTAKE.fullmatch(self.mistake))),
                "mistake", "null or a mistake id (lowercase letters, digits and '-')", self.mistake)

    def to_json(self) -> dict:
        """A JSON-ready dict with exactly the dataclass fields."""
        out = asdict(self)
        out["params"] = dict(self.params)
        return out

    @classmethod
    def from_json(cls, d: dict) -> Attempt:
        """Build and validate an attempt from `to_json` output; bad input raises a one-line ValueError."""
        if not isinstance(d, dict):
            raise ValueError(f"attempt: expected a JSON object, got {type(d).__name__}")
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if n not in d and n not in _OPTIONAL]
        if missing:
            raise ValueError(f"attempt: missing field(s) {', '.join(missing)}")
        extra = sorted(set(d) - set(names))
        if extra:
            raise ValueError(f"attempt: unknown field(s) {', '.join(extra)}")
        return cls(**{n: d[n] for n in names if n in d})


_OPTIONAL = {"mistake"}  # fields an attempt written before they existed (an old outbox or page storage) lacks


def new_key() -> str:
    """A fresh idempotency key for one attempt."""
    return uuid.uuid4().hex


def content_version(path: str | Path) -> str:
    """sha256 hex of an entry's YAML file: which wording of the questions a learner answered."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def current_learner() -> str:
    """The hub user inside a JupyterHub server, else the operating-system user."""
    return os.environ.get("JUPYTERHUB_USER") or getpass.getuser()


def default_path() -> Path:
    """Where the store lives: $DANTINOX_ANSWERS_DB when set, else the user's data directory."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    return platformdirs.user_data_path("dantinox-labs") / "answers.sqlite"


_COLUMNS = ("key, learner, entry_id, check_index, question, params, response, expected, correct, attempt, time, "
            "content_version, mistake")


def _expect_attempts(attempts: list) -> None:
    for a in attempts:
        if not isinstance(a, Attempt):
            raise ValueError(f"attempt: expected an Attempt, got {type(a).__name__}")


def _row_to_attempt(row: tuple) -> Attempt:
    (key, learner, entry_id, check_index, question, params, response, expected, correct, attempt, t,
     version, mistake) = row
    return Attempt(key=key, learner=learner, entry_id=entry_id, check_index=check_index, question=question,
                   params=json.loads(params), response=response, expected=expected, correct=bool(correct),
                   attempt=attempt, time=t, content_version=version, mistake=mistake)


def _private_file(path: Path) -> None:
    """Create `path` readable and writable by this OS account only: missing directories 0700, the file 0600.

    A missing file is created (O_EXCL) and its descriptor closed before SQLite opens it, so no lock can be
    held on it yet; an existing file is never opened here (closing a descriptor of it would drop this process's
    SQLite locks), only narrowed to 0600 by its path, as are the -wal and -shm files SQLite gives its mode."""
    missing = []
    parent = path.parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    for d in reversed(missing):
        d.mkdir(mode=0o700)
        os.chmod(d, 0o700)  # whatever the umask
    if not path.exists():
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
        except FileExistsError:  # another process made it a moment ago
            pass
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        if p.exists() and p.stat().st_mode & 0o077 and p.stat().st_uid == os.getuid():
            os.chmod(p, 0o600)


class _Connections:
    """The connections of one process to one database file, shared by every AnswerStore on it."""

    def __init__(self, path: Path, readonly: bool, exclusive: bool):
        self.users, self.lock = 0, threading.RLock()  # one writer at a time among a process's threads
        if readonly:
            uri = f"file:{quote(str(path.resolve()))}?mode=ro"
            # a reader of a WAL file never waits for writers: only a file held exclusively (the running
            # service's) makes it wait, and then a short wait says so sooner
            self.db = sqlite3.connect(uri, uri=True, timeout=READ_TIMEOUT_S, isolation_level=None,
                                      check_same_thread=False)
            self.rdb, self.read_lock = self.db, self.lock
            try:
                self.db.execute("SELECT COUNT(*) FROM attempts").fetchone()
                self.select = _select(self.db)
            except BaseException:
                self.db.close()
                raise
            return
        # autocommit mode: every write opens its own BEGIN IMMEDIATE transaction
        self.db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        try:
            self.db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            if exclusive:  # before WAL's first use: the WAL index lives in this process's memory, no -shm map
                self.db.execute("PRAGMA locking_mode = EXCLUSIVE")
            self.db.execute("PRAGMA journal_mode = WAL")
            # NORMAL in WAL mode: a commit survives the writing process being killed (not a power cut)
            self.db.execute("PRAGMA synchronous = NORMAL")
            with _Transaction(self.db):
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    self.db.execute(statement)
                columns = _columns(self.db)
                for name, kind in _MIGRATIONS:
                    if name not in columns:  # a file from before this column existed
                        self.db.execute(f"ALTER TABLE attempts ADD COLUMN {name} {kind}")
            self.select = _COLUMNS
            if exclusive:  # one connection holds the file: reads share it, under the writers' lock
                self.rdb, self.read_lock = self.db, self.lock
            else:  # reads have their own connection: in WAL mode they never wait for a writer
                self.rdb = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                           check_same_thread=False)
                self.read_lock = threading.Lock()
        except BaseException:
            self.db.close()
            raise

    def close(self) -> None:
        self.db.close()
        if self.rdb is not self.db:
            self.rdb.close()


def _columns(db: sqlite3.Connection) -> set[str]:
    return {row[1] for row in db.execute("PRAGMA table_info(attempts)")}


def _select(db: sqlite3.Connection) -> str:
    """The SELECT list of an attempt for this file: a column an older file lacks reads as NULL."""
    have = _columns(db)
    return ", ".join(c if c in have else f"NULL AS {c}" for c in _COLUMNS.split(", "))


_OPEN: dict[tuple, _Connections] = {}  # (device, inode, readonly, exclusive) -> this process's connections
# reentrant: the garbage collector may finalize (and so `_release`) a store caught in a reference cycle at any
# allocation, also inside AnswerStore.__init__ while it holds this lock; with a plain Lock that deadlocked
_OPEN_LOCK = threading.RLock()


def _release(key: tuple) -> None:
    with _OPEN_LOCK:
        conns = _OPEN.get(key)
        if conns is None:
            return
        conns.users -= 1
        if conns.users == 0:
            del _OPEN[key]
            conns.close()


class AnswerStore:
    """An SQLite file of attempts; safe to share between threads of one process and between processes."""

    def __init__(self, path: str | Path | None = None, *, readonly: bool = False, exclusive: bool = False):
        """Open (creating if needed) the store at `path`; readonly=True only reads an existing file, so earlier
        answers can still be shown and exported from a read-only file or a full disk.

        exclusive=True (the classroom service) holds the file's lock for as long as the store is open: no other
        process can open it meanwhile, and SQLite keeps its WAL index in memory rather than in a shared -shm
        map, so a file made read-only or immutable under the service fails its writes with an error instead of
        killing the process with SIGBUS (a write to a map of an immutable file)."""
        self.path = Path(path).expanduser() if path is not None else default_path()
        self.readonly = readonly
        if self.path.exists() and self.path.is_dir():
            raise ValueError(f"answer store: expected a file path, got the directory {self.path}")
        try:
            if readonly:
                if not self.path.is_file():
                    raise ValueError(f"answer store {self.path}: expected an existing file to read, got none")
            else:
                _private_file(self.path)
            info = self.path.stat()
            key = (info.st_dev, info.st_ino, readonly, exclusive)
            with _OPEN_LOCK:
                conns = _OPEN.get(key)
                if conns is None:
                    conns = _OPEN[key] = _Connections(self.path, readonly, exclusive)
                conns.users += 1
        except sqlite3.OperationalError as err:
            if "locked" in str(err):
                raise ValueError(f"answer store {self.path}: another process holds it ({err})") from None
            raise ValueError(f"answer store {self.path}: not a usable SQLite file ({err})") from None
        except sqlite3.DatabaseError as err:
            raise ValueError(f"answer store {self.path}: not a usable SQLite file ({err})") from None
        except OSError as err:
            raise ValueError(f"answer store {self.path}: cannot create it ({err.strerror})") from None
        self._db, self._rdb, self._lock, self._read_lock = conns.db, conns.rdb, conns.lock, conns.read_lock
        self._select = conns.select
        self._closed = weakref.finalize(self, _release, key)  # on close(), or when the store is collected

    def _write(self):
        return _Transaction(self._db)

    def close(self) -> None:
        """Let go of the connections; the last store of this process on the file closes them (the file stays)."""
        self._closed()

    def __enter__(self) -> AnswerStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Writing --------------------------------------------------------------------------------------
    def add(self, attempt: Attempt, *, outbox: bool = False) -> bool:
        """Record `attempt` unless its key is already stored; True if it was new.

        outbox=True also queues it for delivery to a classroom service (see `pending`)."""
        return self.add_many([attempt], outbox=outbox)[0]

    def add_many(self, attempts: list[Attempt], *, outbox: bool = False, number: bool = False) -> list[bool]:
        """Record several attempts in one transaction (all or none); per attempt, whether it was new.

        number=True gives each new attempt its number in arrival order (1 + the learner's earlier attempts at
        the check since their last reset), whatever number it carried. A key already stored under another
        learner raises KeyConflict and stores nothing."""
        _expect_attempts(attempts)
        with self._lock, self._write():
            return self._insert(attempts, outbox, number)

    def add_groups(self, groups: list[list[Attempt]], *, number: bool = False) -> list[list[bool] | KeyConflict]:
        """Record several independent groups of attempts in one transaction (one commit for all of them), each
        group all or none: per group, whether each attempt was new, or the KeyConflict that kept the group out.
        Groups are numbered (number=True) in the order given, as if added one after another."""
        for group in groups:
            _expect_attempts(group)
        out = []
        with self._lock, self._write():
            for group in groups:
                self._db.execute("SAVEPOINT attempt_group")
                try:
                    out.append(self._insert(group, False, number))
                except KeyConflict as err:
                    self._db.execute("ROLLBACK TO attempt_group")
                    out.append(err)
                self._db.execute("RELEASE attempt_group")
        return out

    def _insert(self, attempts: list[Attempt], outbox: bool, number: bool) -> list[bool]:
        out = []
        for a in attempts:
            row = self._db.execute("SELECT learner FROM attempts WHERE key = ?", (a.key,)).fetchone()
            if row is not None:
                if row[0] != a.learner:
                    raise KeyConflict(f"attempt.key: {a.key} is already stored for another learner")
                out.append(False)
                continue
            n = a.attempt
            if number:
                (n,) = self._db.execute("SELECT COUNT(*) + 1 FROM attempts WHERE learner = ? AND entry_id = ? "
                                        "AND check_index = ? AND hidden = 0",
                                        (a.learner, a.entry_id, a.check_index)).fetchone()
            self._db.execute(
                f"INSERT INTO attempts ({_COLUMNS}, delivered) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (a.key, a.learner, a.entry_id, a.check_index, a.question, json.dumps(a.params, sort_keys=True),
                 a.response, a.expected, int(a.correct), n, float(a.time), a.content_version, a.mistake,
                 0 if outbox else None))
            out.append(True)
        return out

    def reset(self, learner: str, entry_id: str) -> int:
        """Hide `learner`'s attempts at `entry_id` from resume and score; returns how many were hidden.

        Rows stay in the file (and in `attempts(..., include_reset=True)`); attempt numbers restart at 1."""
        with self._lock, self._write():
            cur = self._db.execute("UPDATE attempts SET hidden = 1 WHERE learner = ? AND entry_id = ? AND hidden = 0",
                                   (learner, entry_id))
            return cur.rowcount

    def mark_delivered(self, keys: Iterable[str]) -> None:
        """Take these attempts out of the outbox (a classroom service acknowledged them)."""
        keys = list(keys)
        with self._lock, self._write():
            self._db.executemany("UPDATE attempts SET delivered = 1 WHERE key = ? AND delivered = 0",
                                 [(k,) for k in keys])

    def set_aside(self, key: str, reason: str) -> None:
        """Take an attempt the service refused out of the outbox, keeping it and the reason (see `refused`)."""
        with self._lock, self._write():
            self._db.execute("UPDATE attempts SET delivered = -1, refusal = ? WHERE key = ? AND delivered = 0",
                             (reason[:500], key))

    # Reading --------------------------------------------------------------------------------------
    def attempts(self, learner: str | None = None, entry_id: str | None = None, *,
                 include_reset: bool = False) -> list[Attempt]:
        """Attempts in the order they were made, optionally for one learner and/or one entry.

        Attempts hidden by `reset` are left out unless include_reset=True."""
        where, args = [], []
        if learner is not None:
            where.append("learner = ?")
            args.append(learner)
        if entry_id is not None:
            where.append("entry_id = ?")
            args.append(entry_id)
        if not include_reset:
            where.append("hidden = 0")
        sql = f"SELECT {self._select} FROM attempts" + (" WHERE " + " AND ".join(where) if where else "")
        with self._read_lock:
            rows = self._rdb.execute(sql + " ORDER BY time, seq", args).fetchall()
        return [_row_to_attempt(r) for r in rows]

    def was_reset(self, key: str) -> bool:
        """Whether the attempt with this key has been hidden by a reset (False if unknown)."""
        with self._read_lock:
            row = self._rdb.execute("SELECT hidden FROM attempts WHERE key = ?", (key,)).fetchone()
        return bool(row and row[0])

    def next_attempt(self, learner: str, entry_id: str, check_index: int) -> int:
        """The attempt number the next answer to this check gets (1 after a reset)."""
        with self._read_lock:
            (n,) = self._rdb.execute("SELECT COUNT(*) FROM attempts WHERE learner = ? AND entry_id = ? AND "
                                    "check_index = ? AND hidden = 0", (learner, entry_id, check_index)).fetchone()
        return n + 1

    def pending(self) -> list[Attempt]:
        """The outbox: attempts added with outbox=True and not yet marked delivered, oldest first."""
        with self._read_lock:
            rows = self._rdb.execute(f"SELECT {self._select} FROM attempts WHERE delivered = 0 ORDER BY seq").fetchall()
        return [_row_to_attempt(r) for r in rows]

    def refused(self) -> list[tuple[Attempt, str]]:
        """Attempts the classroom service refused, with its reason, oldest first (never sent again)."""
        with self._read_lock:
            try:
                rows = self._rdb.execute(f"SELECT {self._select}, refusal FROM attempts WHERE delivered = -1 "
                                         "ORDER BY seq").fetchall()
            except sqlite3.OperationalError:  # a file from before refusals were kept, opened read-only
                return []
        return [(_row_to_attempt(r[:-1]), r[-1]) for r in rows]

    def count(self) -> int:
        """How many attempts the file holds, reset ones included."""
        with self._read_lock:
            return self._rdb.execute("SELECT COUNT(*) FROM attempts").fetchone()[0]


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT: takes the write lock up front so the busy timeout, not an error, handles
    a concurrent writer."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            try:
                self.db.execute("COMMIT")
                return
            except sqlite3.Error:  # a file turned read-only or a full disk: leave no transaction open behind it
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
                raise
        if self.db.in_transaction:  # SQLite may have rolled back already (an I/O error ends the transaction)
            self.db.execute("ROLLBACK")
