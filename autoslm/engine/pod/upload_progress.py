"""The worker's progress on its way to the store (engine/pod/uploader.py): the newest heartbeat and
every event not yet written, which go up together in one commit.

Heartbeats coalesce (newest wins) and events batch until the uploader's schedule gives them a commit
(engine/pod/upload_schedule.py). events.jsonl is rewritten whole from this copy, seeded once from the
store so a resumed run appends; a torn last line left by a crash is closed first. A store down for days
must not exhaust memory: past ``MAX_PENDING_EVENTS`` the oldest events go first, and are counted.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

from autoslm.layout import Heartbeat
from autoslm.secrets import redact
from autoslm.store.artifacts import RunArtifacts

MAX_PENDING_EVENTS = 100_000


class PendingProgress:
    """What the worker said and the store does not show yet. The uploader holds ``lock`` around every
    call but ``write``, which takes it around what it reads and what it clears, never around the commit."""

    def __init__(self, lock: threading.Condition, clock: Callable[[], float]):
        self._lock, self._clock = lock, clock
        self.heartbeat: Heartbeat | None = None
        self.since: float | None = None  # when the oldest unwritten heartbeat/event arrived
        self.events: list[tuple[int, str]] = []  # (seq, redacted JSON line) not yet in the store
        self._seq = itertools.count()
        self._text: str | None = None  # events.jsonl as the store has it (None: not read yet)
        self.dropped = 0

    @property
    def waiting(self) -> bool:
        return self.heartbeat is not None or bool(self.events)

    def beat(self, hb: Heartbeat) -> None:
        if self.since is None:
            self.since = self._clock()
        self.heartbeat = hb

    def add(self, line: str) -> None:
        """One event, as its redacted JSON line."""
        if self.since is None:
            self.since = self._clock()
        self.events.append((next(self._seq), line))
        if len(self.events) > MAX_PENDING_EVENTS:
            del self.events[0]
            self.dropped += 1

    def write(self, artifacts: RunArtifacts) -> None:
        """Commit the newest heartbeat and all pending events in one commit (raises on failure)."""
        store, paths = artifacts.store, artifacts.paths
        with self._lock:
            hb, pending, base = self.heartbeat, list(self.events), self._text
        lines = [line for _, line in pending]
        if lines and base is None:
            raw = store.read_bytes(paths.events)  # once per worker: a resumed run appends
            base = (raw or b"").decode("utf-8", errors="replace")
            if base and not base.endswith("\n"):
                base += "\n"  # a torn last line from a crash must not swallow ours
            with self._lock:
                self._text = base
        add: dict[str, bytes] = {}
        if hb is not None:
            add[paths.heartbeat] = redact(hb.model_dump_json()).encode()
        text = None
        if lines:
            text = base + "".join(lines)
            add[paths.events] = text.encode()
        if not add:
            return
        store.commit(add, message="heartbeat" if hb is not None else "events")
        with self._lock:
            if self.heartbeat is hb:
                self.heartbeat = None
            if pending:
                # Events that arrived meanwhile stay queued; drop exactly the ones written.
                last = pending[-1][0]
                self.events = [(seq, line) for seq, line in self.events if seq > last]
                self._text = text
            # What arrived during the commit waits from now on: its own share starts afresh.
            self.since = None if not self.waiting else self._clock()
