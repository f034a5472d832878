"""A rented GPU pod whose torch sees no CUDA never trains on its CPU: the worker fails it as a faulty
host, in one line naming the GPU asked for, the driver nvidia-smi reports (none here) and the CUDA torch
needs, retryable, and the supervisor relaunches it as it would a lost host, within limits.max_restarts.

The fake RunPod starts the real worker on this CPU-only machine. Its pods usually say they have no GPU
(``cpu_pods``, tests/fakes/cloud.py), which is how the other runs on the fakes train; here the fake
says nothing, as a real vendor's pod would not.

    .venv/bin/python -m pytest -q tests/e2e/test_no_cuda_pod.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import backoff
from tests.e2e.test_sft_local import run_id_from
from tests.fakes.hub import FakeHub
from tests.fakes.runpod import FakeRunPod

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
RUNPOD_KEY = "rpkey-NoCudaPodTestSecret-7a1c3e5f"
HF_TOKEN = "hf_NoCudaPodHubSecret5T2nW8qL3vK6"
HUB_REPO = "someone/runs"
SPEC = """name = "nocuda"
model = "autoslm/tiny"
[environment]
id = "autoslm/arith"
[train]
max_steps = 4
[compute]
provider = "runpod"
gpu = "RTX 4090"
image = "ghcr.io/autoslm/worker:0.1.0"  # the worker runs as in the image
[artifacts]
store = "hf"
repo = "someone/runs"
[limits]
max_hours = 1
max_restarts = 1
"""


def test_a_rented_pod_without_cuda_is_relaunched_within_max_restarts_then_fails(tmp_path, home):
    with FakeHub(token=HF_TOKEN) as hub, FakeRunPod(api_key=RUNPOD_KEY, workdir=tmp_path / "rp", cpu_pods=False) as runpod:
        env = {k: v for k, v in os.environ.items() if k not in ("HUGGING_FACE_HUB_TOKEN", "AUTOSLM_DEBUG")}
        env.update({"AUTOSLM_HOME": str(home), "PYTHONPATH": str(REPO), **hub.env(), **runpod.env()})

        def cli(*args):
            return subprocess.run(
                [sys.executable, "-m", "autoslm", *args], capture_output=True, text=True, env=env, cwd=str(REPO), timeout=300
            )

        path = tmp_path / "nocuda.toml"
        path.write_text(SPEC)
        r = cli("launch", str(path), "--detach", "--yes")
        assert r.returncode == 0, r.stdout + r.stderr
        run_id = run_id_from(r.stdout)
        deadline, pause = time.monotonic() + 480, backoff(1.0, cap=3.0)
        while True:
            st = json.loads(cli("status", run_id, "--json").stdout)
            if st["state"] in ("succeeded", "failed", "cancelled") or time.monotonic() > deadline:
                break
            time.sleep(next(pause))
        logs = "\n".join(runpod.log(p.id)[-2000:] for p in runpod.pods())
        assert st["state"] == "failed", (st, logs)
        # The first pod and one relaunch (max_restarts = 1), each failing the same way, and neither trained.
        assert len(runpod.launch_calls) == 2 and all(p.deleted for p in runpod.pods()), (runpod.pods(), logs)
        error = st["error"]
        assert error.startswith("gave up after 1 restarts (limits.max_restarts): "), error
        assert "a pod rented from RunPod for RTX 4090, but torch sees no CUDA" in error, error
        assert "nvidia-smi reports " in error and "needs CUDA" in error, error
        files = hub.files(HUB_REPO)
        assert not [f for f in files if f.startswith(f"sft/{run_id}/seed0/checkpoints/") or "/adapter/" in f], sorted(files)
        beats = files[f"sft/{run_id}/seed0/heartbeat.json"]
        hb = json.loads(beats)
        assert hb["stage"] == "error" and hb["step"] == 0 and hb["attempt"] == 2 and hb.get("retryable") is True, hb
