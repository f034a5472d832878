"""`autoslm gc` while a vendor's list of pods answers 500: the real CLI, as a process, against the fake
Hugging Face Jobs and RunPod servers. It ends nothing (it cannot tell what is there), and says so in one
line within seconds, with no retry chatter: one retry policy (providers/http.with_retries), quiet.

    .venv/bin/python -m pytest -q tests/integration/test_gc_outage.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fakes.hfjobs import NAMESPACE, FakeHFJobs
from tests.fakes.runpod import FakeRunPod

REPO = Path(__file__).resolve().parents[2]
HF_TOKEN = "hf_GcOutageHubSecret8Rt2Yq5Wn1"
# Far above what the policy takes (five tries, 7.5 s of waits) on a loaded machine; far below the minutes
# a second layer of retries under it took.
BOUND_S = 60


@pytest.mark.parametrize("vendor", ["hfjobs", "runpod"])
def test_gc_with_a_failing_list_says_so_in_one_line_within_seconds(vendor, tmp_path):
    if vendor == "hfjobs":
        fake = FakeHFJobs(api_key=HF_TOKEN, workdir=tmp_path / "fake")
        listing, title = f"/api/jobs/{NAMESPACE}", "Hugging Face Jobs"
    else:
        fake = FakeRunPod(workdir=tmp_path / "fake")
        listing, title = "/v2/pods", "RunPod"
    with fake:
        fake.fail_next(1000, 500, method="GET", path=listing)
        env = {k: v for k, v in os.environ.items() if k not in ("RUNPOD_API_KEY", "VAST_API_KEY", "HF_TOKEN", "AUTOSLM_DEBUG")}
        env.update({"AUTOSLM_HOME": str(tmp_path / "home"), "HF_HOME": str(tmp_path / "hf"), **fake.env()})
        started = time.monotonic()
        r = subprocess.run(
            [sys.executable, "-m", "autoslm", "gc"], capture_output=True, text=True, env=env, timeout=600, cwd=str(REPO)
        )
        took = time.monotonic() - started
    assert r.returncode == 3 and r.stderr == "", r.stderr[-2000:]
    (line,) = r.stdout.strip().splitlines()
    assert line.startswith(f"FAILED {vendor}: could not list pods: {title} kept failing (HTTP 500)"), line
    assert took < BOUND_S, f"gc took {took:.0f}s"
