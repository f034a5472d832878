"""The uploader's queued work (engine/pod/uploader.py): a checkpoint, the best evaluation's adapter
(keep_best) and a required write, each knowing how it is put into the store and what its loss means;
and the snapshot of a folder a job uploads later (hard links, else copies), so the trainer may delete
its own copy at once. ``landed`` and ``let_go`` count into the uploader (engine/pod/uploader.py) that ran them.

Contract for callers: a directory handed to the uploader is snapshotted (hard links, else copies)
before the call returns; it must not rewrite those files in place afterwards (a hard link shares them).
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from autoslm.errors import StoreAuthError, StoreUnavailable
from autoslm.store.artifacts import RunArtifacts


@dataclass
class CheckpointJob:
    """A checkpoint folder, snapshotted (``staged``) and waiting for its commit."""

    step: int
    staged: Path
    keep: int
    final: bool
    attempts: int = 0
    what = "checkpoint"

    def put(self, artifacts: RunArtifacts) -> None:
        artifacts.put_checkpoint(self.step, self.staged, self.keep)

    def landed(self, uploader) -> None:
        uploader.uploaded_checkpoints.append(self.step)

    def let_go(self, uploader) -> None:
        """Dropped for a newer one, or unreadable: a final checkpoint is lost, another skipped."""
        if self.final:
            uploader.lost.append(f"checkpoint {self.step}")
        else:
            uploader.skipped_checkpoints.append(self.step)


@dataclass
class BestJob(CheckpointJob):
    """The best evaluation's adapter (keep_best), scheduled as a checkpoint is, in the same queue."""

    record: dict = field(default_factory=dict)
    what = "best adapter"

    def put(self, artifacts: RunArtifacts) -> None:
        artifacts.put_best(self.staged, self.record)

    def landed(self, uploader) -> None:
        uploader.uploaded_best.append(self.step)

    def let_go(self, uploader) -> None:
        return None  # a later attempt recalls an older best, or none: said by the events, not counted


@dataclass
class RequiredJob:
    """A write that must land in time (adapter, metrics, DONE, an error), or the run fails loudly."""

    fn: Callable[[], None]
    what: str
    deadline: float  # on the uploader's clock
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    last_error: BaseException | None = None
    attempts: int = 0
    next_attempt: float = 0.0
    cancelled: bool = False
    running: bool = False

    @staticmethod
    def retryable(e: BaseException) -> bool:
        """A store that may answer later; never one that refused the token."""
        return isinstance(e, (StoreUnavailable, OSError)) and not isinstance(e, StoreAuthError)

    def give_up(self, error: BaseException) -> None:
        """Fail this write (with the last error it met, else ``error``), waking whoever waits on it."""
        self.error = self.last_error or error
        self.running = False
        self.done.set()


def snapshot_folder(local_dir: Path, staged: Path) -> Path:
    """``local_dir``'s files, linked (or copied) into the new folder ``staged``."""
    if not local_dir.is_dir():
        raise FileNotFoundError(f"{local_dir} is not a directory")
    staged.mkdir(parents=True)
    for src in sorted(local_dir.rglob("*")):
        dst = staged / src.relative_to(local_dir)
        if src.is_dir():
            dst.mkdir(parents=True, exist_ok=True)
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dst)  # instant, and survives the trainer deleting its copy
        except OSError:
            shutil.copy2(src, dst)  # another filesystem, or links not allowed
    return staged
