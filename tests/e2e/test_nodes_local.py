"""compute.nodes = 2 on this machine: two node processes of the worker joined over 127.0.0.1, each with
its own working directory, through the real CLI and the real worker.

The promises: the SFT quickstart on 2 nodes records world_size 2 and ends at the loss of 1 process;
`status` names each node and which holds rank 0; `logs` shows node 0's output, `logs --node 1` node 1's;
the GRPO quickstart continues that adapter on 2 nodes; a lost node ends the other, both are relaunched
and resume from the newest checkpoint to the same loss; `cancel` leaves no process of either node.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import edited_spec
from tests.e2e.test_sft_local import run_id_from, status, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.worker]  # worker: run on the image's pins (make test: only there)

QUICKSTART = Path(__file__).resolve().parents[2] / "jobspecs"
STEPS = 40  # the killed run: its first checkpoint (step 8) well before its end


def quickstart(tmp_path: Path, name: str, nodes: int, steps: int = 16, save_every: int = 8) -> Path:
    """The SFT quickstart, shortened, on ``nodes`` nodes."""
    edits = [
        ('name = "quickstart"', f'name = "{name}"'),
        ("n_eval = 64", "n_eval = 8"),
        ("max_steps = 150", f"max_steps = {steps}"),
        ("save_every = 100", f"save_every = {save_every}"),
        ('provider = "local"', f'provider = "local"\nnodes = {nodes}'),
    ]
    return edited_spec(QUICKSTART / "quickstart.toml", edits, tmp_path / f"{name}.toml")


def seed_dir(st: dict) -> Path:
    return Path(st["store"].removeprefix("file://")) / st["phase"] / st["run_id"] / "seed0"


def events(st: dict) -> list[dict]:
    return [json.loads(line) for line in (seed_dir(st) / "events.jsonl").read_text().splitlines()]


def run_pids(run_id: str) -> list[int]:
    """Every live process of this machine that runs for this run (read from /proc: they are ours)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            raw = (d / "environ").read_bytes().decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"AUTOSLM_RUN_ID={run_id}\0" in raw + "\0" and state != "Z":
            out.append(int(d.name))
    return out


def gone(run_id: str, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while run_pids(run_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not run_pids(run_id)


def test_two_nodes_train_as_one_process_and_grpo_continues_on_two(cli, tmp_path, home):
    one = cli("launch", str(quickstart(tmp_path, "one-node", nodes=1)))
    assert one.code == 0, one.out + one.err
    two = cli("launch", str(quickstart(tmp_path, "quickstart", nodes=2)))
    assert two.code == 0, two.out + two.err
    m1 = status(cli, run_id_from(one.out))["metrics"]["seed0"]
    run_id = run_id_from(two.out)
    st = status(cli, run_id)
    assert st["state"] == "succeeded" and st["step"] == st["total_steps"] == 16
    m2 = st["metrics"]["seed0"]
    assert m2["world_size"] == 2 and m1["world_size"] == 1
    assert m2["final_loss"] == pytest.approx(m1["final_loss"], abs=1e-3)

    # Each node: its pod, which ranks it holds, how it ended (node 0 holds rank 0).
    (seed,) = st["seeds"]
    assert seed["stage"] != "error", seed  # the nodes ended after DONE leave no error heartbeat behind it
    assert seed["gpu"] == "2 nodes of 1 CPU process (gloo)" and seed["pod_id"] is None  # ended and forgotten
    assert [(n["node"], n["ranks"]) for n in seed["nodes"]] == [(0, [0]), (1, [1])]
    assert all(n["state"] in ("exited", "terminated") and n["pod_id"].startswith("local-") for n in seed["nodes"])
    said = cli("status", run_id).out
    assert "node 0 (rank 0): " in said and "node 1 (rank 1): " in said
    assert not list((home / "pods").glob("*/node*"))  # the nodes' working directories went with them
    # `logs`: node 0's output (rank 0 reports); --node 1 the other's; a node that is not there is one line.
    node0, node1 = cli("logs", run_id), cli("logs", run_id, "--node", "1")
    assert node0.code == node1.code == 0 and node0.out.strip() and node1.out.strip() and node0.out != node1.out
    bad = cli("logs", run_id, "--node", "2")
    assert bad.code == 2 and "--node 2" in bad.err and "nodes 0 to 1" in bad.err

    # The GRPO quickstart continues that adapter ("quickstart": the newest succeeded run of the name) on 2 nodes.
    edits = [
        ("n_eval = 64", "n_eval = 8"),
        ("max_steps = 400", "max_steps = 3"),
        ("eval_samples = 64", "eval_samples = 8"),
        ("every = 50", "every = 100"),
        ('provider = "local"', 'provider = "local"\nnodes = 2'),
    ]
    grpo = cli("launch", str(edited_spec(QUICKSTART / "quickstart-grpo.toml", edits, tmp_path / "grpo.toml")))
    assert grpo.code == 0, grpo.out + grpo.err
    gst = status(cli, run_id_from(grpo.out))
    assert gst["state"] == "succeeded" and gst["step"] == 3
    gm = gst["metrics"]["seed0"]
    assert gm["world_size"] == 2 and [s for s, _ in gm["reward_curve"]] == [1, 2, 3]
    gen = next(e for e in events(gst) if e["kind"] == "generation")["data"]["batching"]
    assert (gen["num_processes"], gen["completions_per_step"]) == (2, 64)  # 8 prompts x 8, 4 whole groups per rank


def test_a_lost_node_ends_the_other_and_both_resume_and_cancel_leaves_no_node(cli, tmp_path, home):
    # The loss the run must end at: the same run on one node (two nodes train as one: the test above).
    ref = cli("launch", str(quickstart(tmp_path, "ref", nodes=1, steps=STEPS)))
    assert ref.code == 0, ref.out + ref.err
    ref_st = status(cli, run_id_from(ref.out))

    r = cli("launch", str(quickstart(tmp_path, "lost", nodes=2, steps=STEPS)), "--detach")
    assert r.code == 0, r.out + r.err
    run_id = run_id_from(r.out)
    st = status(cli, run_id)
    ckpt = seed_dir(st) / "checkpoint"
    deadline = time.monotonic() + 300
    while not (ckpt.exists() and any((p / "autoslm_manifest.json").exists() for p in ckpt.iterdir())):
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    group = status(cli, run_id)["pod_id"]
    node1 = int(group.split("+")[1].split("-")[1])  # node 1's session: its shell, the node's worker and its rank
    os.killpg(node1, signal.SIGKILL)  # node 1's machine lost, no goodbye

    st = wait_for(cli, run_id, lambda s: s["state"] in ("succeeded", "failed", "cancelled"), timeout=300)
    assert st["state"] == "succeeded", st
    assert st["restarts"] == 1 and st["step"] == st["total_steps"] == STEPS
    resumes = [e for e in events(st) if e["kind"] == "resume"]
    assert resumes and resumes[0]["data"]["from_step"] >= 8
    assert st["metrics"]["seed0"]["final_loss"] == pytest.approx(ref_st["metrics"]["seed0"]["final_loss"], abs=1e-3)
    assert gone(run_id), "a node outlived its run"

    # cancel mid-run: every node's processes end.
    r = cli("launch", str(quickstart(tmp_path, "cancelled", nodes=2, steps=2000, save_every=1000)), "--detach")
    run_id = run_id_from(r.out)
    wait_for(cli, run_id, lambda s: s["seeds"][0]["stage"] == "training" and s["step"] > 0, timeout=180)
    assert len(run_pids(run_id)) >= 4  # two nodes: each a worker and its rank (and their shell wrappers)
    # Nodes share no disk: each trains in its own working directory under the run's home.
    assert sorted(p.name for p in (home / "pods").glob("*/node*") if any(p.iterdir())) == ["node0", "node1"]
    c = cli("cancel", run_id)
    assert c.code == 0, c.out + c.err
    assert status(cli, run_id)["state"] == "cancelled"
    assert gone(run_id, timeout=30), "a node's process outlived the cancel"
    assert not list((home / "pods").glob("*/node*"))  # and their working directories
