"""A local directory as the artifact store: the default, no account needed.

Writes are atomic: a file is written beside its target and renamed over it; a commit that adds a
folder (a checkpoint) builds it under a temporary name and renames it into place, so a reader never
sees half of it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from autoslm.store.base import Content


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

    def read_bytes(self, path: str) -> bytes | None:
        try:
            return self._abs(path).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def exists(self) -> bool:
        return self.root.is_dir()

    def list_files(self, prefix: str) -> list[str]:
        base = self._abs(prefix)
        if not base.is_dir():
            return []
        return sorted(
            p.relative_to(self.root).as_posix()
            for p in base.rglob("*")
            if p.is_file() and ".tmp-" not in p.as_posix()
        )

    def commit(self, add: Mapping[str, Content], delete: Iterable[str] = (), message: str = "autoslm") -> None:
        # Group additions by their top folder under a common parent so that a folder (a checkpoint)
        # appears in one rename. Single files are renamed one by one, each atomically.
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
            for tmp, dst in staged:
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmp, dst)
        finally:
            shutil.rmtree(tmp_root, ignore_errors=True)
        for path in delete:
            target = self._abs(path)
            if target.is_dir():
                shutil.rmtree(target, ignore_errors=True)
            else:
                target.unlink(missing_ok=True)

    def append_text(self, path: str, text: str) -> None:
        dst = self._abs(path)
        dst.parent.mkdir(parents=True, exist_ok=True)
        with open(dst, "a", encoding="utf-8") as f:
            f.write(text)

    def download(self, prefix: str, dest: Path) -> Path:
        dest = Path(dest)
        src = self._abs(prefix)
        for rel in self.list_files(prefix):
            p = self.root / rel
            out = dest / p.relative_to(src)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, out)
        return dest

    def _ensure_root(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        return self.root
