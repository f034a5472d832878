"""keep_best across a preemption, on the real worker (`python -m autoslm.engine`) and the tiny model.

The data make the held-out loss best early: training teaches an answer the held-out rows never have.
The first attempt is killed (SIGKILL, as a lost machine) once a checkpoint is stored, after its first
evaluations; the relaunched attempt resumes from that checkpoint and hands back the adapter of the best
evaluation of the whole run, which only the first attempt made, and says so. A best record damaged in
the store is set aside with a note, and the run still succeeds.

    .venv-image/bin/python -m pytest -p no:randomly -q tests/e2e/test_keep_best_resume.py
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, shared_models_dir

pytestmark = [pytest.mark.e2e, pytest.mark.worker]  # worker: run on the image's pins

RUN = "kb-run"
SPEC = """
name = "kb"
model = "autoslm/tiny"
seed = 0
[environment]
id = "jsonl:{data}/train.jsonl"
params = {{ eval_path = "{data}/eval.jsonl" }}
[train]
max_steps = 12
batch_size = 4
learning_rate = 3e-3
lr_scheduler = "constant"
max_length = 64
save_every = 2
keep_checkpoints = 10
eval_samples = 8
[eval]
every = 2
metric = "loss"
keep_best = true
"""


def _write_data(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "train.jsonl", "w") as f:
        for a in range(10):
            for b in range(10):
                f.write(json.dumps({"prompt": f"What is {a} + {b}?", "completion": "zebra zebra zebra"}) + "\n")
    with open(folder / "eval.jsonl", "w") as f:
        for a in range(8):
            f.write(json.dumps({"prompt": f"What is {a} + {a + 1}?", "answer": str(2 * a + 1)}) + "\n")


def _worker_env(root: Path, home: Path, attempt: int) -> dict:
    from autoslm.spec import parse_spec

    spec = parse_spec(SPEC.format(data=root / "data"))
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "AUTOSLM_HOME": str(home),
        "AUTOSLM_JOBSPEC": spec.to_json(),
        "AUTOSLM_RUN_ID": RUN,
        "AUTOSLM_SEED": "0",
        "AUTOSLM_STORE": (root / "store").as_uri(),
        "AUTOSLM_ATTEMPT": str(attempt),
    }


def _seed_dir(root: Path) -> Path:
    return root / "store" / "sft" / RUN / "seed0"


@pytest.fixture(scope="module")
def preempted(tmp_path_factory) -> Path:
    """A run whose first attempt was killed once a checkpoint was stored: its data and store."""
    root = tmp_path_factory.mktemp("preempted")
    home = root / "home"
    home.mkdir()
    (home / "models").symlink_to(shared_models_dir(root), target_is_directory=True)
    _write_data(root / "data")
    ckpts = _seed_dir(root) / "checkpoint"
    p = subprocess.Popen(
        [sys.executable, "-m", "autoslm.engine"],
        env=_worker_env(root, home, 1),
        cwd=str(root),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not (ckpts.is_dir() and any((c / "autoslm_manifest.json").exists() for c in ckpts.iterdir())):
            assert p.poll() is None, p.stdout.read()
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.05)
        os.killpg(p.pid, signal.SIGKILL)
    finally:
        p.wait(timeout=60)
        p.stdout.close()
    assert not (_seed_dir(root) / "DONE").exists()
    return root


def _resume(preempted: Path, tmp_path: Path, damage=None) -> tuple[dict, list[dict], Path]:
    """Attempt 2 on a copy of the preempted run's store: (metrics.json, events, the seed's folder)."""
    root = tmp_path / "run"
    shutil.copytree(preempted, root, symlinks=True)
    if damage is not None:
        damage(_seed_dir(root) / "best")
    p = subprocess.run(
        [sys.executable, "-m", "autoslm.engine"],
        env=_worker_env(root, root / "home", 2),
        cwd=str(root),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    seed = _seed_dir(root)
    events = [json.loads(line) for line in (seed / "events.jsonl").read_text().splitlines() if line.strip()]
    return json.loads((seed / "metrics.json").read_text()), events, seed


def _evaluations(events: list[dict]) -> tuple[list[dict], list[dict]]:
    """The eval events of the first attempt and of the second, split where the second started."""
    starts = [i for i, e in enumerate(events) if e["kind"] == "worker_start"]
    assert [events[i]["data"]["attempt"] for i in starts] == [1, 2]
    evals = [(i, {"step": e["step"], **e["data"]}) for i, e in enumerate(events) if e["kind"] == "eval"]
    return [e for i, e in evals if i < starts[1]], [e for i, e in evals if i > starts[1]]


def _lora(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


def test_a_resumed_run_hands_back_the_best_adapter_from_before_the_preemption(preempted, tmp_path):
    metrics, events, seed = _resume(preempted, tmp_path)
    first, second = _evaluations(events)
    # The best of the first attempt (ties: the later), with the step it evaluated.
    best = min(reversed(first), key=lambda e: e["loss"])
    if best["when"] == "before":
        best["step"] = 0
    # What makes this a test: the relaunched attempt never evaluated anything as good.
    assert second and all(e["loss"] > best["loss"] for e in second), (first, second)

    assert metrics["attempt"] == 2 and metrics["resumed_from_step"] and metrics["steps"] == 12
    assert metrics["eval"]["after_step"] == best["step"] and metrics["eval"]["after"]["loss"] == best["loss"]
    assert metrics["validation"]["best"] == {
        "step": best["step"],
        "when": best["when"],
        "value": best["loss"],
        "attempt": 1,
        "earlier_attempt": True,
    }
    assert "attempt 1 made that evaluation" in metrics["eval"]["note"]
    assert metrics["eval"]["last_step"] == 12 and metrics["eval"]["last"]["loss"] > best["loss"]
    kept = [{"step": e["step"], **e["data"]} for e in events if e["kind"] == "adapter_kept"]
    assert len(kept) == 1 and kept[0]["step"] == best["step"] and kept[0]["earlier_attempt"] and kept[0]["attempt"] == 1
    recalled = [{"step": e["step"], **e["data"]} for e in events if e["kind"] == "best_recalled"]
    assert len(recalled) == 1 and recalled[0]["step"] == best["step"] and recalled[0]["value"] == best["loss"]

    # The adapter handed back is the one evaluated then: the start's (LoRA B still zero) or a checkpoint's.
    mine = _lora(seed / "adapter")
    if best["step"] == 0:
        assert all(not t.any() for name, t in mine.items() if "lora_B" in name)
    else:
        for name, tensor in _lora(seed / "checkpoint" / f"checkpoint-{best['step']}").items():
            assert (mine[name] == tensor).all(), name


def test_a_damaged_best_record_is_set_aside_with_a_note(preempted, tmp_path):
    def cut_short(best: Path) -> None:
        weights = best / "adapter_model.safetensors"
        weights.write_bytes(weights.read_bytes()[:100])

    metrics, events, _ = _resume(preempted, tmp_path, damage=cut_short)
    _, second = _evaluations(events)
    notes = [e["data"]["note"] for e in events if e["kind"] == "best_unusable"]
    assert len(notes) == 1 and "cannot be used" in notes[0] and "this attempt's evaluations only" in notes[0]
    # The run goes on with its own evaluations: the best of those, none of the first attempt's.
    best = metrics["validation"]["best"]
    assert "earlier_attempt" not in best and best["value"] == min(e["loss"] for e in second)
    assert metrics["steps"] == 12 and metrics["eval"]["after"]["loss"] == best["value"]
    # Said where the user reads: metrics.json, and the note that `status` prints; never "the best" of the run.
    assert metrics["validation"]["earlier_best_unusable"] == notes[0] and metrics["eval"]["note"].startswith(notes[0])
    assert "the best of this attempt's evaluations" in metrics["eval"]["note"]
    start = metrics["eval"]["before"]["loss"]  # the first attempt's start, which this attempt cannot hand back
    if start < best["value"]:
        assert metrics["validation"]["better_out_of_reach"] == {"step": 0, "when": "before", "value": start}
        assert f"the run's start scored loss {start}, better" in metrics["eval"]["note"]
