"""The run registry: which runs this machine launched, and what became of them. SQLite under $AUTOSLM_HOME.

One row per run (its JobSpec, store, deadline) and one per replica (a seed: its pod, attempts, cost,
state). A rollback journal (not WAL) and short transactions: WAL's shared-memory index is a memory
map, and a process touching a map whose file another process truncated or replaced (a file made
read-only, a home on a flaky mount) dies of SIGBUS with nothing said. No memory map at all
(``mmap_size = 0``), so a registry that goes read-only or away is an error, never a crash.

Exactly one actor per run: every launch, terminate and state change happens under the run's lease (a
row with an owner and an expiry, taken in an IMMEDIATE transaction). A lease whose owner process is
gone (same host, dead pid) is free at once, so a SIGKILLed `launch` does not block `cancel`.
A launch intent (the attempt's pod name and provider) is written before the create call, so a crash
between create and record leaves a name the next tick can look up and adopt or terminate. The intent
carries the time until which its create may still land (``intent_until``): before then, a lookup that
finds nothing means "not yet", never "nothing there", so no other process creates that name again.

The schema carries a version (``PRAGMA user_version``); ``_MIGRATIONS`` brings an older file up to
date. A file from a newer autoslm is read-only here: records are read by the columns this version
knows, and every write raises ``RegistryNewer`` (nothing here may act on runs it only half knows). A
version-0 file whose tables have other columns is refused before anything is created. A file SQLite
cannot read raises ``RegistryCorrupt`` naming it; one that is only locked (``RegistryLocked``, after
waiting up to ``LOCK_WAIT_S``, naming the holder's pid where the system says) or read-only
(``RegistryReadOnly``) is reported as such: neither is damage, and moving it aside would orphan its runs.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from autoslm.controller.state import STATES, TERMINAL, EndReason, RunState, run_state  # noqa: F401 - re-exported
from autoslm.errors import AutoslmError

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

# Version n+1 is reached by running _MIGRATIONS[n]. Version 1 is the schema above (files from before
# versions existed have user_version 0 and that schema: the first migration only adds).
SCHEMA_VERSION = 6
_MIGRATIONS = {
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
}


# How long a write waits for another process's lock before saying who holds it. Transactions here
# last milliseconds: a lock held this long is a process stuck (or a tool left open) on the file.
LOCK_WAIT_S = 10.0


class RegistryCorrupt(AutoslmError):
    """The registry file exists but SQLite cannot read it (or it has tables of an unknown shape)."""

    exit_code = 1


class RegistryNewer(AutoslmError):
    """The registry was written by a newer autoslm: this one may read it, never write it."""

    exit_code = 1


class RegistryLocked(AutoslmError):
    """Another process held the registry's write lock for longer than ``LOCK_WAIT_S``."""

    exit_code = 1


class RegistryReadOnly(AutoslmError):
    """The registry file (or its directory) cannot be written by this user."""

    exit_code = 1


def registry_error(e: sqlite3.DatabaseError, path: Path) -> AutoslmError:
    """Say what an SQLite error on the registry is: locked, read-only, or damaged."""
    text = str(e).lower()
    if "locked" in text or "busy" in text:
        holder = lock_holder(path)
        who = f"locked by pid {holder}" if holder else "locked by another process"
        return RegistryLocked(
            f"the run registry {path} is {who} (waited {LOCK_WAIT_S:g}s)",
            hint="try again when that process is done; the registry itself is fine (do not move it)",
        )
    # A write cut off by the file turning read-only (chattr +i, a remount) reads "disk I/O error":
    # that is no damage either, and moving the file aside would orphan its runs.
    if "readonly" in text or "read-only" in text or "read only" in text or ("i/o" in text and path.exists() and not _file_writable(path)):
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


def _file_writable(path: Path) -> bool:
    if not os.access(path, os.W_OK) or not os.access(path.parent, os.W_OK):
        return False
    try:
        with open(path, "r+b"):  # root passes os.access: only an open tells (read-only mounts, chattr +i)
            return True
    except OSError:
        return False


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


@dataclass
class RunRecord:
    run_id: str
    name: str
    phase: str
    spec_json: str
    spec_path: str | None
    store_uri: str
    created_at: float
    deadline: float
    cancel_requested: int = 0

    @property
    def spec(self):
        from autoslm.spec import JobSpec

        return JobSpec.from_json(self.spec_json)


@dataclass
class ReplicaRecord:
    run_id: str
    seed: int
    state: str
    provider: str | None = None
    pod_id: str | None = None
    gpu: str | None = None
    price_per_hour: float | None = None
    attempt: int = 0
    restarts: int = 0
    cost_usd: float = 0.0
    cost_at: float | None = None
    pod_started_at: float | None = None
    step: int = 0
    total_steps: int = 0
    heartbeat_at: float | None = None
    stage: str | None = None
    loss: float | None = None
    error: str | None = None
    updated_at: float = 0.0
    intent_name: str | None = None  # the pod name of an attempt whose create may have been sent
    intent_provider: str | None = None
    error_beats: int = 0  # error heartbeats seen since the last training progress (crash-loop count)
    last_error_beat: float | None = None
    message: str | None = None  # the heartbeat's own words, e.g. the model download's progress
    intent_until: float | None = None  # until then, a create of intent_name may still land (not "nothing there")
    price_source: str | None = None  # where price_per_hour came from: "provider", "offer at launch", ...
    end_reason: str | None = None  # an EndReason, once ended

    @property
    def terminal(self) -> bool:
        return RunState(self.state).terminal


_RUN_FIELDS = frozenset(f.name for f in fields(RunRecord))
_REPLICA_FIELDS = frozenset(f.name for f in fields(ReplicaRecord))
# The columns of schema version 1 (what a file of user_version 0 must have to be ours).
_V1_COLUMNS = {
    "runs": {"run_id", "name", "phase", "spec_json", "spec_path", "store_uri", "created_at", "deadline", "cancel_requested"},
    "replicas": {"run_id", "seed", "state", "provider", "pod_id", "gpu", "price_per_hour", "attempt", "restarts", "cost_usd",
                 "cost_at", "pod_started_at", "step", "total_steps", "heartbeat_at", "stage", "loss", "error", "updated_at"},
}


def _run(row) -> RunRecord:
    # Only the columns this version knows: a newer file may have more.
    return RunRecord(**{k: row[k] for k in row.keys() if k in _RUN_FIELDS})


def _replica(row) -> ReplicaRecord:
    return ReplicaRecord(**{k: row[k] for k in row.keys() if k in _REPLICA_FIELDS})


class Registry:
    def __init__(self, home: Path, clock=time.time, lock_wait_s: float = LOCK_WAIT_S):
        self.lock_wait_s = lock_wait_s
        self.path = Path(home) / "registry.db"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.clock = clock
        self.newer_version: int | None = None  # set when the file is from a newer autoslm (read-only here)
        self._open()

    def _open(self) -> None:
        try:
            self._db = sqlite3.connect(self.path, timeout=self.lock_wait_s, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA mmap_size=0")  # reads through read(2): a truncated file is an error, not SIGBUS
            if self._db.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
                # A file left in WAL mode (by an older autoslm): leave it, with no wait, when no one
                # else has it open; otherwise it stays WAL until a later open finds it free.
                self._db.execute("PRAGMA busy_timeout=0")
                with contextlib.suppress(sqlite3.DatabaseError):
                    self._db.execute("PRAGMA journal_mode=DELETE")
            self._db.execute(f"PRAGMA busy_timeout={int(self.lock_wait_s * 1000)}")
            self._migrate()
        except sqlite3.DatabaseError as e:
            raise registry_error(e, self.path) from None

    def reopen(self) -> None:
        """Open the file again: SQLite keeps a file it opened read-only so for good, even once it is writable."""
        with contextlib.suppress(sqlite3.DatabaseError):
            self._db.close()
        self._open()

    def writable(self) -> bool:
        """Whether a write would go through now: a file (and directory) SQLite could open for writing,
        asked of the file itself, not of the connection (which keeps the mode it was opened in)."""
        return _file_writable(self.path)

    @property
    def read_only(self) -> bool:
        """From a newer autoslm (asked each time: a newer version may migrate the file while we run)."""
        if self.newer_version is None:
            try:
                version = self._db.execute("PRAGMA user_version").fetchone()[0]
            except sqlite3.DatabaseError as e:
                raise registry_error(e, self.path) from None
            if version > SCHEMA_VERSION:
                self.newer_version = version
        return self.newer_version is not None

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            self.newer_version = version  # read what we know, write nothing
            return
        if version == SCHEMA_VERSION:
            return
        if version == 0:
            self._check_unversioned()
        with self._tx():
            # Re-read under the write lock: another process may have migrated meanwhile.
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                for stmt in _SCHEMA.split(";"):
                    if stmt.strip():
                        self._db.execute(stmt)
                version = 1
            while version < SCHEMA_VERSION:
                for stmt in _MIGRATIONS[version].split(";"):
                    if stmt.strip():
                        self._db.execute(stmt)
                version += 1
            self._db.execute(f"PRAGMA user_version = {version}")

    def _check_unversioned(self) -> None:
        """A file of user_version 0 is either new (no tables) or of schema 1; anything else is not ours."""
        for table, want in _V1_COLUMNS.items():
            have = {r[1] for r in self._db.execute(f"PRAGMA table_info({table})").fetchall()}
            if have and have != want:
                missing, extra = sorted(want - have), sorted(have - want)
                raise RegistryCorrupt(
                    f"the run registry {self.path} has a {table} table whose columns match no autoslm schema "
                    f"(missing: {', '.join(missing) or 'none'}; unknown: {', '.join(extra) or 'none'})",
                    hint=f"nothing was changed; if it is not autoslm's, move it aside (mv {self.path} {self.path}.bad)",
                )

    def require_writable(self) -> None:
        if self.read_only:
            raise RegistryNewer(
                f"the run registry {self.path} has schema version {self.newer_version}, newer than this autoslm "
                f"knows ({SCHEMA_VERSION}): it is read-only here",
                hint="upgrade autoslm to launch, cancel or supervise runs from this home; status and list still read it",
            )

    @property
    def schema_version(self) -> int:
        return self._db.execute("PRAGMA user_version").fetchone()[0]
    def close(self) -> None:
        self._db.close()

    # -- runs -----------------------------------------------------------------------------------
    def create_run(self, run: RunRecord, seeds: list[int]) -> None:
        now = self.clock()
        with self._tx():
            self._db.execute(
                "INSERT INTO runs (run_id, name, phase, spec_json, spec_path, store_uri, created_at, deadline, cancel_requested) "
                "VALUES (:run_id, :name, :phase, :spec_json, :spec_path, :store_uri, :created_at, :deadline, :cancel_requested)",
                asdict(run),
            )
            for seed in seeds:
                self._db.execute(
                    "INSERT INTO replicas (run_id, seed, state, updated_at) VALUES (?, ?, ?, ?)",
                    (run.run_id, seed, RunState.PENDING, now),
                )

    def get_run(self, run_id: str) -> RunRecord | None:
        row = self._db.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return _run(row) if row else None

    def find_runs(self, prefix: str) -> list[RunRecord]:
        rows = self._db.execute(
            "SELECT * FROM runs WHERE run_id = ? OR run_id LIKE ? ORDER BY created_at",
            (prefix, prefix.replace("%", r"\%").replace("_", r"\_") + "%"),
        ).fetchall()
        exact = [r for r in rows if r["run_id"] == prefix]
        return [_run(r) for r in (exact or rows)]

    def list_runs(self, limit: int = 50) -> list[RunRecord]:
        rows = self._db.execute("SELECT * FROM runs ORDER BY created_at DESC LIMIT ?", (limit,)).fetchall()
        return [_run(r) for r in rows]

    def has_sweeps(self) -> bool:
        """Whether a sweep was ever recorded here (`list` loads the sweep code only then)."""
        try:
            return self._db.execute("SELECT 1 FROM sweeps LIMIT 1").fetchone() is not None
        except sqlite3.OperationalError:
            return False  # a file from before sweeps: none

    def all_run_ids(self) -> list[str]:
        return [r[0] for r in self._db.execute("SELECT run_id FROM runs").fetchall()]

    def request_cancel(self, run_id: str, reason: EndReason = EndReason.CANCELLED) -> None:
        """Ask whoever holds the run to end it; ``reason`` is the end reason it gets (a user's cancel,
        or its sweep's budget)."""
        with self._tx():
            self._db.execute("UPDATE runs SET cancel_requested = 1, cancel_reason = COALESCE(cancel_reason, ?) WHERE run_id = ?",
                             (str(reason), run_id))

    def cancel_reason(self, run_id: str) -> EndReason | None:
        """Why the run was asked to end (None when it was not)."""
        row = self._db.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None or not row["cancel_requested"]:
            return None
        return EndReason(_col(row, "cancel_reason") or EndReason.CANCELLED)

    # -- replicas -------------------------------------------------------------------------------
    def replicas(self, run_id: str) -> list[ReplicaRecord]:
        rows = self._db.execute("SELECT * FROM replicas WHERE run_id = ? ORDER BY seed", (run_id,)).fetchall()
        return [_replica(r) for r in rows]

    def replicas_of(self, run_ids: list[str]) -> dict[str, list[ReplicaRecord]]:
        """The replicas of many runs (`list` shows 200) in one query, by run id."""
        out: dict[str, list[ReplicaRecord]] = {run_id: [] for run_id in run_ids}
        if not run_ids:
            return out
        rows = self._db.execute(f"SELECT * FROM replicas WHERE run_id IN ({', '.join('?' * len(run_ids))}) ORDER BY run_id, seed",
                                list(run_ids)).fetchall()
        keys = [k for k in rows[0].keys() if k in _REPLICA_FIELDS] if rows else []
        for row in rows:
            out[row["run_id"]].append(ReplicaRecord(**{k: row[k] for k in keys}))
        return out

    def update_replica(self, run_id: str, seed: int, **changes) -> None:
        allowed = {f.name for f in fields(ReplicaRecord)} - {"run_id", "seed"}
        bad = set(changes) - allowed
        if bad:
            raise ValueError(f"unknown replica fields: {sorted(bad)}")
        if "end_reason" in changes and changes["end_reason"] is not None:
            changes["end_reason"] = str(EndReason(changes["end_reason"]))
        if "state" in changes and changes["state"] not in STATES:
            raise ValueError(f"unknown state {changes['state']!r}")
        changes["updated_at"] = self.clock()
        cols = ", ".join(f"{k} = :{k}" for k in changes)
        with self._tx():
            self._db.execute(f"UPDATE replicas SET {cols} WHERE run_id = :run_id AND seed = :seed", {**changes, "run_id": run_id, "seed": seed})

    def set_intent(self, run_id: str, seed: int, *, provider: str, name: str, attempt: int, window_s: float = 0.0) -> None:
        """Written before a create call: the next tick can find a pod whose id we never heard back.

        ``window_s``: how long the create may take to land (its calls, retries and the provider's
        lag); until then "not found by name" means "not yet". The bill starts here (``cost_at``): a
        pod is paid from its create, even one adopted much later."""
        now = self.clock()
        self.update_replica(run_id, seed, intent_provider=provider, intent_name=name, attempt=attempt, cost_at=now,
                            intent_until=now + window_s)

    def cancel_requested(self, run_id: str) -> bool:
        row = self._db.execute("SELECT cancel_requested FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return bool(row and row[0])

    # -- the per-run lease ------------------------------------------------------------------------
    def acquire_lease(self, run_id: str, owner: str, ttl_s: float, stale_s: float | None = None, *,
                      renew: bool = False) -> bool:
        """Take (or renew) the run's lease. False when another live owner holds it.

        Every renewal moves the lease's heartbeat (``beat_at``). ``stale_s``: a holder on this host
        that is stopped (SIGSTOP, a debugger) and whose heartbeat has not moved for that long holds
        nothing: a frozen supervisor must not keep a run unwatched until its lease expires. ``renew``:
        only keep a lease this owner still holds (one taken over meanwhile, even if since released, is
        lost: what its holder decided before it froze is stale)."""
        now = self.clock()
        with self._tx():
            row = self._db.execute("SELECT * FROM leases WHERE run_id = ?", (run_id,)).fetchone()
            if renew and (row is None or row["owner"] != owner):
                return False
            if row is not None and row["owner"] != owner and row["expires"] > now and _owner_alive(row["owner"]):
                beat = _col(row, "beat_at") or (row["expires"] - ttl_s)
                if stale_s is None or now - beat < stale_s or not _owner_stopped(row["owner"]):
                    return False
            taken = _col(row, "taken_at") if row is not None and row["owner"] == owner else None
            self._db.execute(
                "INSERT INTO leases (run_id, owner, expires, beat_at, taken_at) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT(run_id) DO UPDATE SET owner = excluded.owner, expires = excluded.expires, "
                "beat_at = excluded.beat_at, taken_at = excluded.taken_at",
                (run_id, owner, now + ttl_s, now, taken or now),
            )
        return True

    def release_lease(self, run_id: str, owner: str) -> None:
        with self._tx():
            self._db.execute("DELETE FROM leases WHERE run_id = ? AND owner = ?", (run_id, owner))

    def lease_owner(self, run_id: str) -> str | None:
        row = self._db.execute("SELECT owner, expires FROM leases WHERE run_id = ?", (run_id,)).fetchone()
        if row is None or row["expires"] <= self.clock() or not _owner_alive(row["owner"]):
            return None
        return row["owner"]

    def lease_info(self, run_id: str) -> dict | None:
        """Who holds the run (owner, pid, since when, heartbeat), or None when nobody live does."""
        row = self._db.execute("SELECT * FROM leases WHERE run_id = ?", (run_id,)).fetchone()
        if row is None or row["expires"] <= self.clock() or not _owner_alive(row["owner"]):
            return None
        pid = row["owner"].split(":")[1] if row["owner"].count(":") >= 2 else None
        return {"owner": row["owner"], "pid": int(pid) if pid and pid.isdigit() else None,
                "taken_at": _col(row, "taken_at"), "beat_at": _col(row, "beat_at"), "expires": row["expires"],
                "stopped": _owner_stopped(row["owner"])}

    def mark_ended(self, provider: str, pod_id: str, run_id: str) -> None:
        """A pod this home ended (and billed to its end): a provider that still lists it for a while
        must not make a later look bill it again as a stray."""
        with self._tx():
            self._db.execute("INSERT OR REPLACE INTO ended_pods VALUES (?, ?, ?, ?)", (provider, pod_id, run_id, self.clock()))

    def was_ended(self, provider: str, pod_id: str) -> bool:
        try:
            row = self._db.execute("SELECT 1 FROM ended_pods WHERE provider = ? AND pod_id = ?", (provider, pod_id)).fetchone()
        except sqlite3.OperationalError:
            return False  # a file from before the table (read-only here): nothing recorded
        return row is not None

    def live_pods(self) -> list[ReplicaRecord]:
        """Replicas whose pod may still be running (not terminal, or terminal with a pod id we hold)."""
        rows = self._db.execute("SELECT * FROM replicas WHERE pod_id IS NOT NULL").fetchall()
        return [_replica(r) for r in rows]

    def _tx(self):
        db = self._db

        path = self.path
        self.require_writable()

        class _Tx:
            def __enter__(self):
                try:
                    db.execute("BEGIN IMMEDIATE")  # waits up to LOCK_WAIT_S for another writer
                except sqlite3.DatabaseError as e:
                    raise registry_error(e, path) from None

            def __exit__(self, exc_type, exc, _tb):
                try:
                    db.execute("ROLLBACK" if exc_type else "COMMIT")
                except sqlite3.DatabaseError as e:
                    if exc_type is None:
                        with contextlib.suppress(sqlite3.DatabaseError):
                            db.execute("ROLLBACK")  # a failed COMMIT leaves the transaction open
                        raise registry_error(e, path) from None
                if isinstance(exc, sqlite3.DatabaseError):
                    raise registry_error(exc, path) from None
                return False

        return _Tx()


def lease_owner_id() -> str:
    """host:pid:nonce -- the pid lets a lease of a dead process on this host be taken at once."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"


def _col(row, name: str):
    """A column a file of this version has (None for one migrated by an older autoslm that lacks it)."""
    return row[name] if row is not None and name in row.keys() else None


def _owner_stopped(owner: str) -> bool:
    """A holder on this host that is stopped (SIGSTOP, ^Z, a debugger): it acts on nothing until resumed."""
    host, _, rest = owner.partition(":")
    pid_text = rest.split(":", 1)[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    try:
        return Path(f"/proc/{pid_text}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def _owner_alive(owner: str) -> bool:
    host, _, rest = owner.partition(":")
    pid_text = rest.split(":", 1)[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return True  # another machine's process: only the expiry can tell
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (killed, not yet reaped by its parent) holds nothing
        return Path(f"/proc/{pid_text}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
