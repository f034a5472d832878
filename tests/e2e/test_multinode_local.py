"""compute.nodes = 2 on this machine: two workers (`python -m autoslm.engine`), each given a node's
variables as a vendor gives each pod of a group (NODE_RANK, NUM_NODES, MASTER_ADDR, MASTER_PORT), each
with its own working directory and AUTOSLM_HOME (no shared disk), one store.

The promises: two nodes train as one process does (world size 2, the same final loss); the run resumed
on fresh disks, from the newest checkpoint in the store, ends at the same loss (every rank's RNG state
is in the store); a rank that fails on node 1 is named with its node in the run's error record, not
node 0's rank that lost its peer.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, shared_models_dir

pytestmark = [pytest.mark.e2e, pytest.mark.worker]  # worker: run on the image's pins (make test: only there)

RUN = "twonodes"
SPEC = """
name = "twonodes"
model = "autoslm/tiny"
[environment]
id = "autoslm/arith"
params = { n_train = 512, n_eval = 4 }
[train]
max_steps = 12
batch_size = 8
micro_batch_size = 4
learning_rate = 3e-3
max_length = 64
save_every = 6
keep_checkpoints = 3
lora_rank = 8
lora_alpha = 16
eval_samples = 4
[compute]
provider = "local"
nodes = %d
"""


def spec_json(nodes: int) -> str:
    from autoslm.spec import parse_spec

    return parse_spec(SPEC % nodes).to_json()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def home_with_models(root: Path, name: str) -> Path:
    """An AUTOSLM_HOME whose model cache is the tests' shared one (a node that builds its own gets an empty one)."""
    home = root / name
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "models").exists():
        (home / "models").symlink_to(shared_models_dir(root), target_is_directory=True)
    return home


def start_nodes(root: Path, homes: list[Path], tag: str, attempt: int = 1, nodes: int = 2) -> list[subprocess.Popen]:
    """``nodes`` workers of one run, as the pods of a group start them (``nodes = 1``: a single pod)."""
    port, procs = free_port(), []
    for rank, home in enumerate(homes[:nodes]):
        work = root / f"{tag}-node{rank}"
        (work / "tmp").mkdir(parents=True)
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "AUTOSLM_HOME": str(home),
            "AUTOSLM_JOBSPEC": spec_json(nodes),
            "AUTOSLM_RUN_ID": RUN,
            "AUTOSLM_SEED": "0",
            "AUTOSLM_ATTEMPT": str(attempt),
            "AUTOSLM_STORE": (root / "store").as_uri(),
            "AUTOSLM_WORKDIR": str(work / "work"),
            "TMPDIR": str(work / "tmp"),
        }
        if nodes > 1:
            env.update(NODE_RANK=str(rank), NUM_NODES=str(nodes), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        log = open(root / f"{tag}-node{rank}.log", "w")
        procs.append(subprocess.Popen([sys.executable, "-m", "autoslm.engine"], env=env, cwd=work, stdout=log, stderr=log))
        log.close()
    return procs


def wait_all(root: Path, tag: str, procs: list[subprocess.Popen], timeout: float = 400) -> list[int]:
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [p.returncode for p in procs]


def logs(root: Path, tag: str) -> str:
    return "\n".join(f"--- {f.name}\n{f.read_text()[-4000:]}" for f in sorted(root.glob(f"{tag}-node*.log")))


def seed_dir(root: Path) -> Path:
    return root / "store" / "sft" / RUN / "seed0"


def events(root: Path) -> list[dict]:
    return [json.loads(line) for line in (seed_dir(root) / "events.jsonl").read_text().splitlines()]


def train(root: Path, homes: list[Path], tag: str, attempt: int = 1, nodes: int = 2) -> dict:
    codes = wait_all(root, tag, start_nodes(root, homes, tag, attempt, nodes))
    assert codes == [0] * nodes, logs(root, tag)
    return json.loads((seed_dir(root) / "metrics.json").read_text())


# long (make test-long): make test's two-node runs go through the CLI (test_nodes_local.py: the loss of one
# process on two nodes, and a lost node resumed from the store on each node's own disk).
@pytest.mark.long
def test_two_nodes_train_as_one_process_and_resume_on_fresh_disks(tmp_path):
    one = train(tmp_path / "one", [home_with_models(tmp_path / "one", "home")], "one", nodes=1)

    root = tmp_path / "two"
    node1_home = root / "home1"  # an empty model cache: node 1 builds the built-in model itself
    node1_home.mkdir(parents=True)
    m = train(root, [home_with_models(root, "home0"), node1_home], "a")
    assert m["world_size"] == 2 and one["world_size"] == 1
    assert json.loads((seed_dir(root) / "train_meta.json").read_text())["world_size"] == 2
    assert m["final_loss"] == pytest.approx(one["final_loss"], abs=1e-3)
    assert next((node1_home / "models").glob("tiny-*/model.safetensors")).is_file()
    # Only node 0 wrote to the store: every event once; every rank's RNG state is in each checkpoint.
    kinds = [e["kind"] for e in events(root)]
    assert kinds.count("worker_start") == kinds.count("done") == 1, kinds
    start = next(e for e in events(root) if e["kind"] == "worker_start")["data"]
    assert (start["world_size"], start["backend"]) == (2, "gloo")
    for step in (6, 12):
        ckpt = seed_dir(root) / "checkpoint" / f"checkpoint-{step}"
        assert (ckpt / "rng_state_0.pth").is_file() and (ckpt / "rng_state_1.pth").is_file(), step

    # The last checkpoint and DONE gone, both nodes start again on fresh disks: they resume from the
    # newest checkpoint left in the store, each node reading it into its own directory, and end where
    # the first run did.
    (seed_dir(root) / "DONE").unlink()
    shutil.rmtree(seed_dir(root) / "checkpoint" / "checkpoint-12")
    resumed = train(root, [root / "home0", node1_home], "b", attempt=2)
    assert [e["data"]["from_step"] for e in events(root) if e["kind"] == "resume"] == [6]
    assert resumed["world_size"] == 2
    assert resumed["final_loss"] == pytest.approx(m["final_loss"], abs=1e-3)
    b1 = (root / "b-node1.log").read_text()
    assert "Didn't find an RNG file" not in b1 and "reproducibility is not guaranteed" not in b1


def test_a_rank_failing_on_node_1_is_named_with_its_node(tmp_path):
    # A real fault on node 1 only: its model cache holds a damaged copy of the built-in model.
    from autoslm.engine.train.tiny import ensure_tiny

    whole = ensure_tiny(shared_models_dir(tmp_path))
    damaged = tmp_path / "home1" / "models" / whole.name
    shutil.copytree(whole, damaged)
    (damaged / "model.safetensors").write_bytes(b"not a safetensors file")

    procs = start_nodes(tmp_path, [home_with_models(tmp_path, "home0"), tmp_path / "home1"], "f")
    codes = wait_all(tmp_path, "f", procs)
    assert all(c != 0 for c in codes), logs(tmp_path, "f")
    first = (seed_dir(tmp_path) / "error_sft.txt").read_text().splitlines()[0]
    assert first.startswith("rank 1 of 2 on node 1 failed:"), first + logs(tmp_path, "f")
    assert "SafetensorError" in first, first  # its own error, not node 0's lost peer
    assert "on node 0" in (tmp_path / "f-node0.log").read_text(), "node 0 only logs its rank's lost peer"


def test_a_node_without_its_variables_stops_with_one_error(tmp_path):
    home = home_with_models(tmp_path, "home0")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "AUTOSLM_HOME": str(home),
        "AUTOSLM_JOBSPEC": spec_json(2),
        "AUTOSLM_RUN_ID": RUN,
        "AUTOSLM_STORE": (tmp_path / "store").as_uri(),
        "AUTOSLM_WORKDIR": str(tmp_path / "work"),
        "NUM_NODES": "3",
        "NODE_RANK": "0",
    }
    p = subprocess.run([sys.executable, "-m", "autoslm.engine"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    first = (seed_dir(tmp_path) / "error_sft.txt").read_text().splitlines()[0]
    assert first.startswith("NUM_NODES = 3 in this pod's environment, but compute.nodes = 2 ("), first
