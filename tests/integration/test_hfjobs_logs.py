"""`autoslm logs RUN` of a Hugging Face Jobs run: the real CLI, as processes, against the fake Jobs server
(whose log stream is the API's server-sent events, as huggingface_hub's ``fetch_job_logs`` reads them)
and the fake Hub. It shows the job's own output, as a local run shows its worker's log; `--events`
shows the run's events as lines a person reads, and `--json` keeps them JSON lines.

    .venv/bin/python -m pytest -q tests/integration/test_hfjobs_logs.py
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from autoslm.controller import daemon
from tests.fakes.cloud import wait_for
from tests.fakes.hfjobs import FakeHFJobs
from tests.fakes.hub import FakeHub

REPO = Path(__file__).resolve().parents[2]
HF_TOKEN = "hf_JobLogsHubSecret6Hd3Wq8Lp2"
SPEC = """name = "joblogs"
model = "autoslm/tiny"
[environment]
id = "autoslm/arith"
[train]
max_steps = 20
[compute]
provider = "hfjobs"
gpu = "L4"
image = "ghcr.io/autoslm/worker:0.1.0"
[artifacts]
store = "hf"
repo = "someone/runs"
[limits]
max_hours = 1
"""
# The job: says what it does on its output, records two events in the run's store, then waits to be ended.
JOB = """
import os, time
from autoslm.layout import Event, RunPaths
from autoslm.store import RunArtifacts, open_store
art = RunArtifacts(open_store(os.environ["AUTOSLM_STORE"]), RunPaths("sft", os.environ["AUTOSLM_RUN_ID"], 0))
print("installing the trainer: 12 packages", flush=True)
art.append_events([Event(kind="worker_start", data={"attempt": 1, "host": "job"}), Event(kind="train_begin", data={"max_steps": 20})])
print("the trainer is up", flush=True)
time.sleep(600)
"""


def test_logs_of_a_jobs_run_show_the_jobs_own_output_and_events_a_person_reads(tmp_path):
    home = tmp_path / "home"
    (tmp_path / "spec.toml").write_text(SPEC)
    with (
        FakeHFJobs(api_key=HF_TOKEN, workdir=tmp_path / "fake", worker_command=["python", "-c", JOB]) as jobs,
        FakeHub(token=HF_TOKEN) as hub,
    ):
        env = {k: v for k, v in os.environ.items() if k not in ("RUNPOD_API_KEY", "VAST_API_KEY", "HF_TOKEN", "AUTOSLM_DEBUG")}
        env.update({"AUTOSLM_HOME": str(home), "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(REPO)})
        env.update({**hub.env(), **jobs.env()})

        def cli(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, "-m", "autoslm", *args], capture_output=True, text=True, env=env, timeout=120, cwd=str(REPO)
            )

        launched = cli("launch", str(tmp_path / "spec.toml"), "--detach", "--yes")
        (run,) = json.loads(cli("list", "--json").stdout)
        run_id = run["run_id"]
        try:
            assert launched.returncode == 0, launched.stdout + launched.stderr
            (job,) = jobs.jobs()
            wait_for(lambda: "the trainer is up" in jobs.log(job.id), timeout=60)
            r = cli("logs", run_id)
            assert r.returncode == 0 and r.stdout.splitlines() == ["installing the trainer: 12 packages", "the trainer is up"], (
                r.stdout + r.stderr
            )
            r = cli("logs", run_id, "--events")
            lines = r.stdout.splitlines()
            assert r.returncode == 0 and len(lines) == 2, r.stdout + r.stderr
            assert lines[0].endswith("seed0: worker started (attempt 1, host job)") and lines[1].endswith(
                "seed0: training began (20 steps)"
            ), lines
            r = cli("logs", run_id, "--json")
            assert [json.loads(line)["kind"] for line in r.stdout.splitlines()] == ["worker_start", "train_begin"], r.stdout
            assert HF_TOKEN not in cli("logs", run_id).stdout + r.stdout
            assert cli("cancel", run_id).returncode == 0
            # An ended job's log is kept: shown after the run, as a local run's log file is.
            r = cli("logs", run_id)
            assert r.stdout.splitlines() == ["installing the trainer: 12 packages", "the trainer is up"], r.stdout + r.stderr
            r = cli("logs", run_id, "--follow")  # followed: the job's stream to its end, then the run's end
            assert r.stdout.splitlines() == ["installing the trainer: 12 packages", "the trainer is up"], r.stdout + r.stderr
        finally:
            pid = daemon.running_pid(home, run_id)
            if pid is not None:  # the run is over: its supervisor ends at its next look, or with the test
                os.kill(pid, signal.SIGKILL)
