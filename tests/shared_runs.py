"""Runs trained once for the whole test session and read by every xdist worker that needs them.

A module-scoped fixture is set up once per xdist worker that takes one of the module's tests, and
`--dist worksteal` hands a module's tests to whichever workers are idle: a run trained in such a
fixture was trained up to once per worker. Here the first worker to ask trains it while holding a
lock on a folder of the session's (the parent of the workers' own temporary folders), and the others
wait on that lock and read what it left. Only for tests that read a run; a test whose point is the
training itself (a limit, a kill, the learning) trains its own.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def locked(path: Path):
    """``path`` locked for this process (flock), waiting as long as another holds it."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def session_folder(tmp_path_factory, name: str) -> Path:
    """``name``'s folder, one for the session whichever xdist worker asks."""
    base = tmp_path_factory.getbasetemp()
    # Under xdist each worker's base is a folder of the session's: their parent is the session's own.
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    folder.mkdir(exist_ok=True)
    return folder


def once(folder: Path, make: Callable[[], str]) -> str:
    """What ``make`` returned (a run id) the first time any worker of the session asked for ``folder``'s;
    ``make`` runs in one worker only, while the others wait. A ``make`` that failed is tried again by the
    next worker to ask (and fails its tests the same way)."""
    with locked(folder / "run.lock"):
        made = folder / "run_id"
        if not made.exists():
            made.write_text(make())
        return made.read_text()
