"""Sweeps in the registry: a sweep and its members, one per (point, seed), as rows (dicts of columns).

A member's run row is created when the member starts; its run id is chosen at once, so a restart
never doubles it. The scheduler that reads and writes these rows is ``controller/sweeps.py``.
"""

from __future__ import annotations

_KEYS = {"sweeps": ("sweep_id",), "sweep_members": ("sweep_id", "member")}


class SweepsMixin:
    """The sweeps and sweep_members tables, on the registry's connection and transactions."""

    def _sweep_tables(self) -> bool:
        """Whether the file has the sweeps tables (a newer file read here may not be migrated by us)."""
        return self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'sweeps'").fetchone() is not None

    def has_sweeps(self) -> bool:
        """Whether a sweep was ever recorded here (`list` loads the sweep code only then)."""
        return self._sweep_tables() and self._db.execute("SELECT 1 FROM sweeps LIMIT 1").fetchone() is not None

    def _columns(self, table: str, names) -> list[str]:
        """``names`` checked against the table's own columns (a field no column has is a bug, said here)."""
        have = {r[1] for r in self._db.execute(f"PRAGMA table_info({table})").fetchall()}
        bad = set(names) - have
        if bad:
            raise ValueError(f"unknown {table} fields: {sorted(bad)}")
        return list(names)

    def _insert(self, table: str, row: dict) -> None:
        cols = self._columns(table, row)
        self._db.execute(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join(':' + c for c in cols)})", row)

    def _update(self, table: str, keys: dict, changes: dict) -> None:
        cols = self._columns(table, changes)
        if set(cols) & set(_KEYS[table]):
            raise ValueError(f"{table}: its key columns never change")
        where = " AND ".join(f"{k} = :{k}" for k in keys)
        with self._tx():
            self._db.execute(f"UPDATE {table} SET {', '.join(f'{c} = :{c}' for c in cols)} WHERE {where}", {**changes, **keys})

    def insert_sweep(self, sweep: dict, members: list[dict]) -> None:
        """A sweep's row and its members' (columns by name), in one transaction."""
        with self._tx():
            self._insert("sweeps", sweep)
            for m in members:
                self._insert("sweep_members", m)

    def sweep_row(self, sweep_id: str) -> dict | None:
        if not self._sweep_tables():
            return None
        row = self._db.execute("SELECT * FROM sweeps WHERE sweep_id = ?", (sweep_id,)).fetchone()
        return dict(row) if row else None

    def find_sweep_rows(self, prefix: str) -> list[dict]:
        """Sweeps whose id is ``prefix`` (that one alone), else starts with it, oldest first."""
        if not self._sweep_tables():
            return []
        rows = self._db.execute(
            "SELECT * FROM sweeps WHERE sweep_id = ? OR sweep_id LIKE ? ESCAPE '\\' ORDER BY created_at",
            (prefix, prefix.replace("%", r"\%").replace("_", r"\_") + "%"),
        ).fetchall()
        exact = [r for r in rows if r["sweep_id"] == prefix]
        return [dict(r) for r in (exact or rows)]

    def open_sweep_ids(self) -> list[str]:
        """Sweeps that have not stopped starting members (their supervisor may still have work)."""
        if not self._sweep_tables():
            return []
        return [r[0] for r in self._db.execute("SELECT sweep_id FROM sweeps WHERE stopped IS NULL").fetchall()]

    def member_rows(self, sweep_id: str) -> list[dict]:
        if not self._sweep_tables():
            return []
        rows = self._db.execute("SELECT * FROM sweep_members WHERE sweep_id = ? ORDER BY member", (sweep_id,)).fetchall()
        return [dict(r) for r in rows]

    def sweep_of_run(self, run_id: str) -> str | None:
        if not self._sweep_tables():
            return None
        row = self._db.execute("SELECT sweep_id FROM sweep_members WHERE run_id = ?", (run_id,)).fetchone()
        return row[0] if row else None

    def update_member(self, sweep_id: str, member: int, **changes) -> None:
        self._update("sweep_members", {"sweep_id": sweep_id, "member": member}, changes)

    def update_sweep(self, sweep_id: str, **changes) -> None:
        self._update("sweeps", {"sweep_id": sweep_id}, changes)
