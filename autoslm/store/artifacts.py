"""What a run's artifacts mean, on top of any Store: heartbeats, events, checkpoints, adapter, DONE.

Both halves use this: the worker (through its background uploader) writes, the controller reads.
A checkpoint is complete only when its manifest (names, sizes, sha256 of every file) is present and
matches what was downloaded; resume skips a partial or corrupt one for the one before it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from autoslm.layout import BEST_RECORD, CHECKPOINT_MANIFEST, Event, Heartbeat, RunPaths, checkpoint_step
from autoslm.store.adapters import AdapterDamaged, check_adapter
from autoslm.store.base import Store, files_under


@dataclass
class ErrorRecord:
    message: str
    retryable: bool
    detail: str = ""
    limit: str | None = None  # "max_hours" | "max_usd": the run was ended at that limit (layout.LIMIT_*)


def sha256_of(path: Path) -> str:
    """sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_manifest(local_dir: Path, skip: str = CHECKPOINT_MANIFEST) -> dict:
    """Each file below ``local_dir`` but ``skip`` -> its size and sha256."""
    local_dir = Path(local_dir)
    return {
        p.relative_to(local_dir).as_posix(): {"size": p.stat().st_size, "sha256": sha256_of(p)}
        for p in sorted(local_dir.rglob("*"))
        if p.is_file() and p.name != skip
    }


def files_match(local_dir: Path, files: dict) -> bool:
    """Is every file ``files`` names there below ``local_dir``, with its size and sha256?"""
    try:
        for rel, meta in files.items():
            p = Path(local_dir) / rel
            if not p.is_file() or p.stat().st_size != meta["size"] or sha256_of(p) != meta["sha256"]:
                return False
    except (OSError, KeyError, TypeError, AttributeError):
        return False
    return True


def write_manifest(local_dir: Path) -> dict:
    """Write the checkpoint manifest into ``local_dir`` (last), and return it."""
    manifest = {"files": file_manifest(local_dir)}
    (Path(local_dir) / CHECKPOINT_MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def verify_manifest(local_dir: Path) -> bool:
    try:
        manifest = json.loads((Path(local_dir) / CHECKPOINT_MANIFEST).read_text())
        return files_match(local_dir, manifest["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


class BestDamaged(Exception):
    """The stored best evaluation is partial or damaged (the message says what): it cannot be trusted."""


class RunArtifacts:
    """One replica's artifacts in a store. Reads raise StoreUnavailable when the store cannot tell."""

    def __init__(self, store: Store, paths: RunPaths):
        self.store = store
        self.paths = paths

    # -- heartbeat and events -------------------------------------------------------------------
    def put_heartbeat(self, hb: Heartbeat) -> None:
        self.store.commit({self.paths.heartbeat: hb.model_dump_json().encode()}, message="heartbeat")

    def get_heartbeat(self) -> Heartbeat | None:
        raw = self.store.read_bytes(self.paths.heartbeat)
        return Heartbeat.model_validate_json(raw) if raw else None

    def append_events(self, events: list[Event]) -> None:
        if events:
            self.store.append_text(self.paths.events, "".join(e.model_dump_json() + "\n" for e in events))

    def read_events(self) -> list[Event]:
        raw = self.store.read_bytes(self.paths.events)
        out = []
        for line in (raw or b"").decode().splitlines():
            if line.strip():
                try:
                    out.append(Event.model_validate_json(line))
                except ValueError:
                    continue  # a torn last line from a crash: skip it, keep the rest
        return out

    # -- checkpoints ------------------------------------------------------------------------------
    def put_checkpoint(self, step: int, local_dir: Path, keep: int = 2) -> None:
        """Upload ``local_dir`` as checkpoint-<step> and delete all but the newest ``keep`` in one commit."""
        local_dir = Path(local_dir)
        if not (local_dir / CHECKPOINT_MANIFEST).exists():
            write_manifest(local_dir)
        add = files_under(local_dir, self.paths.checkpoint(step))
        manifest_key = f"{self.paths.checkpoint(step)}/{CHECKPOINT_MANIFEST}"
        add[manifest_key] = add.pop(manifest_key)  # last: a reader sees it only once the rest is there
        older = [s for s in self.list_checkpoints() if s != step]
        keep_older = sorted(older)[-(keep - 1) :] if keep > 1 else []
        delete = [self.paths.checkpoint(s) + "/" for s in older if s not in keep_older]
        self.store.commit(add, delete, message=f"checkpoint {step}")

    def list_checkpoints(self) -> list[int]:
        steps = set()
        for f in self.store.list_files(self.paths.checkpoints):
            rel = f[len(self.paths.checkpoints) + 1 :]
            step = checkpoint_step(rel.split("/", 1)[0])
            if step is not None:
                steps.add(step)
        return sorted(steps)

    def fetch_latest_checkpoint(self, dest: Path) -> tuple[int, Path] | None:
        """Download the newest complete checkpoint into ``dest``/checkpoint-<step>; None if there is none."""
        for step in reversed(self.list_checkpoints()):
            target = self.fetch_checkpoint(step, dest)
            if target is not None:
                return step, target
        return None

    def fetch_checkpoint(self, step: int, dest: Path) -> Path | None:
        """Download checkpoint-<step> into ``dest``/checkpoint-<step>; None when it is not there whole."""
        target = Path(dest) / f"checkpoint-{step}"
        shutil.rmtree(target, ignore_errors=True)
        self.store.download(self.paths.checkpoint(step), target)
        if verify_manifest(target):
            return target
        shutil.rmtree(target, ignore_errors=True)
        return None

    # -- keep_best: the best evaluation so far, across attempts ------------------------------------
    def put_best(self, local_dir: Path, record: dict) -> None:
        """The best evaluation's adapter (``local_dir``) with its ``record``, which names each file's size
        and sha256 and goes last: a reader trusts the folder only when the two agree."""
        local_dir = Path(local_dir)
        add = files_under(local_dir, self.paths.best)
        files = file_manifest(local_dir, skip=BEST_RECORD)
        add[self.paths.best_record] = json.dumps({**record, "files": files}, indent=1, default=str).encode()
        self.store.commit(add, message="best evaluation")

    def fetch_best(self, dest: Path) -> tuple[dict, Path] | None:
        """(record, ``dest`` holding its adapter), or None when no evaluation was kept. Raises
        BestDamaged when the record or a file it names is missing, cut short or altered."""
        raw = self.store.read_bytes(self.paths.best_record)
        if raw is None:
            if self.store.list_files(self.paths.best):  # the first write, cut off before its record
                raise BestDamaged(f"{self.paths.best} holds files but no {BEST_RECORD}")
            return None
        try:
            record = json.loads(raw)
            files = record["files"]
        except (ValueError, KeyError, TypeError):
            raise BestDamaged(f"{self.paths.best_record} is not a readable record") from None
        target = Path(dest)
        shutil.rmtree(target, ignore_errors=True)
        self.store.download(self.paths.best, target)
        if not isinstance(files, dict) or not files_match(target, files):
            raise BestDamaged(f"{self.paths.best}: a file its record names is missing or not what was written")
        try:
            check_adapter(target)
        except AdapterDamaged as e:
            raise BestDamaged(f"{self.paths.best}: {e.path.name}: {e.problem}") from None
        return record, target

    # -- results ----------------------------------------------------------------------------------
    def put_adapter(self, local_dir: Path) -> None:
        self.store.commit(files_under(local_dir, self.paths.adapter), message="adapter")

    def fetch_adapter(self, dest: Path) -> Path:
        return self.store.download(self.paths.adapter, Path(dest))

    def put_export(self, local_dir: Path) -> None:
        self.store.commit(files_under(local_dir, self.paths.export), message="export")

    def fetch_export(self, dest: Path) -> Path:
        return self.store.download(self.paths.export, Path(dest))

    def has_adapter(self) -> bool:
        return any(f.endswith("adapter_config.json") for f in self.store.list_files(self.paths.adapter))

    def put_json(self, path: str, data: dict) -> None:
        self.store.commit({path: json.dumps(data, indent=1, default=str).encode()}, message=path.rsplit("/", 1)[-1])

    def get_json(self, path: str) -> dict | None:
        raw = self.store.read_bytes(path)
        return json.loads(raw) if raw else None

    def put_metrics(self, metrics: dict) -> None:
        self.put_json(self.paths.metrics, metrics)

    def get_metrics(self) -> dict | None:
        return self.get_json(self.paths.metrics)

    def put_train_meta(self, meta: dict) -> None:
        self.put_json(self.paths.train_meta, meta)

    def mark_done(self) -> None:
        self.store.commit({self.paths.done: b"done\n"}, message="DONE")

    def is_done(self) -> bool:
        """True/False; raises StoreUnavailable when the store cannot tell (never guesses "not done")."""
        return self.store.read_bytes(self.paths.done) is not None

    def put_error(self, err: ErrorRecord) -> None:
        # The limit's line goes after the blank one, as the detail's first line: an older reader keeps
        # message and retryable where they were.
        limit = f"limit: {err.limit}\n" if err.limit else ""
        text = f"{err.message}\nretryable: {str(err.retryable).lower()}\n\n{limit}{err.detail}"
        self.store.commit({self.paths.error: text.encode()}, message="error")

    def get_error(self) -> ErrorRecord | None:
        raw = self.store.read_bytes(self.paths.error)
        if raw is None:
            return None
        lines = raw.decode(errors="replace").split("\n")
        retryable = not (len(lines) > 1 and lines[1].strip() == "retryable: false")
        detail, limit = lines[3:], None
        if detail and detail[0].startswith("limit: "):
            limit, detail = detail[0][len("limit: ") :].strip() or None, detail[1:]
        return ErrorRecord(lines[0], retryable, "\n".join(detail), limit)

    def clear_error(self) -> None:
        self.store.commit({}, [self.paths.error], message="clear error")
