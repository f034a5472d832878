"""The registry's file: its schema, the migrations that bring an older file up to date, and what an
SQLite error on it means (locked, read-only, damaged), in words.

The schema carries a version (``PRAGMA user_version``); ``MIGRATIONS`` brings an older file up to
date. A file from a newer autoslm is read-only here: records are read by the columns this version
knows, and every write raises ``RegistryNewer``. A version-0 file whose tables have other columns is
refused before anything is created. A file SQLite cannot read raises ``RegistryCorrupt`` naming it;
one that is only locked (``RegistryLocked``, after waiting up to ``LOCK_WAIT_S``, naming the holder's
pid where the system says) or read-only (``RegistryReadOnly``) is reported as such: neither is
damage, and moving it aside would orphan its runs.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from pathlib import Path

from autoslm.errors import AutoslmError, RegistryCorrupt, RegistryLocked, RegistryReadOnly

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    phase TEXT NOT NULL,
    spec_json TEXT NOT NULL,
    spec_path TEXT,
    store_uri TEXT NOT NULL,
    created_at REAL NOT NULL,
    deadline REAL NOT NULL,
    cancel_requested INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS replicas (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    seed INTEGER NOT NULL,
    state TEXT NOT NULL,
    provider TEXT,
    pod_id TEXT,
    gpu TEXT,
    price_per_hour REAL,
    attempt INTEGER NOT NULL DEFAULT 0,
    restarts INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL NOT NULL DEFAULT 0,
    cost_at REAL,
    pod_started_at REAL,
    step INTEGER NOT NULL DEFAULT 0,
    total_steps INTEGER NOT NULL DEFAULT 0,
    heartbeat_at REAL,
    stage TEXT,
    loss REAL,
    error TEXT,
    updated_at REAL NOT NULL,
    PRIMARY KEY (run_id, seed)
);
"""

# Version n+1 is reached by running MIGRATIONS[n]. Version 1 is the schema above (files from before
# versions existed have user_version 0 and that schema: the first migration only adds).
SCHEMA_VERSION = 9
MIGRATIONS = {
    1: """
ALTER TABLE replicas ADD COLUMN intent_name TEXT;
ALTER TABLE replicas ADD COLUMN intent_provider TEXT;
ALTER TABLE replicas ADD COLUMN error_beats INTEGER NOT NULL DEFAULT 0;
ALTER TABLE replicas ADD COLUMN last_error_beat REAL;
CREATE TABLE IF NOT EXISTS leases (
    run_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    expires REAL NOT NULL
);
""",
    2: """
ALTER TABLE replicas ADD COLUMN message TEXT;
""",
    3: """
ALTER TABLE replicas ADD COLUMN intent_until REAL;
ALTER TABLE replicas ADD COLUMN price_source TEXT;
ALTER TABLE leases ADD COLUMN beat_at REAL;
ALTER TABLE leases ADD COLUMN taken_at REAL;
CREATE TABLE IF NOT EXISTS ended_pods (
    provider TEXT NOT NULL,
    pod_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    ended_at REAL NOT NULL,
    PRIMARY KEY (provider, pod_id)
);
""",
    # Sweeps (controller/sweeps.py): a sweep and its members, one per (point, seed). A member's run row
    # is created when the member starts; its run_id is chosen at once, so a restart never doubles it.
    4: """
CREATE TABLE IF NOT EXISTS sweeps (
    sweep_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    spec_path TEXT,
    keys_json TEXT NOT NULL,
    max_parallel INTEGER NOT NULL,
    max_usd REAL,
    created_at REAL NOT NULL,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    stopped TEXT
);
CREATE TABLE IF NOT EXISTS sweep_members (
    sweep_id TEXT NOT NULL REFERENCES sweeps(sweep_id),
    member INTEGER NOT NULL,
    point INTEGER NOT NULL,
    seed INTEGER NOT NULL,
    values_json TEXT NOT NULL,
    spec_json TEXT NOT NULL,
    store_uri TEXT NOT NULL,
    run_id TEXT NOT NULL UNIQUE,
    estimate_usd REAL,
    allot_usd REAL,
    started_at REAL,
    skipped TEXT,
    PRIMARY KEY (sweep_id, member)
);
""",
    # End reasons (controller/state.EndReason): why a replica ended, why a run was asked to end (a
    # user's cancel, or its sweep's budget), why a sweep stopped and why a member was skipped.
    5: """
ALTER TABLE replicas ADD COLUMN end_reason TEXT;
ALTER TABLE runs ADD COLUMN cancel_reason TEXT;
ALTER TABLE sweeps ADD COLUMN end_reason TEXT;
ALTER TABLE sweep_members ADD COLUMN end_reason TEXT;
""",
    # The lease's generation (the fencing token: every decided write of a holder carries the
    # generation it took, and is refused once another took the lease since) and whether its holder
    # keeps it between looks (a run's background supervisor: ``standing``).
    6: """
ALTER TABLE leases ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;
ALTER TABLE leases ADD COLUMN standing INTEGER NOT NULL DEFAULT 0;
""",
    # A pod whose terminate the provider refused (controller/billing.end_pod): the last refusal, how many
    # in a row and since when, so that `status` says a teardown keeps failing while a supervisor retries it.
    7: """
ALTER TABLE replicas ADD COLUMN teardown_error TEXT;
ALTER TABLE replicas ADD COLUMN teardown_failures INTEGER NOT NULL DEFAULT 0;
ALTER TABLE replicas ADD COLUMN teardown_since REAL;
""",
    # A replica of several pods (compute.nodes): each node's pod id, state, message and exit code at the
    # last look, as JSON (controller/nodes.py), so that `status`, `watch` and the report say each node's state.
    8: """
ALTER TABLE replicas ADD COLUMN nodes TEXT;
""",
}


# How long a write waits for another process's lock before saying who holds it. Transactions here
# last milliseconds: a lock held this long is a process stuck (or a tool left open) on the file.
LOCK_WAIT_S = 10.0
# One slice of that wait inside SQLite's busy handler, where Python cannot act on a signal: Ctrl-C is
# acted on within a slice, not after the whole wait.
LOCK_SLICE_S = 0.05


def _says_busy(e: BaseException) -> bool:
    text = str(e).lower()
    return "locked" in text or "busy" in text


def is_busy(e: BaseException) -> bool:
    """Whether an error is another process holding the registry: SQLite's own "database is locked" (a
    read outside a transaction raises it as it is) or ``RegistryLocked`` (a transaction says it so)."""
    return isinstance(e, RegistryLocked) or (isinstance(e, sqlite3.OperationalError) and _says_busy(e))


class PatientConnection(sqlite3.Connection):
    """A connection that waits for another process's lock in short slices, up to ``patience`` seconds.

    SQLite's own busy timeout sleeps in C for the whole wait, so a Ctrl-C that comes meanwhile is acted
    on only when it ends. Here SQLite waits one slice (``LOCK_SLICE_S``, its busy timeout) and Python
    asks again: a signal raises between two slices. A statement refused as busy has taken no lock and
    changed nothing (BEGIN IMMEDIATE, a read's first step, a COMMIT that keeps its transaction open),
    so asking it again is safe."""

    patience: float = LOCK_WAIT_S

    def execute(self, sql: str, parameters=(), /) -> sqlite3.Cursor:
        deadline = None
        while True:
            asked = time.monotonic()
            try:
                return super().execute(sql, parameters)
            except sqlite3.OperationalError as e:
                if not _says_busy(e):
                    raise
                now = time.monotonic()
                deadline = asked + self.patience if deadline is None else deadline
                if now + LOCK_SLICE_S > deadline:
                    raise
                if now - asked < LOCK_SLICE_S / 2:  # refused without SQLite's wait (a lock it will not wait for)
                    time.sleep(LOCK_SLICE_S / 2)

    @contextlib.contextmanager
    def waiting_at_most(self, seconds: float):
        """Wait at most ``seconds`` for a lock inside this block (what an interrupted command still
        reads or writes on its way out must not hold the user up)."""
        before, self.patience = self.patience, min(self.patience, seconds)
        try:
            yield self
        finally:
            self.patience = before


def registry_error(e: sqlite3.DatabaseError, path: Path) -> AutoslmError:
    """Say what an SQLite error on the registry is: locked, read-only, or damaged."""
    text = str(e).lower()
    if _says_busy(e):
        holder = lock_holder(path)
        who = f"locked by pid {holder}" if holder else "locked by another process"
        if holder and is_stopped(holder):  # Ctrl-Z or SIGSTOP inside a transaction: it never lets go by itself
            return RegistryLocked(
                f"the run registry {path} is {who}, which is stopped (Ctrl-Z or SIGSTOP) holding it",
                hint=f"`kill -CONT {holder}` lets it finish (or `fg` in its shell); the registry itself is fine (do not move it)",
            )
        return RegistryLocked(
            f"the run registry {path} is {who} (waited {LOCK_WAIT_S:g}s)",
            hint="try again when that process is done; the registry itself is fine (do not move it)",
        )
    # A write cut off by the file turning read-only (chattr +i, a remount) reads "disk I/O error":
    # that is no damage either, and moving the file aside would orphan its runs.
    if (
        "readonly" in text
        or "read-only" in text
        or "read only" in text
        or ("i/o" in text and path.exists() and not file_writable(path))
    ):
        return RegistryReadOnly(
            f"the run registry {path} is read-only here ({e})",
            hint=f"autoslm needs to write it and its directory: check the permissions of {path.parent} "
            "(the registry itself is fine: do not move it)",
        )
    return RegistryCorrupt(
        f"the run registry {path} is damaged ({e})",
        hint=f"move it aside (mv {path} {path}.bad) to start a fresh one; `autoslm gc --all-homes` or "
        "`autoslm gc POD_ID...` then ends the pods it knew, found in the providers' own lists",
    )


def file_writable(path: Path) -> bool:
    if not os.access(path, os.W_OK) or not os.access(path.parent, os.W_OK):
        return False
    try:
        with open(path, "r+b"):  # root passes os.access: only an open tells (read-only mounts, chattr +i)
            return True
    except OSError:
        return False


def is_stopped(pid: int) -> bool:
    """Whether the process is stopped (Linux: state T in /proc/PID/stat); False where that cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] == ["T"]


def lock_holder(path: Path) -> int | None:
    """The pid of another process holding a write lock on the registry (Linux: /proc/locks), or None."""
    inodes = set()
    for p in (path, Path(f"{path}-shm"), Path(f"{path}-wal")):
        try:
            inodes.add(p.stat().st_ino)
        except OSError:
            pass
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        # "1: POSIX  ADVISORY  WRITE 1234 08:01:5678 120 120"
        if len(parts) < 6 or parts[1] != "POSIX" or parts[3] != "WRITE" or not parts[4].isdigit():
            continue
        try:
            inode = int(parts[5].rsplit(":", 1)[1])
        except (IndexError, ValueError):
            continue
        if inode in inodes and int(parts[4]) != os.getpid():
            return int(parts[4])
    return None


# The columns of schema version 1 (what a file of user_version 0 must have to be ours).
_V1_COLUMNS = {
    "runs": {"run_id", "name", "phase", "spec_json", "spec_path", "store_uri", "created_at", "deadline", "cancel_requested"},
    "replicas": {
        "run_id",
        "seed",
        "state",
        "provider",
        "pod_id",
        "gpu",
        "price_per_hour",
        "attempt",
        "restarts",
        "cost_usd",
        "cost_at",
        "pod_started_at",
        "step",
        "total_steps",
        "heartbeat_at",
        "stage",
        "loss",
        "error",
        "updated_at",
    },
}


def migrate(db: sqlite3.Connection, path: Path, tx) -> int | None:
    """Bring the file up to ``SCHEMA_VERSION``; returns the file's version when it is newer (read-only here)."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        return version  # read what we know, write nothing
    if version == SCHEMA_VERSION:
        return None
    if version == 0:
        _check_unversioned(db, path)
    with tx():
        # Re-read under the write lock: another process may have migrated meanwhile.
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version == 0:
            _run_script(db, _SCHEMA)
            version = 1
        while version < SCHEMA_VERSION:
            _run_script(db, MIGRATIONS[version])
            version += 1
        db.execute(f"PRAGMA user_version = {version}")
    return None


def _run_script(db: sqlite3.Connection, script: str) -> None:
    for stmt in script.split(";"):
        if stmt.strip():
            db.execute(stmt)


def _check_unversioned(db: sqlite3.Connection, path: Path) -> None:
    """A file of user_version 0 is either new (no tables) or of schema 1; anything else is not ours."""
    for table, want in _V1_COLUMNS.items():
        have = {r[1] for r in db.execute(f"PRAGMA table_info({table})").fetchall()}
        if have and have != want:
            missing, extra = sorted(want - have), sorted(have - want)
            raise RegistryCorrupt(
                f"the run registry {path} has a {table} table whose columns match no autoslm schema "
                f"(missing: {', '.join(missing) or 'none'}; unknown: {', '.join(extra) or 'none'})",
                hint=f"nothing was changed; if it is not autoslm's, move it aside (mv {path} {path}.bad)",
            )


class Transaction:
    """One IMMEDIATE transaction on the registry: waits up to the lock wait for another writer,
    commits on success, rolls back on any error, and says what an SQLite error means."""

    def __init__(self, db: sqlite3.Connection, path: Path, begin: str = "BEGIN IMMEDIATE"):
        self.db, self.path, self.begin = db, path, begin

    def __enter__(self) -> sqlite3.Connection:
        try:
            self.db.execute(self.begin)
        except sqlite3.DatabaseError as e:
            raise registry_error(e, self.path) from None
        return self.db

    def __exit__(self, exc_type, exc, _tb) -> bool:
        try:
            self.db.execute("ROLLBACK" if exc_type else "COMMIT")
        except sqlite3.DatabaseError as e:
            if exc_type is None:
                with contextlib.suppress(sqlite3.DatabaseError):
                    self.db.execute("ROLLBACK")  # a failed COMMIT leaves the transaction open
                raise registry_error(e, self.path) from None
        if isinstance(exc, sqlite3.DatabaseError):
            raise registry_error(exc, self.path) from None
        return False
