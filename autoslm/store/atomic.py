"""A file written whole or not at all, by any number of writers at once.

Each writer writes a temporary file of its own beside the target and renames it into place once it is
complete: a reader never sees half a file, and writers at once (two launches sharing a home's wheel
cache, the ranks of one pod fetching the same shipped file) never fail on, or publish, another's
partial file. For content-addressed files (the same name, the same bytes) the last rename wins harmlessly.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """Write ``path`` through the yielded file; it appears (mode 644) only when the block ends cleanly."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, part = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.chmod(part, 0o644)
        os.replace(part, path)
    except BaseException:
        Path(part).unlink(missing_ok=True)
        raise


def write_atomic(path: Path, data: bytes) -> None:
    """``path`` holds ``data``, whole, once this returns."""
    with atomic_file(path) as f:
        f.write(data)
