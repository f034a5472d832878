"""The run registry: which runs this machine launched, and what became of them. SQLite under $AUTOSLM_HOME.

One row per run (its JobSpec, store, deadline) and one per replica (a seed: its pod, attempts, cost,
state). WAL mode and short transactions, so a `status` in one terminal and a `launch` following the
run in another never block each other for long.

Exactly one actor per run: every launch, terminate and state change happens under the run's lease (a
row with an owner and an expiry, taken in an IMMEDIATE transaction). A lease whose owner process is
gone (same host, dead pid) is free at once, so a SIGKILLed `launch` does not block `cancel`.
A launch intent (the attempt's pod name and provider) is written before the create call, so a crash
between create and record leaves a name the next tick can look up and adopt or terminate.

The schema carries a version (``PRAGMA user_version``); ``_MIGRATIONS`` brings an older file up to
date. A file SQLite cannot read raises ``RegistryCorrupt`` naming it (gc still works without it).
"""

from __future__ import annotations

import os
import socket
import sqlite3
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from autoslm.errors import AutoslmError

TERMINAL = ("succeeded", "failed", "cancelled")
STATES = ("pending", "provisioning", "running", "recovering", *TERMINAL)

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
SCHEMA_VERSION = 3
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
}


class RegistryCorrupt(AutoslmError):
    """The registry file exists but SQLite cannot read it."""

    exit_code = 1


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

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


class Registry:
    def __init__(self, home: Path, clock=time.time):
        self.path = Path(home) / "registry.db"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.clock = clock
        try:
            self._db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA busy_timeout=30000")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._migrate()
        except sqlite3.DatabaseError as e:
            raise RegistryCorrupt(
                f"the run registry {self.path} is damaged ({e})",
                hint=f"move it aside (mv {self.path} {self.path}.bad) to start a fresh one; "
                "`autoslm gc` still finds and stops this home's pods from the providers' own lists",
            ) from None

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise RegistryCorrupt(
                f"the run registry {self.path} has schema version {version}, newer than this autoslm knows ({SCHEMA_VERSION})",
                hint="upgrade autoslm",
            )
        if version == SCHEMA_VERSION:
            return
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
                "INSERT INTO runs VALUES (:run_id, :name, :phase, :spec_json, :spec_path, :store_uri, :created_at, :deadline, :cancel_requested)",
                asdict(run),
            )
            for seed in seeds:
                self._db.execute(
                    "INSERT INTO replicas (run_id, seed, state, updated_at) VALUES (?, ?, 'pending', ?)",
                    (run.run_id, seed, now),
                )

    def get_run(self, run_id: str) -> RunRecord | None:
        row = self._db.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return RunRecord(**dict(row)) if row else None

    def find_runs(self, prefix: str) -> list[RunRecord]:
        rows = self._db.execute(
            "SELECT * FROM runs WHERE run_id = ? OR run_id LIKE ? ORDER BY created_at",
            (prefix, prefix.replace("%", r"\%").replace("_", r"\_") + "%"),
        ).fetchall()
        exact = [r for r in rows if r["run_id"] == prefix]
        return [RunRecord(**dict(r)) for r in (exact or rows)]

    def list_runs(self, limit: int = 50) -> list[RunRecord]:
        rows = self._db.execute("SELECT * FROM runs ORDER BY created_at DESC LIMIT ?", (limit,)).fetchall()
        return [RunRecord(**dict(r)) for r in rows]

    def all_run_ids(self) -> list[str]:
        return [r[0] for r in self._db.execute("SELECT run_id FROM runs").fetchall()]

    def request_cancel(self, run_id: str) -> None:
        with self._tx():
            self._db.execute("UPDATE runs SET cancel_requested = 1 WHERE run_id = ?", (run_id,))

    # -- replicas -------------------------------------------------------------------------------
    def replicas(self, run_id: str) -> list[ReplicaRecord]:
        rows = self._db.execute("SELECT * FROM replicas WHERE run_id = ? ORDER BY seed", (run_id,)).fetchall()
        return [ReplicaRecord(**dict(r)) for r in rows]

    def update_replica(self, run_id: str, seed: int, **changes) -> None:
        allowed = {f.name for f in fields(ReplicaRecord)} - {"run_id", "seed"}
        bad = set(changes) - allowed
        if bad:
            raise ValueError(f"unknown replica fields: {sorted(bad)}")
        if "state" in changes and changes["state"] not in STATES:
            raise ValueError(f"unknown state {changes['state']!r}")
        changes["updated_at"] = self.clock()
        cols = ", ".join(f"{k} = :{k}" for k in changes)
        with self._tx():
            self._db.execute(f"UPDATE replicas SET {cols} WHERE run_id = :run_id AND seed = :seed", {**changes, "run_id": run_id, "seed": seed})

    def set_intent(self, run_id: str, seed: int, *, provider: str, name: str, attempt: int) -> None:
        """Written before a create call: the next tick can find a pod whose id we never heard back."""
        self.update_replica(run_id, seed, intent_provider=provider, intent_name=name, attempt=attempt)

    def cancel_requested(self, run_id: str) -> bool:
        row = self._db.execute("SELECT cancel_requested FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return bool(row and row[0])

    # -- the per-run lease ------------------------------------------------------------------------
    def acquire_lease(self, run_id: str, owner: str, ttl_s: float) -> bool:
        """Take (or renew) the run's lease. False when another live owner holds it."""
        now = self.clock()
        with self._tx():
            row = self._db.execute("SELECT owner, expires FROM leases WHERE run_id = ?", (run_id,)).fetchone()
            if row is not None and row["owner"] != owner and row["expires"] > now and _owner_alive(row["owner"]):
                return False
            self._db.execute(
                "INSERT INTO leases (run_id, owner, expires) VALUES (?, ?, ?) "
                "ON CONFLICT(run_id) DO UPDATE SET owner = excluded.owner, expires = excluded.expires",
                (run_id, owner, now + ttl_s),
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

    def live_pods(self) -> list[ReplicaRecord]:
        """Replicas whose pod may still be running (not terminal, or terminal with a pod id we hold)."""
        rows = self._db.execute("SELECT * FROM replicas WHERE pod_id IS NOT NULL").fetchall()
        return [ReplicaRecord(**dict(r)) for r in rows]

    def _tx(self):
        db = self._db

        class _Tx:
            def __enter__(self):
                db.execute("BEGIN IMMEDIATE")

            def __exit__(self, exc_type, *_):
                db.execute("ROLLBACK" if exc_type else "COMMIT")

        return _Tx()


def lease_owner_id() -> str:
    """host:pid:nonce -- the pid lets a lease of a dead process on this host be taken at once."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"


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


def run_state(replicas: list[ReplicaRecord]) -> str:
    """A run's state from its replicas' states."""
    states = {r.state for r in replicas}
    if states <= set(TERMINAL):
        if states == {"succeeded"}:
            return "succeeded"
        return "cancelled" if "cancelled" in states else "failed"
    for s in ("running", "recovering", "provisioning", "pending"):
        if s in states:
            return s
    return "pending"

