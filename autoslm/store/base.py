"""The artifact store interface: a few blob operations that every backend (local dir, HF repo) offers.

Run-level meaning (heartbeats, checkpoints, DONE...) lives in ``autoslm.store.artifacts`` on top of
this, so a backend only moves bytes. Contract for every backend:

- ``read_bytes`` returns None when the file is not there, and raises ``StoreUnavailable`` when it could
  not tell (network error, timeout, 5xx). "Could not tell" is never reported as "not there".
- ``commit`` is atomic: readers see all of its additions and deletions, or none of them.
- Every call that touches a network has a timeout.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol, Union, runtime_checkable

# What a commit adds at a store path: the bytes themselves, or a local file to copy/upload.
Content = Union[bytes, Path]


@runtime_checkable
class Store(Protocol):
    uri: str  # "file:///abs/dir" or "hf://owner/repo": enough to open the same store elsewhere
    rate_limited: bool  # True when commits count against a budget (the Hub's per-repo hourly limit)

    def read_bytes(self, path: str) -> bytes | None: ...

    def exists(self) -> bool:
        """Whether the store itself is there (the Hub repo, the local folder): a reference into a
        store that is not says so rather than "nothing written yet"."""
        ...

    def list_files(self, prefix: str) -> list[str]:
        """Every file under ``prefix`` (recursive), as store-relative paths. [] when there are none."""
        ...

    def commit(self, add: Mapping[str, Content], delete: Iterable[str] = (), message: str = "autoslm") -> None:
        """Add files and delete files or whole folders (paths ending in "/") in one atomic step."""
        ...

    def append_text(self, path: str, text: str) -> None:
        """Append to a text file (create it if missing)."""
        ...

    def download(self, prefix: str, dest: Path) -> Path:
        """Copy every file under ``prefix`` into ``dest`` (keeping sub-paths); returns ``dest``."""
        ...


def files_under(local_dir: Path, store_prefix: str) -> dict[str, Content]:
    """Map each file below ``local_dir`` to its path below ``store_prefix``."""
    local_dir = Path(local_dir)
    return {f"{store_prefix}/{p.relative_to(local_dir).as_posix()}": p for p in sorted(local_dir.rglob("*")) if p.is_file()}


def content_bytes(content: Content) -> bytes:
    return content if isinstance(content, bytes) else Path(content).read_bytes()
