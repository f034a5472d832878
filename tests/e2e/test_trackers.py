"""Experiment trackers beyond TensorBoard, each in a short run of the built-in model, all offline:
trackio (its local SQLite database), W&B (``WANDB_MODE=offline``: the offline run folder) and MLflow
(a file store). Each run's metrics reach the tracker's own files, and the run's ``tracker`` event
(`status`'s "trackers") names where they are. A tracker that is not installed skips its test (they
come with the ``test`` extra).

    .venv/bin/python -m pytest -q tests/e2e/test_trackers.py
"""

from __future__ import annotations

import importlib.util
import json
import sqlite3
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

pytestmark = pytest.mark.e2e

STEPS = 4
SPEC = """# autoslm launch {path}
name = "trk-{tracker}"
model = "autoslm/tiny"
[environment]
id = "autoslm/arith"
params = {{ n_train = 64, n_eval = 4, max_operand = 9 }}
[train]
max_steps = {steps}
batch_size = 4
max_length = 64
save_every = 100
lora_rank = 8
eval_samples = 0
report_to = ["{tracker}"]
[artifacts]
path = "{store}"
"""


def run_with(tracker: str, cli, tmp_path: Path, env: dict[str, str]) -> tuple[dict, Path]:
    """Train STEPS steps reporting to ``tracker``; (status, the local path its tracker event names)."""
    module = {"mlflow": "mlflow", "wandb": "wandb", "trackio": "trackio"}[tracker]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (the test extra brings it)")
    spec = tmp_path / f"{tracker}.toml"
    spec.write_text(SPEC.format(path=spec, tracker=tracker, steps=STEPS, store=tmp_path / "store"))
    r = cli("launch", str(spec), env=env)
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    run_id = next(line.split()[1] for line in r.out.splitlines() if line.startswith("run ") and "launched" in line)
    st = json.loads(cli("status", run_id, "--json").out)
    assert st["state"] == "succeeded", st
    url = st["trackers"][tracker]
    assert url.startswith("file://"), url
    where = Path(unquote(urlparse(url).path))
    assert where.exists(), f"the tracker event names {where}, which is not there"
    shown = cli("status", run_id).out
    assert f"tracker {tracker}: {url}" in shown  # whole, on one line
    return st, where


def test_trackio_writes_the_run_s_metrics_to_its_local_database(cli, tmp_path):
    local = tmp_path / "trackio"
    st, db = run_with("trackio", cli, tmp_path, {"TRACKIO_DIR": str(local)})
    assert db.parent == local and db.suffix == ".db", db
    con = sqlite3.connect(db)
    rows = [json.loads(m) for (m,) in con.execute("select metrics from metrics order by step")]
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    assert len(losses) == STEPS and all(x > 0 for x in losses), rows
    assert [r["train/global_step"] for r in rows if "train/loss" in r] == list(range(1, STEPS + 1))


def test_wandb_offline_writes_the_run_to_its_offline_folder(cli, tmp_path):
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true", "WANDB_PROJECT": "autoslm-test"}
    st, run_dir = run_with("wandb", cli, tmp_path, env)
    assert run_dir.parent == tmp_path / "wandb" and run_dir.name.startswith("offline-run-"), run_dir
    (log,) = run_dir.glob("run-*.wandb")  # what `wandb sync` uploads: every logged row
    kinds, rows = wandb_records(log)
    losses = [(int(r["train/global_step"]), float(r["train/loss"])) for r in rows if "train/loss" in r]
    assert [s for s, _ in losses] == list(range(1, STEPS + 1)) and all(v > 0 for _, v in losses), rows
    assert kinds.get("exit") == 1, kinds  # the run was closed, not cut off with the pod


def wandb_records(path: Path) -> tuple[dict[str, int], list[dict[str, str]]]:
    """(record kinds counted, history rows) of a W&B offline run file: a ":W&B" header, then 32 KiB
    blocks of records (a 7-byte header each: CRC, length, full/first/middle/last), each a protobuf
    ``Record`` of W&B's own schema."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:8]
    pos, block, pending, payloads = 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            payloads.append(pending)
    kinds: dict[str, int] = {}
    rows = []
    for payload in payloads:
        rec = pb.Record()
        rec.ParseFromString(payload)
        kind = rec.WhichOneof("record_type")
        kinds[kind] = kinds.get(kind, 0) + 1
        if kind == "history":
            rows.append({item.key or "/".join(item.nested_key): item.value_json for item in rec.history.item})
    return kinds, rows


def test_mlflow_file_store_holds_the_run_s_metrics(cli, tmp_path):
    store = tmp_path / "mlruns"
    env = {"MLFLOW_TRACKING_URI": store.as_uri(), "MLFLOW_ALLOW_FILE_STORE": "true", "MLFLOW_EXPERIMENT_NAME": "autoslm-test"}
    st, run_dir = run_with("mlflow", cli, tmp_path, env)
    assert run_dir.parent.parent == store, run_dir  # <store>/<experiment id>/<run id>
    lines = (run_dir / "metrics" / "loss").read_text().split("\n")
    steps = [int(x.split()[2]) for x in lines if x.strip()]  # "<timestamp> <value> <step>"
    assert steps == list(range(1, STEPS + 1)), lines
    meta = (run_dir / "meta.yaml").read_text()
    assert "status: 3" in meta  # FINISHED
    assert f"run_name: {st['run_id']}-seed0" in meta, meta  # named after the autoslm run, not its output folder
