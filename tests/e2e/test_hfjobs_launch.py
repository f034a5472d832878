"""End to end on Hugging Face Jobs with only HF_TOKEN: `autoslm launch` of the SFT quickstart set to
provider "hfjobs", against the fake Jobs server and the fake Hub (the same token holds the store and
rents the job). The fake runs the real worker as a local process; its machine fails once mid-run, and
the run is relaunched, resumes from its Hub checkpoint and ends with its adapter in the store.

    .venv/bin/python -m pytest -q tests/e2e/test_hfjobs_launch.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import backoff, edited_spec
from tests.fakes.container_registry import FakeContainerRegistry
from tests.fakes.hfjobs import FakeHFJobs
from tests.fakes.hub import FakeHub

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
HF_TOKEN = "hf_E2eJobsHubSecret7Q2xZ9mW4vK1tR3"
HUB_REPO = "someone/runs"
TIMEOUT = 300
STEPS = 80  # of the quickstart's 150: a shorter run, the same shape


@contextmanager
def hfjobs_rig(tmp_path: Path) -> Iterator[tuple[FakeHub, FakeHFJobs, Callable[..., subprocess.CompletedProcess]]]:
    """The fake Hub (the store), the fake Jobs service and the published worker image, and ``cli``: the real
    CLI as a process with only the Hub token among the vendors' keys."""
    with (
        FakeHub(token=HF_TOKEN) as hub,
        FakeHFJobs(api_key=HF_TOKEN, workdir=tmp_path / "jobs") as jobs,
        FakeContainerRegistry(published={"autoslm/worker:0.1.0"}) as registry,
    ):
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("RUNPOD_API_KEY", "VAST_API_KEY", "HUGGING_FACE_HUB_TOKEN", "AUTOSLM_DEBUG")
        }
        env.update(
            {"AUTOSLM_HOME": str(tmp_path / "home"), "HF_HOME": str(tmp_path / "hf"), **hub.env(), **jobs.env(), **registry.env()}
        )

        def cli(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, "-m", "autoslm", *args], capture_output=True, text=True, env=env, timeout=120, cwd=str(REPO)
            )

        yield hub, jobs, cli


def test_quickstart_on_hf_jobs_with_only_hf_token_survives_a_failed_machine(tmp_path):
    spec = edited_spec(
        REPO / "jobspecs" / "quickstart.toml",
        [
            ("max_steps = 150", f"max_steps = {STEPS}"),
            ("save_every = 100", "save_every = 10"),
            ('provider = "local"', 'provider = "hfjobs"\ngpu = "L4"'),
            ('store = "local"', f'store = "hf"\nrepo = "{HUB_REPO}"\ncommits_per_hour = 120'),
        ],
        tmp_path / "quickstart-hfjobs.toml",
    )
    with hfjobs_rig(tmp_path) as (hub, jobs, cli):
        # The commit budget (120/hour: a token every 30 s, 6 saved up) would hold the first checkpoint back
        # until the run's end: the Hub answers slowly while the worker sets up (fewer, fuller commits),
        # then a little slowly, as tests/e2e/test_cloud_providers.py's preempted run does.
        hub.delay_commits(8.0)
        try:
            r = cli("launch", str(spec), "--detach", "--yes")
            assert r.returncode == 0, r.stdout + r.stderr
            run_id = next(line.split()[1] for line in r.stdout.splitlines() if line.startswith("run ") and " launched" in line)
            prefix = f"sft/{run_id}/seed0/"

            def files() -> dict[str, bytes]:
                return {p[len(prefix) :]: b for p, b in hub.files(HUB_REPO).items() if p.startswith(prefix)}

            def events() -> list[dict]:
                return [json.loads(line) for line in files().get("events.jsonl", b"").decode().splitlines() if line.strip()]

            deadline = time.monotonic() + TIMEOUT
            (first,) = jobs.jobs()

            def waiting(what: str) -> None:
                assert time.monotonic() < deadline, what
                assert first.process is not None and first.process.alive(), jobs.log(first.id)[-3000:]
                time.sleep(0.05)

            while not any(e["kind"] == "eval" for e in events()):
                waiting("the worker never got to its first evaluation")
            hub.delay_commits(0.5)
            # The job's machine fails once a checkpoint is in the Hub and before the run is done.
            while not any(p.startswith("checkpoint/") and p.endswith("/autoslm_manifest.json") for p in files()):
                waiting("no checkpoint reached the Hub")
        finally:
            hub.delay_commits(0)
        jobs.crash(first.id)
        assert "DONE" not in files(), "the run finished before its machine failed"

        pause = backoff(0.5, cap=3.0)
        while (st := json.loads(cli("status", run_id, "--json").stdout))["state"] not in ("succeeded", "failed", "cancelled"):
            assert time.monotonic() < deadline, f"the run did not end: {st}"
            time.sleep(next(pause))
        assert st["state"] == "succeeded", st
        assert st["provider"] == "hfjobs" and st["restarts"] == 1 and st["step"] == st["total_steps"] == STEPS, st
        assert st["adapter"] == f"hf://{HUB_REPO}/{prefix}adapter" and st["cost_usd"] > 0, st
        got = files()
        assert "adapter/adapter_model.safetensors" in got and "DONE" in got
        assert [e["data"]["attempt"] for e in events() if e["kind"] == "worker_start"] == [1, 2]
        (resume,) = [e for e in events() if e["kind"] == "resume"]
        assert 0 < resume["data"]["from_step"] < STEPS

        # Two jobs, both ended; each had the token as a secret only, and a timeout.
        assert len(jobs.jobs()) == 2 and not jobs.running_jobs()
        for body in jobs.launch_calls:
            assert body["secrets"]["HF_TOKEN"] == HF_TOKEN and HF_TOKEN not in json.dumps(body["environment"])
            assert body["flavor"] == "l4x1" and body["timeoutSeconds"] > 3600
        assert [j.labels["autoslm-attempt"] for j in jobs.jobs()] == ["1", "2"]
