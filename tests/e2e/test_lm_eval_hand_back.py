"""The worker's lm-eval phase after the hand-back (engine/pod/lm_eval_phase.run_after_hand_back), on the
built-in model, a task YAML over local data and a real local store, with the real lm-evaluation-harness:
the base and the adapter each in a process of its own, the base's scores in the store (and on disk)
before the adapter's process starts, a failure of one keeping the other's scores, and a limit (or the
pod's SIGTERM) stopping a running harness and keeping what finished. Below the CLI (the phase itself,
its clock and stop injected); tests/e2e/test_lm_eval_local.py runs the same through `autoslm launch`.

    PYTHONPATH=$PWD .venv-image/bin/python -m pytest -q tests/e2e/test_lm_eval_hand_back.py   # about 4 min
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from autoslm.engine.distributed import Ranks
from autoslm.engine.pod import phases
from autoslm.engine.pod.context import WorkerContext
from autoslm.engine.pod.heartbeat import Reporter
from autoslm.engine.pod.limits import LimitEnd, LimitStop, harness_end_s
from autoslm.engine.pod.lm_eval_phase import run_after_hand_back
from autoslm.spec import parse_spec
from autoslm.store import RunArtifacts, open_store
from tests.e2e.test_lm_eval_local import task_files

pytestmark = [pytest.mark.e2e, pytest.mark.worker]  # real harness processes, minutes: on the worker's pins only
pytest.importorskip("lm_eval")

SPEC = """
name = "t"
model = "autoslm/tiny"
[environment]
id = "autoslm/arith"
[train]
max_steps = 10
lora_rank = 4
[eval]
lm_eval = ["{task}"]
lm_eval_limit = 2
"""


class Recording(RunArtifacts):
    """The run's real artifacts, which also keep a copy of each metrics.json written, in order."""

    def __init__(self, store, paths):
        super().__init__(store, paths)
        self.metrics: list[dict] = []

    def put_metrics(self, metrics: dict) -> None:
        super().put_metrics(metrics)
        self.metrics.append(json.loads(json.dumps(metrics)))


class Stopped(BaseException):
    """What the runner's SIGTERM handler raises (its ``Preempted``)."""


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """The built-in model on disk, a LoRA adapter of it, and a damaged copy of that adapter."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from autoslm.engine.train.tiny import ensure_tiny

    root = tmp_path_factory.mktemp("models")
    model = ensure_tiny(root / "models")
    adapter = root / "adapter"
    peft = get_peft_model(AutoModelForCausalLM.from_pretrained(model), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    peft.save_pretrained(adapter)
    damaged = root / "damaged"
    damaged.mkdir()
    (damaged / "adapter_config.json").write_text((adapter / "adapter_config.json").read_text())
    (damaged / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    return str(model), adapter, damaged


def job_for(tmp_path: Path, model: str, end: LimitEnd | None = None):
    from autoslm.engine.pod import uploader as uploads

    task = task_files(tmp_path, "tiny_sum")
    spec = parse_spec(SPEC.format(task=task))
    env = {
        "AUTOSLM_JOBSPEC": spec.to_json(),
        "AUTOSLM_RUN_ID": "r",
        "AUTOSLM_STORE": (tmp_path / "store").as_uri(),
        "AUTOSLM_WORKDIR": str(tmp_path / "work"),
    }
    ctx = WorkerContext.from_env(env)
    artifacts = Recording(open_store(ctx.store_uri), ctx.paths(spec.phase))
    uploader = uploads.for_run(artifacts, spec, staging_dir=tmp_path / "staging", log=lambda m: None)
    reporter = Reporter(uploader, run_id="r", seed=0, phase=spec.phase, attempt=1, log=lambda m: None)
    job = phases.Job(ctx, spec, artifacts, uploader, reporter, Ranks())
    job.model_path, job.limit_stop = model, LimitStop(end, store="local")
    return job


def started(job, name: str) -> bool:
    """Has the phase started model ``name``'s harness process (its log is opened right before)?"""
    return (job.ctx.workdir / "lm_eval" / f"{name}.log").exists()


def harness_pids(request: Path) -> list[int]:
    """Processes still running the harness on ``request``."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and str(request) in (d / "cmdline").read_bytes().decode(errors="replace"):
                out.append(int(d.name))
        except OSError:
            continue
    return out


def test_base_then_adapter_each_in_its_own_process_the_base_kept_before_the_adapter_starts(tmp_path, model_dirs):
    model, adapter, _ = model_dirs
    job = job_for(tmp_path, model)
    seen_at_adapter_start: list = []

    def clock() -> float:  # the real time; and what was written when the adapter's process started
        if started(job, "adapter") and not seen_at_adapter_start:
            stored = job.artifacts.get_metrics() or {}
            on_disk = (job.ctx.workdir / "lm_eval" / "base.json").is_file()
            seen_at_adapter_start.append((stored.get("lm_eval") or {}, on_disk))
        return time.time()

    metrics = {"final_loss": 1.0, "lm_eval": {"state": "running"}}
    block = run_after_hand_back(job, adapter, metrics, stopped=Stopped, clock=clock)
    job.uploader.close(timeout=30)
    [(stored, on_disk)] = seen_at_adapter_start
    assert on_disk and set(stored["models"]) == {"base"} and stored["state"] == "running", stored
    assert set(block["models"]) == {"base", "adapter"} and set(block["model_seconds"]) == {"base", "adapter"}
    assert "state" not in block and "cut" not in block and "error" not in block, block
    assert block["models"]["adapter"]["tiny_sum"]["samples"] == 2
    final = job.artifacts.get_metrics()
    assert final["lm_eval"] == block and final["final_loss"] == 1.0 and final["lm_eval_time_s"] == block["seconds"]
    assert [set(m["lm_eval"].get("models") or {}) for m in job.artifacts.metrics] == [
        {"base"},
        {"base", "adapter"},
        {"base", "adapter"},
    ]


def test_a_failed_adapter_keeps_the_bases_scores(tmp_path, model_dirs):
    model, _, damaged = model_dirs
    job = job_for(tmp_path, model)
    block = run_after_hand_back(job, damaged, {"lm_eval": {"state": "running"}}, stopped=Stopped)
    job.uploader.close(timeout=30)
    assert set(block["models"]) == {"base"} and block["models"]["base"]["tiny_sum"]["samples"] == 2, block
    assert set(block["errors"]) == {"adapter"} and block["errors"]["adapter"].startswith("lm-eval exited with 1"), block
    assert job.artifacts.get_metrics()["lm_eval"] == block and "state" not in block


def test_the_limit_stops_the_running_harness_and_keeps_the_bases_scores(tmp_path, model_dirs):
    model, adapter, _ = model_dirs
    end = LimitEnd(time.time() + 3600, "max_hours")
    job = job_for(tmp_path, model, end)

    def clock() -> float:  # the limit comes once the adapter's harness runs
        return end.at - harness_end_s("local") if started(job, "adapter") else time.time()

    block = run_after_hand_back(job, adapter, {"lm_eval": {"state": "running"}}, stopped=Stopped, clock=clock)
    job.uploader.close(timeout=30)
    assert block["cut"] == {
        "by": "max_hours",
        "models": ["adapter"],
        "words": "the time limit (limits.max_hours) cut lm-eval before it scored the adapter; the base's scores are kept",
    }
    assert set(block["models"]) == {"base"} and job.artifacts.get_metrics()["lm_eval"] == block
    assert harness_pids(job.ctx.workdir / "lm_eval" / "adapter.request.json") == []  # stopped, not left running


def test_a_sigterm_stops_the_running_harness_and_keeps_the_bases_scores(tmp_path, model_dirs):
    model, adapter, _ = model_dirs
    job = job_for(tmp_path, model)

    def raise_stopped(signum, frame):
        raise Stopped()

    def stop_once_the_adapter_runs():
        until = time.monotonic() + 300
        while not started(job, "adapter") and time.monotonic() < until:
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, raise_stopped)
    try:
        threading.Thread(target=stop_once_the_adapter_runs, daemon=True).start()
        block = run_after_hand_back(job, adapter, {"lm_eval": {"state": "running"}}, stopped=Stopped)
    finally:
        signal.signal(signal.SIGTERM, previous)
    job.uploader.close(timeout=30)
    assert block["cut"]["by"] == "SIGTERM" and block["cut"]["models"] == ["adapter"], block
    assert set(block["models"]) == {"base"} and job.artifacts.get_metrics()["lm_eval"] == block
    assert harness_pids(job.ctx.workdir / "lm_eval" / "adapter.request.json") == []
