"""The run registry: which runs this machine launched, and what became of them. SQLite under $AUTOSLM_HOME.

One row per run (its JobSpec, store, deadline) and one per replica (a seed: its pod, attempts, cost,
state). WAL mode and short transactions, so a `status` in one terminal and a `launch` following the
run in another never block each other for long.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

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

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


class Registry:
    def __init__(self, home: Path, clock=time.time):
        self.path = Path(home) / "registry.db"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.clock = clock
        self._db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA busy_timeout=30000")
        self._db.executescript(_SCHEMA)

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

