"""Artifact layout, and the local directory store under RunArtifacts."""

from __future__ import annotations

import json
import struct

import pytest

from autoslm.errors import StoreUnavailable, UsageError
from autoslm.layout import CHECKPOINT_MANIFEST, Event, Heartbeat, RunPaths
from autoslm.store import RunArtifacts, open_store
from autoslm.store.artifacts import BestDamaged, ErrorRecord
from autoslm.store.local import LocalStore


def test_layout_paths():
    p = RunPaths("sft", "run-1", 2)
    assert p.prefix == "sft/run-1/seed2"
    assert p.heartbeat == "sft/run-1/seed2/heartbeat.json"
    assert p.events == "sft/run-1/seed2/events.jsonl"
    assert p.checkpoint(40) == "sft/run-1/seed2/checkpoint/checkpoint-40"
    assert p.adapter == "sft/run-1/seed2/adapter"
    assert p.metrics == "sft/run-1/seed2/metrics.json"
    assert p.train_meta == "sft/run-1/seed2/train_meta.json"
    assert p.done == "sft/run-1/seed2/DONE"
    assert p.error == "sft/run-1/seed2/error_sft.txt"
    assert p.best == "sft/run-1/seed2/best" and p.best_record == "sft/run-1/seed2/best/autoslm_best.json"
    assert RunPaths.parse(p.prefix) == p
    with pytest.raises(ValueError):
        RunPaths.parse("sft/run-1/two")


@pytest.fixture
def art(tmp_path):
    return RunArtifacts(LocalStore(tmp_path / "store"), RunPaths("sft", "r", 0))


def _ckpt(tmp_path, step):
    d = tmp_path / f"local-ckpt-{step}"
    d.mkdir()
    (d / "adapter_model.safetensors").write_bytes(b"w" * (100 + step))
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return d


def test_heartbeat_events_metrics_done_error(art):
    assert art.get_heartbeat() is None and not art.is_done() and art.get_error() is None
    art.put_heartbeat(Heartbeat(run_id="r", seed=0, phase="sft", stage="training", step=3, total_steps=9))
    assert art.get_heartbeat().step == 3
    art.append_events([Event(kind="a"), Event(kind="b")])
    art.append_events([Event(kind="c")])
    assert [e.kind for e in art.read_events()] == ["a", "b", "c"]
    art.put_metrics({"final_loss": 1.5})
    assert art.get_metrics() == {"final_loss": 1.5}
    art.put_error(ErrorRecord("bad spec", retryable=False, detail="trace"))
    err = art.get_error()
    assert (err.message, err.retryable, err.detail) == ("bad spec", False, "trace")
    art.mark_done()
    assert art.is_done()


def test_torn_event_line_is_skipped(art):
    art.append_events([Event(kind="a")])
    art.store.append_text(art.paths.events, '{"kind": "b", "ti')
    assert [e.kind for e in art.read_events()] == ["a"]


def test_checkpoints_keep_newest_and_skip_corrupt(art, tmp_path):
    for step in (10, 20, 30):
        art.put_checkpoint(step, _ckpt(tmp_path, step), keep=2)
    assert art.list_checkpoints() == [20, 30]
    assert (tmp_path / "local-ckpt-30" / CHECKPOINT_MANIFEST).exists()
    step, path = art.fetch_latest_checkpoint(tmp_path / "resume")
    assert step == 30 and json.loads((path / "trainer_state.json").read_text())["global_step"] == 30
    # Corrupt the newest: resume falls back to the one before.
    newest = art.store.root / art.paths.checkpoint(30) / "adapter_model.safetensors"
    newest.write_bytes(b"garbage")
    step, _ = art.fetch_latest_checkpoint(tmp_path / "resume2")
    assert step == 20
    # A checkpoint without its manifest (an interrupted upload) is skipped too.
    (art.store.root / art.paths.checkpoint(20) / CHECKPOINT_MANIFEST).unlink()
    assert art.fetch_latest_checkpoint(tmp_path / "resume3") is None


def test_adapter_roundtrip(art, tmp_path):
    src = tmp_path / "adapter"
    src.mkdir()
    (src / "adapter_config.json").write_text("{}")
    (src / "adapter_model.safetensors").write_bytes(b"x")
    art.put_adapter(src)
    assert art.has_adapter()
    out = art.fetch_adapter(tmp_path / "dl")
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]


def lora_folder(folder, fill: bytes = b"\0", config: dict | None = None):
    """A LoRA adapter's two files, small and whole: a config and one float32 tensor of two values."""
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps(config or {"peft_type": "LORA", "r": 2}))
    header = json.dumps({"lora_A.weight": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    (folder / "adapter_model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + fill * 8)
    return folder


def test_best_evaluation_roundtrip_and_what_is_not_trusted(art, tmp_path):
    assert art.fetch_best(tmp_path / "none") is None
    record = {"step": 4, "when": "during", "metric": "loss", "value": 1.5, "result": {"loss": 1.5}, "attempt": 1}
    art.put_best(lora_folder(tmp_path / "a", b"\1"), record)
    art.put_best(lora_folder(tmp_path / "b", b"\2"), {**record, "step": 6})  # a newer best takes its place
    back, folder = art.fetch_best(tmp_path / "back")
    assert back["step"] == 6 and set(back["files"]) == {"adapter_config.json", "adapter_model.safetensors"}
    weights = folder / "adapter_model.safetensors"
    assert weights.read_bytes() == (tmp_path / "b" / "adapter_model.safetensors").read_bytes()

    # A file that is not what its record names (a write cut between its files), a record that does not
    # parse, files without a record (the first write cut before it): none is trusted.
    stored = art.store.root / art.paths.best / "adapter_model.safetensors"
    stored.write_bytes((tmp_path / "a" / "adapter_model.safetensors").read_bytes())
    with pytest.raises(BestDamaged, match="not what was written"):
        art.fetch_best(tmp_path / "back2")
    (art.store.root / art.paths.best_record).write_text('{"step": 6, "fil')
    with pytest.raises(BestDamaged, match="not a readable record"):
        art.fetch_best(tmp_path / "back3")
    (art.store.root / art.paths.best_record).unlink()
    with pytest.raises(BestDamaged, match="holds files but no autoslm_best.json"):
        art.fetch_best(tmp_path / "back4")
    # Whole files that are no adapter: said, by file.
    art.put_best(lora_folder(tmp_path / "c", config={"r": 2}), record)
    with pytest.raises(BestDamaged, match="adapter_config.json: has no peft_type"):
        art.fetch_best(tmp_path / "back5")


def test_local_store_refuses_escaping_paths(tmp_path):
    store = LocalStore(tmp_path)
    with pytest.raises(ValueError):
        store.read_bytes("../../etc/passwd")


def test_open_store_by_uri(tmp_path):
    assert isinstance(open_store(tmp_path.as_uri()), LocalStore)
    assert open_store(tmp_path.as_uri()).root == tmp_path.resolve()
    for bad in ("s3://bucket", "local:/tmp/store", "relative/dir", str(tmp_path)):
        with pytest.raises(UsageError, match="unknown store URI"):
            open_store(bad)


def test_done_check_propagates_could_not_tell(tmp_path):
    class Flaky(LocalStore):
        def read_bytes(self, path):
            raise StoreUnavailable("timeout")

    art = RunArtifacts(Flaky(tmp_path), RunPaths("sft", "r", 0))
    with pytest.raises(StoreUnavailable):
        art.is_done()


def test_local_store_reader_never_sees_half_a_commit(tmp_path):
    """A writer commits folders of 30 files (the last one deleting the folder before it); a reader in
    another thread lists the store meanwhile and must find every folder whole, and the last one at the end."""
    import threading

    store, writer_store = LocalStore(tmp_path / "s"), LocalStore(tmp_path / "s")
    files, commits, torn, seen = 30, 40, [], set()
    done = threading.Event()

    def write():
        try:
            for k in range(commits):
                add = {f"ck/c{k}/f{i:02d}": b"x" * 64 for i in range(files)}
                writer_store.commit(add, delete=[f"ck/c{k - 1}"] if k else [])
        finally:
            done.set()

    t = threading.Thread(target=write)
    t.start()
    while not done.is_set():
        folders: dict[str, int] = {}
        for rel in store.list_files("ck"):
            folder = rel.split("/")[1]
            folders[folder] = folders.get(folder, 0) + 1
        torn += [(f, n) for f, n in folders.items() if n != files]
        assert len(folders) <= 1, f"a commit's deletion was seen apart from its additions: {sorted(folders)}"
        seen.update(folders)
    t.join()
    assert not torn, f"folders seen half-committed (folder, files seen): {torn[:5]}"
    assert len(seen) > 1 and store.list_files("ck") == [f"ck/c{commits - 1}/f{i:02d}" for i in range(files)]


def test_a_store_this_user_may_only_read_is_read(tmp_path):
    import os

    LocalStore(tmp_path / "s").commit({"a/b.txt": b"hi"})
    (tmp_path / "s" / ".tmp-lock").unlink()
    os.chmod(tmp_path / "s", 0o555)
    try:
        if os.access(tmp_path / "s", os.W_OK):
            pytest.skip("this user may write anywhere (root)")
        store = LocalStore(tmp_path / "s")
        assert store.read_bytes("a/b.txt") == b"hi" and store.list_files("a") == ["a/b.txt"]
    finally:
        os.chmod(tmp_path / "s", 0o755)
