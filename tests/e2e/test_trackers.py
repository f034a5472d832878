"""Experiment trackers beyond TensorBoard, all offline and all in one short run of the built-in model
that reports to each of them: trackio (its local SQLite database), W&B (``WANDB_MODE=offline``: the
offline run folder) and MLflow (a file store). The run's metrics reach each tracker's own files, and
the run's ``tracker`` events (`status`'s "trackers") name where they are. A tracker that is not
installed skips its test and is left out of the run (they come with the ``trackers`` extra).

    .venv/bin/python -m pytest -q tests/e2e/test_trackers.py
"""

from __future__ import annotations

import importlib.util
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from tests.conftest import REPO, shared_models_dir
from tests.shared_runs import once, session_folder

pytestmark = pytest.mark.e2e

STEPS = 4
TRACKERS = ("trackio", "wandb", "mlflow")  # each the name of its package too
SPEC = """# autoslm launch {path}
name = "trackers"
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
report_to = {trackers}
[artifacts]
path = "{store}"
"""


class Tracked:
    """The module's run, one for the session whichever xdist workers take its tests (tests/shared_runs.py),
    reporting to every installed tracker, each writing under ``shared``."""

    def __init__(self, shared: Path, tmp: Path):
        self.shared, self.home = shared, shared / "home"
        self.installed = [t for t in TRACKERS if importlib.util.find_spec(t) is not None]
        self.env = {
            **os.environ,
            "AUTOSLM_HOME": str(self.home),
            "PYTHONPATH": str(REPO),  # the local worker imports this checkout too
            "TRACKIO_DIR": str(shared / "trackio"),
            "WANDB_MODE": "offline",
            "WANDB_DIR": str(shared),
            "WANDB_SILENT": "true",
            "WANDB_PROJECT": "autoslm-test",
            "MLFLOW_TRACKING_URI": (shared / "mlruns").as_uri(),
            "MLFLOW_ALLOW_FILE_STORE": "true",
            "MLFLOW_EXPERIMENT_NAME": "autoslm-test",
        }
        self.run_id = once(shared, lambda: self._train(tmp)) if self.installed else None

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "autoslm", *args], capture_output=True, text=True, env=self.env, cwd=str(REPO), timeout=600
        )

    def _train(self, tmp: Path) -> str:
        self.home.mkdir(exist_ok=True)
        if not (self.home / "models").is_symlink():
            (self.home / "models").symlink_to(shared_models_dir(tmp), target_is_directory=True)
        spec = tmp / "trackers.toml"
        spec.write_text(SPEC.format(path=spec, steps=STEPS, trackers=json.dumps(self.installed), store=self.shared / "store"))
        r = self.cli("launch", str(spec))
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return next(line.split()[1] for line in r.stdout.splitlines() if line.startswith("run ") and "launched" in line)

    def where(self, tracker: str) -> tuple[dict, Path]:
        """(the run's status, the local path its ``tracker`` event names), the tracker's test skipped
        where it is not installed."""
        if tracker not in self.installed:
            pytest.skip(f"{tracker} is not installed (the trackers extra brings it)")
        st = json.loads(self.cli("status", self.run_id, "--json").stdout)
        assert st["state"] == "succeeded", st
        url = st["trackers"][tracker]
        assert url.startswith("file://"), url
        where = Path(unquote(urlparse(url).path))
        assert where.exists(), f"the tracker event names {where}, which is not there"
        shown = self.cli("status", self.run_id).stdout
        assert f"tracker {tracker}: {url}" in shown  # whole, on one line
        return st, where


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    return Tracked(session_folder(tmp_path_factory, "trackers-run"), tmp_path_factory.mktemp("trackers"))


def test_trackio_writes_the_run_s_metrics_to_its_local_database(tracked):
    st, db = tracked.where("trackio")
    assert db.parent == tracked.shared / "trackio" and db.suffix == ".db", db
    con = sqlite3.connect(db)
    rows = [json.loads(m) for (m,) in con.execute("select metrics from metrics order by step")]
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    assert len(losses) == STEPS and all(x > 0 for x in losses), rows
    assert [r["train/global_step"] for r in rows if "train/loss" in r] == list(range(1, STEPS + 1))


def test_wandb_offline_writes_the_run_to_its_offline_folder(tracked):
    st, run_dir = tracked.where("wandb")
    assert run_dir.parent == tracked.shared / "wandb" and run_dir.name.startswith("offline-run-"), run_dir
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


def test_mlflow_file_store_holds_the_run_s_metrics(tracked):
    st, run_dir = tracked.where("mlflow")
    assert run_dir.parent.parent == tracked.shared / "mlruns", run_dir  # <store>/<experiment id>/<run id>
    lines = (run_dir / "metrics" / "loss").read_text().split("\n")
    steps = [int(x.split()[2]) for x in lines if x.strip()]  # "<timestamp> <value> <step>"
    assert steps == list(range(1, STEPS + 1)), lines
    meta = (run_dir / "meta.yaml").read_text()
    assert "status: 3" in meta  # FINISHED
    assert f"run_name: {st['run_id']}-seed0" in meta, meta  # named after the autoslm run, not its output folder
