"""The run registry: which runs this machine launched, and what became of them. SQLite under $AUTOSLM_HOME.

One file, four jobs, one module each:

- ``schema.py``: the tables, the schema version and its migrations, and what an SQLite error on the
  file means (locked, read-only, damaged).
- ``leases.py``: the per-run lease (one actor per run), its fencing token, and whether a process is
  alive, stopped or dead (``/proc``).
- ``runs.py``: runs, replicas, launch intents, the pods ended here; a tick's one read (``look``) and
  its one fenced write (``apply``).
- ``sweeps.py``: a sweep's rows and its members'.

``Registry`` is them on one connection. A rollback journal (not WAL) and short transactions: WAL's
shared-memory index is a memory map, and a process touching a map whose file another process
truncated or replaced (a file made read-only, a home on a flaky mount) dies of SIGBUS with nothing
said. No memory map at all (``mmap_size = 0``), so a registry that goes read-only or away is an
error, never a crash.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from pathlib import Path

from autoslm.controller.registry.leases import (  # noqa: F401 - the registry's public names
    Fence,
    LeaseLost,
    LeasesMixin,
    lease_owner_id,
    owner_state,
    pid_state,
)
from autoslm.controller.registry.runs import (  # noqa: F401
    STATES,
    TERMINAL,
    EndReason,
    ReplicaRecord,
    RunLook,
    RunRecord,
    RunsMixin,
    RunState,
    run_state,
)
from autoslm.controller.registry.schema import (  # noqa: F401
    _SCHEMA,
    LOCK_SLICE_S,
    LOCK_WAIT_S,
    MIGRATIONS,
    SCHEMA_VERSION,
    PatientConnection,
    Transaction,
    file_writable,
    is_busy,
    lock_holder,
    migrate,
    registry_error,
)
from autoslm.controller.registry.sweeps import SweepsMixin
from autoslm.errors import RegistryCorrupt, RegistryLocked, RegistryNewer, RegistryReadOnly  # noqa: F401 - as the registry's own

_MIGRATIONS = MIGRATIONS  # the name older tests and tools know


class Registry(RunsMixin, LeasesMixin, SweepsMixin):
    def __init__(self, home: Path, clock=time.time, lock_wait_s: float = LOCK_WAIT_S):
        self.lock_wait_s = lock_wait_s
        self.path = Path(home) / "registry.db"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.clock = clock
        self.newer_version: int | None = None  # set when the file is from a newer autoslm (read-only here)
        self._open()

    def _open(self) -> None:
        try:
            # Lock waits are slices of LOCK_SLICE_S inside SQLite, asked again in Python up to lock_wait_s
            # (PatientConnection): a signal is acted on at once, not after the whole wait.
            self._db = sqlite3.connect(self.path, timeout=LOCK_SLICE_S, isolation_level=None, factory=PatientConnection)
            self._db.patience = self.lock_wait_s
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA mmap_size=0")  # reads through read(2): a truncated file is an error, not SIGBUS
            if self._db.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
                # A file left in WAL mode (by an older autoslm): leave it, with no wait, when no one
                # else has it open; otherwise it stays WAL until a later open finds it free.
                self._db.execute("PRAGMA busy_timeout=0")
                with contextlib.suppress(sqlite3.DatabaseError), self._db.waiting_at_most(0):
                    self._db.execute("PRAGMA journal_mode=DELETE")
            self._db.execute(f"PRAGMA busy_timeout={int(LOCK_SLICE_S * 1000)}")
            self.newer_version = migrate(self._db, self.path, lambda: Transaction(self._db, self.path))
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
        return file_writable(self.path)

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

    def waiting_at_most(self, seconds: float):
        """Wait at most ``seconds`` for another process's lock inside this block (a command on its way
        out after Ctrl-C reads or writes what it can at once, and leaves the rest)."""
        return self._db.waiting_at_most(seconds)

    def _tx(self) -> Transaction:
        """A write transaction (refused on a file from a newer autoslm)."""
        self.require_writable()
        return Transaction(self._db, self.path)

    def _read(self) -> Transaction:
        """A read transaction: what it reads is one moment of the file."""
        return Transaction(self._db, self.path, begin="BEGIN")
