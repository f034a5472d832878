"""A run whose id is long (a JobSpec name of 48 characters, the most it may have) on Hugging Face Jobs,
whose fake holds a job's labels to Kubernetes' rule (63 characters of [A-Za-z0-9_.-]) as the service may:
the real CLI, as processes. Its job is created with every name and label within the rule (the run id
shortened with a hash), and what finds pods by their names keeps working with the shortened one: a stray
job of the run is ended by the supervisor's sweep, and `gc` ends and bills one left after the run ended.

    .venv/bin/python -m pytest -q tests/integration/test_long_names.py
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from autoslm.controller import daemon
from autoslm.controller.podnames import home_id, pod_name
from autoslm.providers.base import is_label
from autoslm.providers.hfjobs.provider import HFJobsProvider
from tests.fakes.cloud import wait_for
from tests.fakes.hfjobs import FakeHFJobs
from tests.fakes.hub import FakeHub
from tests.fakes.pods import pod_request

REPO = Path(__file__).resolve().parents[2]
HF_TOKEN = "hf_LongNamesHubSecret4Vb7Xc2Nm9"
NAME = "a-forty-eight-character-run-name-for-the-longest"
SPEC = f"""name = "{NAME}"
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


def test_a_long_run_id_keeps_every_label_within_the_rule_and_its_pods_are_still_found_by_name(tmp_path):
    assert len(NAME) == 48
    home = tmp_path / "home"
    (tmp_path / "spec.toml").write_text(SPEC)
    sleep = ["python", "-c", "import time; time.sleep(600)"]
    with FakeHFJobs(api_key=HF_TOKEN, workdir=tmp_path / "fake", worker_command=sleep) as jobs, FakeHub(token=HF_TOKEN) as hub:
        env = {k: v for k, v in os.environ.items() if k not in ("RUNPOD_API_KEY", "VAST_API_KEY", "HF_TOKEN", "AUTOSLM_DEBUG")}
        env.update({"AUTOSLM_HOME": str(home), "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(REPO)})
        env.update({**hub.env(), **jobs.env()})

        def cli(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, "-m", "autoslm", *args], capture_output=True, text=True, env=env, timeout=120, cwd=str(REPO)
            )

        launched = cli("launch", str(tmp_path / "spec.toml"), "--detach", "--yes", "--poll-s", "0.5")
        (run,) = json.loads(cli("list", "--json").stdout)
        run_id = run["run_id"]
        try:
            assert launched.returncode == 0, launched.stdout + launched.stderr
            assert len(run_id) > 63
            (job,) = jobs.jobs()
            assert all(is_label(k) and is_label(v) for k, v in job.labels.items()), job.labels
            mine = home_id(home)
            assert job.labels["autoslm-pod"] == pod_name(mine, run_id, 0, 1) and job.labels["autoslm-home"] == mine
            assert json.loads(cli("status", run_id, "--json").stdout)["pod_id"] == job.id

            # A job of the run that no replica records (an old attempt's create that landed late): the
            # supervisor's sweep of the provider's list finds it by its shortened name and ends it.
            provider = HFJobsProvider(HF_TOKEN, base_url=jobs.url)

            def stray(attempt: int) -> str:
                return provider.launch(pod_request(pod_name(mine, run_id, 0, attempt), sleep, gpu_types=("L4",))).pod_id

            late = stray(5)
            wait_for(lambda: jobs.job(late).stage == "CANCELED", timeout=60)
            assert jobs.job(job.id).stage == "RUNNING", "the run's own job is kept"

            assert cli("cancel", run_id).returncode == 0
            assert jobs.job(job.id).stage == "CANCELED"
            # After the run ended, `gc` ends a job left with its name, and bills it to the run.
            left = stray(9)
            r = cli("gc")
            assert r.returncode == 0 and f"terminated hfjobs pod {left}" in r.stdout, r.stdout + r.stderr
            assert jobs.job(left).stage == "CANCELED"
        finally:
            pid = daemon.running_pid(home, run_id)
            if pid is not None:  # the run is over: its supervisor ends at its next look, or with the test
                os.kill(pid, signal.SIGKILL)
