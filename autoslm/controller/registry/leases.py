"""The per-run lease: exactly one actor per run, and a fencing token that keeps a stale one's hands off.

A lease is a row (run id, owner ``host:pid:nonce``, expiry, heartbeat ``beat_at``, ``generation``),
taken in an IMMEDIATE transaction. Every launch, terminate and state change happens under it. A
lease whose owner process is gone (same host, a dead pid) is free at once, so a SIGKILLed `launch`
does not block `cancel`. A holder whose heartbeat is stale is taken over: one on this host that is
stopped (SIGSTOP, ^Z, a debugger) after ``stale_s``; any holder, on any host, that has not beaten for
``hung_s``. A frozen or hung supervisor must not keep a run unwatched until its lease expires.

The fencing token is the lease's ``generation``: it grows each time the lease is taken afresh (by
another owner, or by the same one after letting go). A holder keeps the generation it took
(``Fence``), and every write it decided carries it (``check_fence`` inside that write's own
transaction): once another process took the lease since, the write is refused with ``LeaseLost``,
so a holder that resumes after being taken over writes nothing and stops.

A run's background supervisor holds a lease of its own for as long as it supervises (``standing``,
keyed ``RUN_ID#supervisor``: ``controller/daemon.py``) and beats it every few seconds; a stale one is
taken over by the supervisor a command starts in its place.

Whether a process is alive, stopped or dead is asked in one place (``autoslm.procs.pid_state``), for
leases, the supervisors' pidfiles and local pods alike: a zombie (``Z``) or a dying process (``X``)
holds nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from autoslm.procs import ALIVE, DEAD, GONE, STOPPED, pid_state


class LeaseLost(Exception):
    """Another process took this run's lease since we took it: what we decided is stale; stop acting."""


@dataclass(frozen=True)
class Fence:
    """The lease a holder took: writes it decided go through only while the lease is still this one."""

    run_id: str
    owner: str
    generation: int


def _hostname() -> str:
    import socket  # here, not at the top: `list` and `status` read the registry without it

    return socket.gethostname()


def owner_pid(owner: str) -> int | None:
    """The pid in an owner id ``host:pid:nonce``."""
    parts = owner.split(":")
    return int(parts[1]) if len(parts) >= 3 and parts[1].isdigit() else None


def owner_state(owner: str) -> str:
    """``pid_state`` of a lease owner on this host; ``alive`` for another machine's (only time tells)."""
    host = owner.partition(":")[0]
    pid = owner_pid(owner)
    if host != _hostname() or pid is None:
        return ALIVE
    return pid_state(pid)


def lease_owner_id() -> str:
    """host:pid:nonce -- the pid lets a lease of a dead process on this host be taken at once."""
    return f"{_hostname()}:{os.getpid()}:{os.urandom(3).hex()}"


def _col(row, name: str):
    """A column a file of this version has (None for one migrated by an older autoslm that lacks it)."""
    return row[name] if row is not None and name in row.keys() else None


def _held(row, now: float) -> bool:
    """Someone holds the lease now: not let go, not expired, its owner not dead."""
    return row is not None and row["expires"] > now and owner_state(row["owner"]) not in (GONE, DEAD)


def is_stale(row, now: float, ttl_s: float, stale_s: float | None, hung_s: float | None) -> bool:
    """A held lease whose holder has stopped acting: stopped here past ``stale_s``, silent past ``hung_s``."""
    beat = _col(row, "beat_at") or (row["expires"] - ttl_s)
    age = now - beat
    if hung_s is not None and age >= hung_s:
        return True
    return stale_s is not None and age >= stale_s and owner_state(row["owner"]) == STOPPED


class LeasesMixin:
    """The leases table, on the registry's connection (``_db``) and transactions (``_tx``)."""

    def take_lease(
        self,
        run_id: str,
        owner: str,
        ttl_s: float,
        stale_s: float | None = None,
        *,
        hung_s: float | None = None,
        renew: bool = False,
        standing: bool = False,
    ) -> Fence | None:
        """Take (or renew) the run's lease; None when another live, fresh owner holds it.

        Every renewal moves the heartbeat (``beat_at``). ``renew``: only keep a lease this owner still
        holds (one taken over meanwhile, even if since released, is lost: what its holder decided
        before it froze is stale). ``standing``: the holder keeps it between looks (a supervisor)."""
        with self._tx():
            return self._take(run_id, owner, ttl_s, stale_s, hung_s=hung_s, renew=renew, standing=standing)

    def _take(
        self,
        run_id: str,
        owner: str,
        ttl_s: float,
        stale_s: float | None,
        *,
        hung_s: float | None,
        renew: bool = False,
        standing: bool = False,
    ) -> Fence | None:
        """``take_lease`` inside the caller's write transaction."""
        now = self.clock()
        row = self._db.execute("SELECT * FROM leases WHERE run_id = ?", (run_id,)).fetchone()
        mine = row is not None and row["owner"] == owner and row["expires"] > 0
        if renew and not mine:
            return None
        if not mine and _held(row, now) and not is_stale(row, now, ttl_s, stale_s, hung_s):
            return None
        generation = (_col(row, "generation") or 0) + (0 if mine else 1)
        taken = _col(row, "taken_at") if mine else None
        self._db.execute(
            "INSERT INTO leases (run_id, owner, expires, beat_at, taken_at, generation, standing) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(run_id) DO UPDATE SET owner = excluded.owner, "
            "expires = excluded.expires, beat_at = excluded.beat_at, taken_at = excluded.taken_at, "
            "generation = excluded.generation, standing = excluded.standing",
            (run_id, owner, now + ttl_s, now, taken or now, generation, int(standing)),
        )
        return Fence(run_id, owner, generation)

    def acquire_lease(
        self,
        run_id: str,
        owner: str,
        ttl_s: float,
        stale_s: float | None = None,
        *,
        renew: bool = False,
        hung_s: float | None = None,
    ) -> bool:
        """``take_lease``, answered as whether it was taken."""
        return self.take_lease(run_id, owner, ttl_s, stale_s, hung_s=hung_s, renew=renew) is not None

    def check_fence(self, fence: Fence, ttl_s: float | None = None) -> None:
        """Inside a write transaction: raise ``LeaseLost`` unless ``fence`` is still the run's lease;
        with ``ttl_s``, renew it (its heartbeat moves with every write its holder makes)."""
        row = self._db.execute("SELECT owner, expires, generation FROM leases WHERE run_id = ?", (fence.run_id,)).fetchone()
        if row is None or row["owner"] != fence.owner or row["expires"] <= 0 or (row["generation"] or 0) != fence.generation:
            raise LeaseLost(fence.run_id)
        if ttl_s is not None:
            now = self.clock()
            self._db.execute("UPDATE leases SET expires = ?, beat_at = ? WHERE run_id = ?", (now + ttl_s, now, fence.run_id))

    def beat(self, fence: Fence, ttl_s: float) -> None:
        """Renew a held lease (its heartbeat); ``LeaseLost`` when another process took it since."""
        with self._tx():
            self.check_fence(fence, ttl_s)

    def holds(self, fence: Fence) -> bool:
        """Whether ``fence`` is still the run's lease (a read: asked right before acting on a provider)."""
        row = self._db.execute("SELECT owner, expires, generation FROM leases WHERE run_id = ?", (fence.run_id,)).fetchone()
        return (
            row is not None
            and row["owner"] == fence.owner
            and row["expires"] > 0
            and (row["generation"] or 0) == fence.generation
        )

    def release_lease(self, run_id: str, owner: str) -> None:
        """Let go (the row stays, with its generation: the next holder's is higher)."""
        with self._tx():
            self._release(run_id, owner)

    def _release(self, run_id: str, owner: str) -> None:
        self._db.execute("UPDATE leases SET expires = 0, standing = 0 WHERE run_id = ? AND owner = ?", (run_id, owner))

    def lease_owner(self, run_id: str) -> str | None:
        row = self._db.execute("SELECT * FROM leases WHERE run_id = ?", (run_id,)).fetchone()
        return row["owner"] if _held(row, self.clock()) else None

    def lease_info(self, run_id: str) -> dict | None:
        """Who holds the run (owner, pid, since when, heartbeat, generation), or None when nobody live does."""
        row = self._db.execute("SELECT * FROM leases WHERE run_id = ?", (run_id,)).fetchone()
        if not _held(row, self.clock()):
            return None
        return {
            "owner": row["owner"],
            "pid": owner_pid(row["owner"]),
            "taken_at": _col(row, "taken_at"),
            "beat_at": _col(row, "beat_at"),
            "expires": row["expires"],
            "generation": _col(row, "generation") or 0,
            "standing": bool(_col(row, "standing")),
            "stopped": owner_state(row["owner"]) == STOPPED,
        }

    def lease_is_stale(self, run_id: str, ttl_s: float, stale_s: float | None, hung_s: float | None) -> bool:
        """Someone holds the run's lease and has stopped acting (see ``is_stale``)."""
        row = self._db.execute("SELECT * FROM leases WHERE run_id = ?", (run_id,)).fetchone()
        now = self.clock()
        return _held(row, now) and is_stale(row, now, ttl_s, stale_s, hung_s)
