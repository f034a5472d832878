"""End to end on Hugging Face Jobs with a network group: `autoslm launch` of the SFT quickstart with
`compute.nodes = 2` on the fake Jobs server and the fake Hub. Two jobs in one network group, each the
real worker in its own working directory; node 1 reaches node 0 at ${HF_NETWORK_GROUP_PREFIX}<alias>
(the fake resolves the group's names in each job: tests/fakes/hfjobs.py). The run trains over 2 ranks,
and ends at the loss of the same spec on one job.

    .venv/bin/python -m pytest -q tests/e2e/test_hfjobs_nodes.py
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from autoslm.providers.hfjobs.group import network_names
from tests.conftest import backoff, edited_spec
from tests.e2e.test_hfjobs_launch import HUB_REPO, hfjobs_rig
from tests.fakes.hfjobs import network_groups_resolve

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not network_groups_resolve(), reason="this machine allows no mount namespace (unshare --mount)"),
]

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 600
STEPS = 12  # of the quickstart's 150: a shorter run, the same shape


def _spec(tmp_path: Path, nodes: int) -> Path:
    compute = 'provider = "hfjobs"\ngpu = "L4"' + (f"\nnodes = {nodes}" if nodes > 1 else "")
    return edited_spec(
        REPO / "jobspecs" / "quickstart.toml",
        [
            ('name = "quickstart"', f'name = "quickstart-{nodes}n"'),
            ("max_steps = 150", f"max_steps = {STEPS}"),
            ("save_every = 100", f"save_every = {STEPS}"),
            ('provider = "local"', compute),
            ('store = "local"', f'store = "hf"\nrepo = "{HUB_REPO}"\ncommits_per_hour = 120'),
        ],
        tmp_path / f"quickstart-{nodes}n.toml",
    )


def test_quickstart_on_two_jobs_of_a_network_group_trains_over_both_to_the_loss_of_one_job(tmp_path):
    with hfjobs_rig(tmp_path) as (hub, jobs, cli):
        runs = {}
        for nodes in (2, 1):  # side by side: the one-job run is the reference
            r = cli("launch", str(_spec(tmp_path, nodes)), "--detach", "--yes")
            assert r.returncode == 0, r.stdout + r.stderr
            runs[nodes] = next(
                line.split()[1] for line in r.stdout.splitlines() if line.startswith("run ") and " launched" in line
            )

        deadline, pause, ended = time.monotonic() + TIMEOUT, backoff(1.0, cap=4.0), {}
        while len(ended) < 2:
            for nodes, run_id in runs.items():
                st = json.loads(cli("status", run_id, "--json").stdout)
                if st["state"] in ("succeeded", "failed", "cancelled"):
                    ended[nodes] = st
            logs = "\n".join(f"--- job {j.id} ---\n{jobs.log(j.id)[-2000:]}" for j in jobs.jobs())
            assert time.monotonic() < deadline, f"the runs did not end: {ended}\n{logs}"
            time.sleep(next(pause))

        two, one = ended[2], ended[1]
        logs = "\n".join(f"--- job {j.id} ---\n{jobs.log(j.id)[-3000:]}" for j in jobs.jobs())
        assert two["state"] == "succeeded" and two["step"] == two["total_steps"] == STEPS, (two, logs)
        assert one["state"] == "succeeded", (one, logs)

        def metrics(run_id: str) -> dict:
            return json.loads(hub.files(HUB_REPO)[f"sft/{run_id}/seed0/metrics.json"])

        m2, m1 = metrics(runs[2]), metrics(runs[1])
        assert m2["world_size"] == 2 and m1["world_size"] == 1
        assert m2["final_loss"] == pytest.approx(m1["final_loss"], abs=1e-3), (m2["final_loss"], m1["final_loss"])
        assert f"sft/{runs[2]}/seed0/adapter/adapter_model.safetensors" in hub.files(HUB_REPO)

        # Three jobs: the reference's, and the group's two, in one network group with node 0's alias, each
        # told its node; all ended, none left running; the group billed as two jobs.
        group_jobs = sorted((j for j in jobs.jobs() if j.network_group), key=lambda j: j.labels["autoslm-node"])
        assert len(jobs.jobs()) == 3 and len(group_jobs) == 2 and not jobs.running_jobs()
        group_name, alias = network_names(group_jobs[0].labels["autoslm-pod"])
        assert [(j.network_group, j.network_aliases, j.env["NODE_RANK"]) for j in group_jobs] == [
            (group_name, [alias], "0"),
            (group_name, [], "1"),
        ]
        assert all(j.env["AUTOSLM_PRIMARY_ALIAS"] == alias and j.env["NUM_NODES"] == "2" for j in group_jobs)
        assert two["cost_usd"] > 0 and one["cost_usd"] > 0
