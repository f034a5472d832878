"""A create the vendor refuses outright (no credit, a key refused) is an answer: the real CLI, as a
process, against the fake Hugging Face Jobs, RunPod and Vast servers. The launch fails in one line that
says what was refused and what to do, the run is failed with no launch intent left standing, and no
supervisor is started for it (none keeps looking for a create that cannot land).

    .venv/bin/python -m pytest -q tests/integration/test_create_refused.py
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from autoslm.controller import daemon
from tests.fakes.hfjobs import FakeHFJobs
from tests.fakes.hub import FakeHub
from tests.fakes.runpod import FakeRunPod
from tests.fakes.vast import FakeVast

REPO = Path(__file__).resolve().parents[2]
HF_TOKEN = "hf_RefusedCreateHubSecret3Kq8Zp1Lm6"
KEY = "vendor-RefusedCreateKey-5c2e9a"

SPEC = """name = "refused"
model = "autoslm/tiny"
[environment]
id = "autoslm/arith"
[train]
max_steps = 20
[compute]
provider = "{provider}"
gpu = "{gpu}"
image = "ghcr.io/autoslm/worker:0.1.0"
[artifacts]
store = "hf"
repo = "someone/runs"
[limits]
max_hours = 1
"""


def _refusing(vendor: str, tmp_path: Path):
    """The vendor's fake, set to refuse every create as its API does without credit; its CLI environment,
    GPU, and the words the refusal must say."""
    if vendor == "hfjobs":
        fake = FakeHFJobs(api_key=HF_TOKEN, workdir=tmp_path / "fake").start()
        fake.no_credits(True)
        return fake, fake.env(), "L4", ("prepaid credits", "https://huggingface.co/settings/billing")
    if vendor == "runpod":
        fake = FakeRunPod(api_key=KEY, workdir=tmp_path / "fake").start()
        fake.fail_next(50, 402, method="POST", path="/v2/pods")
        return fake, fake.env(), "RTX 4090", ("insufficient balance", "add credit")
    fake = FakeVast(api_key=KEY, workdir=tmp_path / "fake").start()
    fake.fail_next(50, 402, method="PUT", path="/api/v0/asks/", body={"success": False, "error": "insufficient_credit"})
    return fake, fake.env(), "RTX 4090", ("insufficient_credit", "add credit")


def _daemons_of(run_id: str) -> list[int]:
    """Processes supervising this run, whatever started them (the daemon's command line names its run)."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"autoslm.controller.daemon" in argv and run_id.encode() in argv:
            out.append(int(proc.name))
    return out


@pytest.mark.parametrize("vendor", ["hfjobs", "runpod", "vast"])
def test_a_refused_create_fails_the_launch_in_one_line_and_leaves_nothing_to_supervise(vendor, tmp_path):
    fake, vendor_env, gpu, words = _refusing(vendor, tmp_path)
    home = tmp_path / "home"
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.format(provider=vendor, gpu=gpu))
    with fake, FakeHub(token=HF_TOKEN) as hub:
        env = {k: v for k, v in os.environ.items() if k not in ("RUNPOD_API_KEY", "VAST_API_KEY", "HF_TOKEN", "AUTOSLM_DEBUG")}
        env.update({"AUTOSLM_HOME": str(home), "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(REPO)})
        env.update({**hub.env(), **vendor_env})

        def cli(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, "-m", "autoslm", *args], capture_output=True, text=True, env=env, timeout=120, cwd=str(REPO)
            )

        launched = cli("launch", str(spec), "--detach", "--yes")
        runs = json.loads(cli("list", "--json").stdout)
        run_id = runs[0]["run_id"]
        left = _daemons_of(run_id)
        try:
            assert launched.returncode == 3, launched.stdout + launched.stderr
            (line,) = launched.stderr.strip().splitlines()
            assert all(w in line for w in words) and "may still" not in line and run_id in line, line
            assert "nothing it started is left running" in line and KEY not in line and HF_TOKEN not in line
            # No supervisor was started, and none is alive: the refusal ended the run at once.
            assert not daemon.pidfile(home, run_id).exists() and not left, left
            st = json.loads(cli("status", run_id, "--json").stdout)
            assert st["state"] == "failed" and words[0] in st["error"], st
            assert not _daemons_of(run_id) and not daemon.pidfile(home, run_id).exists(), "`status` started a supervisor"
            assert not fake.existing_pods()
        finally:
            for pid in left + _daemons_of(run_id):
                os.kill(pid, signal.SIGKILL)  # a supervisor the launch started (before the fix): ended with the test
