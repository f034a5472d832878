"""Runs and replicas in the registry: one row per run (its JobSpec, store, deadline), one per replica
(a seed: its pod, attempts, cost, state), and the pods this home ended.

A launch intent (the attempt's pod name and provider) is written before the create call, so a crash
between create and record leaves a name the next tick can look up and adopt or terminate. The intent
carries the time until which its create may still land (``intent_until``): before then, a lookup that
finds nothing means "not yet", never "nothing there", so no other process creates that name again.

A supervisor's tick takes the run's lease and reads what it needs in one transaction
(``take_and_look``), and writes what it decided in one more (``apply``), where its lease is checked
(the fence) and let go.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING

from autoslm.controller.registry.leases import Fence, _col
from autoslm.controller.state import STATES, TERMINAL, EndReason, RunState, run_state  # noqa: F401 - re-exported

if TYPE_CHECKING:
    from autoslm.spec import JobSpec, ServeSpec


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
    cancel_reason: str | None = None  # an EndReason: a user's cancel, or the run's sweep spent its budget

    @functools.cached_property
    def spec(self) -> JobSpec | ServeSpec:
        """The run's JobSpec of its kind (a serve's is a ``ServeSpec``), parsed from ``spec_json`` once per
        record, when first asked (``list`` and ``status`` read records without it)."""
        from autoslm.spec import spec_from_json

        return spec_from_json(self.spec_json)

    def share_spec(self, held: RunRecord) -> None:
        """This run read again (a tick's look): take the parsed JobSpec of the record a caller holds, so
        a run is parsed once per record held, not once per read. A run's ``spec_json`` never changes."""
        if held is not self and held.run_id == self.run_id and held.spec_json == self.spec_json:
            self.__dict__["spec"] = held.spec  # where ``cached_property`` keeps it


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
    teardown_error: str | None = None  # the provider's last refusal to end pod_id
    teardown_failures: int = 0  # terminates of pod_id refused in a row (0: none, or it ended)
    teardown_since: float | None = None  # when the first of them was refused
    nodes: str | None = None  # a replica of several pods: each node's last look, JSON (controller/nodes.py)

    @property
    def terminal(self) -> bool:
        return RunState(self.state).terminal


@dataclass
class RunLook:
    """What one tick reads of a run, in one read transaction."""

    run: RunRecord
    replicas: list[ReplicaRecord]
    ended: set[tuple[str, str]] = field(default_factory=set)  # (provider, pod id) of this run's pods ended here

    @property
    def cancel_requested(self) -> bool:
        return bool(self.run.cancel_requested)

    @property
    def cancel_reason(self) -> EndReason | None:
        """Why the run was asked to end (None when it was not)."""
        return EndReason(self.run.cancel_reason or EndReason.CANCELLED) if self.run.cancel_requested else None


_RUN_FIELDS = frozenset(f.name for f in fields(RunRecord))
_REPLICA_FIELDS = frozenset(f.name for f in fields(ReplicaRecord))
_REPLICA_WRITABLE = _REPLICA_FIELDS - {"run_id", "seed"}


def _run(row) -> RunRecord:
    # Only the columns this version knows: a newer file may have more.
    return RunRecord(**{k: row[k] for k in row.keys() if k in _RUN_FIELDS})


def _replica(row) -> ReplicaRecord:
    return ReplicaRecord(**{k: row[k] for k in row.keys() if k in _REPLICA_FIELDS})


def _records(cursor, cls, known: frozenset[str]) -> list:
    """Every row of a ``SELECT *`` as ``cls``, the columns matched to fields once (not per row, as
    ``_run``/``_replica`` do): `list` reads 200 runs and their replicas this way."""
    names = [d[0] for d in cursor.description]
    keep = [(i, name) for i, name in enumerate(names) if name in known]
    return [cls(**{name: row[i] for i, name in keep}) for row in cursor.fetchall()]


def check_replica_changes(changes: dict) -> dict:
    """The changes as stored (an end reason as its word), or ValueError naming an unknown field or state."""
    bad = set(changes) - _REPLICA_WRITABLE
    if bad:
        raise ValueError(f"unknown replica fields: {sorted(bad)}")
    if "state" in changes and changes["state"] not in STATES:
        raise ValueError(f"unknown state {changes['state']!r}")
    if changes.get("end_reason") is not None:
        changes = {**changes, "end_reason": str(EndReason(changes["end_reason"]))}
    return changes


class RunsMixin:
    """The runs, replicas and ended_pods tables, on the registry's connection and transactions."""

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
        return _records(self._db.execute("SELECT * FROM runs ORDER BY created_at DESC LIMIT ?", (limit,)), RunRecord, _RUN_FIELDS)

    def all_run_ids(self) -> list[str]:
        return [r[0] for r in self._db.execute("SELECT run_id FROM runs").fetchall()]

    def request_cancel(self, run_id: str, reason: EndReason = EndReason.CANCELLED) -> None:
        """Ask whoever holds the run to end it; ``reason`` is the end reason it gets (a user's cancel,
        or its sweep's budget)."""
        with self._tx():
            self._db.execute(
                "UPDATE runs SET cancel_requested = 1, cancel_reason = COALESCE(cancel_reason, ?) WHERE run_id = ?",
                (str(reason), run_id),
            )

    def cancel_reason(self, run_id: str) -> EndReason | None:
        """Why the run was asked to end (None when it was not)."""
        row = self._db.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None or not row["cancel_requested"]:
            return None
        return EndReason(_col(row, "cancel_reason") or EndReason.CANCELLED)

    def cancel_requested(self, run_id: str) -> bool:
        row = self._db.execute("SELECT cancel_requested FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return bool(row and row[0])

    # -- replicas -------------------------------------------------------------------------------
    def replicas(self, run_id: str) -> list[ReplicaRecord]:
        rows = self._db.execute("SELECT * FROM replicas WHERE run_id = ? ORDER BY seed", (run_id,)).fetchall()
        return [_replica(r) for r in rows]

    def replicas_of(self, run_ids: list[str]) -> dict[str, list[ReplicaRecord]]:
        """The replicas of many runs (`list` shows 200) in one query, by run id."""
        out: dict[str, list[ReplicaRecord]] = {run_id: [] for run_id in run_ids}
        if not run_ids:
            return out
        cursor = self._db.execute(
            f"SELECT * FROM replicas WHERE run_id IN ({', '.join('?' * len(run_ids))}) ORDER BY run_id, seed", list(run_ids)
        )
        for replica in _records(cursor, ReplicaRecord, _REPLICA_FIELDS):
            out[replica.run_id].append(replica)
        return out

    def update_replica(self, run_id: str, seed: int, *, fence: Fence | None = None, **changes) -> None:
        """Write one replica's changes; with ``fence``, only while that lease is still the run's."""
        self.apply(fence, {(run_id, seed): changes})

    def set_intent(
        self, run_id: str, seed: int, *, provider: str, name: str, attempt: int, window_s: float = 0.0, fence: Fence | None = None
    ) -> None:
        """Written before a create call: the next tick can find a pod whose id we never heard back.

        ``window_s``: how long the create may take to land (its calls, retries and the provider's
        lag); until then "not found by name" means "not yet". The bill starts here (``cost_at``): a
        pod is paid from its create, even one adopted much later."""
        now = self.clock()
        self.update_replica(
            run_id,
            seed,
            fence=fence,
            intent_provider=provider,
            intent_name=name,
            attempt=attempt,
            cost_at=now,
            intent_until=now + window_s,
        )

    def look(self, run_id: str) -> RunLook | None:
        """The run, its replicas and the pods of it ended here, as of one moment (one read transaction)."""
        with self._read():
            return self._look(run_id)

    def take_and_look(
        self, run_id: str, owner: str, ttl_s: float, stale_s: float | None = None, *, hung_s: float | None = None
    ) -> tuple[Fence | None, RunLook | None]:
        """A tick's one read: take the run's lease (see ``take_lease``) and, when taken, read what the
        tick needs, in one transaction. (None, None) when another live, fresh owner holds the lease."""
        with self._tx():
            fence = self._take(run_id, owner, ttl_s, stale_s, hung_s=hung_s)
            return (fence, self._look(run_id)) if fence is not None else (None, None)

    def _look(self, run_id: str) -> RunLook | None:
        row = self._db.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            return None
        replicas = [_replica(r) for r in self._db.execute("SELECT * FROM replicas WHERE run_id = ? ORDER BY seed", (run_id,))]
        ended = {(r[0], r[1]) for r in self._db.execute("SELECT provider, pod_id FROM ended_pods WHERE run_id = ?", (run_id,))}
        return RunLook(_run(row), replicas, ended)

    def apply(
        self,
        fence: Fence | None,
        changes: dict[tuple[str, int], dict],
        ended: list[tuple[str, str, str]] = (),
        ttl_s: float | None = None,
        *,
        release: bool = False,
    ) -> None:
        """Write decided changes in one transaction: replica columns by (run id, seed), and pods ended
        (provider, pod id, run id). With ``fence``: refused (``LeaseLost``, nothing written) unless the
        lease is still the one the decisions were made under; with ``ttl_s`` it is renewed, with
        ``release`` let go (a tick's last write)."""
        changes = {key: check_replica_changes(c) for key, c in changes.items()}
        now = self.clock()
        with self._tx():
            if fence is not None:
                self.check_fence(fence, ttl_s)
            for (run_id, seed), c in changes.items():
                if not c:
                    continue
                c = {**c, "updated_at": now}
                cols = ", ".join(f"{k} = :{k}" for k in c)
                self._db.execute(
                    f"UPDATE replicas SET {cols} WHERE run_id = :run_id AND seed = :seed", {**c, "run_id": run_id, "seed": seed}
                )
            for provider, pod_id, run_id in ended:
                self._db.execute("INSERT OR REPLACE INTO ended_pods VALUES (?, ?, ?, ?)", (provider, pod_id, run_id, now))
            if fence is not None and release:
                self._release(fence.run_id, fence.owner)

    def mark_ended(self, provider: str, pod_id: str, run_id: str, *, fence: Fence | None = None) -> None:
        """A pod this home ended (and billed to its end): a provider that still lists it for a while
        must not make a later look bill it again as a stray."""
        self.apply(fence, {}, [(provider, pod_id, run_id)])

    def was_ended(self, provider: str, pod_id: str) -> bool:
        import sqlite3

        try:
            row = self._db.execute("SELECT 1 FROM ended_pods WHERE provider = ? AND pod_id = ?", (provider, pod_id)).fetchone()
        except sqlite3.OperationalError:
            return False  # a file from before the table (read-only here): nothing recorded
        return row is not None

    def live_pods(self) -> list[ReplicaRecord]:
        """Replicas whose pod may still be running (not terminal, or terminal with a pod id we hold)."""
        rows = self._db.execute("SELECT * FROM replicas WHERE pod_id IS NOT NULL").fetchall()
        return [_replica(r) for r in rows]
