"""A local directory as the artifact store: the default, no account needed.

A commit is atomic for every reader through this class, in any process: its files are written to a
temporary folder first, then renamed into place (and its deletions made) while the store's lock file is
held exclusively; reading, listing and downloading hold it shared, so a reader sees a commit whole or
not at all. A read of several files is consistent only within one call (``list_files``, ``download``).
It must never hold the lock while copying a commit's content: only the renames wait on readers.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from autoslm.store.base import Content

LOCK_NAME = ".tmp-lock"  # under the root; ".tmp-" keeps it out of listings


class LocalStore:
    rate_limited = False  # no commit budget: writes are local renames

    def __init__(self, root: Path | str):
        self.root = Path(root).expanduser().resolve()
        self.uri = self.root.as_uri()

    def _abs(self, path: str) -> Path:
        p = (self.root / path.strip("/")).resolve()
        if p != self.root and self.root not in p.parents:
            raise ValueError(f"path escapes the store: {path!r}")
        return p

    @contextlib.contextmanager
    def _locked(self, exclusive: bool):
        """The store's lock (fcntl.flock, released when the file closes, even by a killed process)."""
        if not exclusive and not self.root.is_dir():
            yield  # nothing committed yet: nothing to read half of, and a read creates nothing
            return
        try:
            f = open(self._ensure_root() / LOCK_NAME, "a+b")  # noqa: SIM115 - held across the yield
        except PermissionError:
            if exclusive:
                raise
            yield  # a store this user may read but not write: nobody here commits to it
            return
        with f:
            fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield

    def read_bytes(self, path: str) -> bytes | None:
        try:
            with self._locked(False):
                return self._abs(path).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def exists(self) -> bool:
        return self.root.is_dir()

    def list_files(self, prefix: str) -> list[str]:
        base = self._abs(prefix)
        with self._locked(False):
            if not base.is_dir():
                return []
            return sorted(
                p.relative_to(self.root).as_posix() for p in base.rglob("*") if p.is_file() and ".tmp-" not in p.as_posix()
            )

    def commit(self, add: Mapping[str, Content], delete: Iterable[str] = (), message: str = "autoslm") -> None:
        # The content is copied before the lock is taken (it may be GBs); only the renames hold it.
        staged: list[tuple[Path, Path]] = []
        tmp_root = Path(tempfile.mkdtemp(prefix=".tmp-commit-", dir=self._ensure_root()))
        try:
            for i, (path, content) in enumerate(add.items()):
                dst = self._abs(path)
                tmp = tmp_root / str(i)
                if isinstance(content, bytes):
                    tmp.write_bytes(content)
                else:
                    shutil.copyfile(content, tmp)
                staged.append((tmp, dst))
            targets = [self._abs(path) for path in delete]
            with self._locked(True):
                for tmp, dst in staged:
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(tmp, dst)
                for target in targets:
                    if target.is_dir():
                        shutil.rmtree(target, ignore_errors=True)
                    else:
                        target.unlink(missing_ok=True)
        finally:
            shutil.rmtree(tmp_root, ignore_errors=True)

    def append_text(self, path: str, text: str) -> None:
        dst = self._abs(path)
        with self._locked(True):
            dst.parent.mkdir(parents=True, exist_ok=True)
            with open(dst, "a", encoding="utf-8") as f:
                f.write(text)

    def download(self, prefix: str, dest: Path) -> Path:
        dest = Path(dest)
        src = self._abs(prefix)
        with self._locked(False):
            for rel in self.list_files(prefix):
                p = self.root / rel
                out = dest / p.relative_to(src)
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(p, out)
        return dest

    def _ensure_root(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        return self.root
