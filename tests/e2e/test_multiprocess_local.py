"""compute.gpu_count = 2 on this CPU: two training processes over gloo, through the real CLI.

The promises: SFT and GRPO finish on 2 processes; only rank 0 writes to the store; the world size is
recorded; SFT on 2 processes ends at the loss of 1 process with the same effective batch; a rank that
dies ends the others, and the error names it. `long` (make test-long): a 2-process run killed after a
checkpoint resumes and ends where the uninterrupted one does (make test kills and resumes 2 nodes).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.test_sft_local import kill_after_first_checkpoint, run_id_from, status, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.worker]  # worker: run on the image's pins (make test: only there)

SFT = """# autoslm launch {path}
name = "{name}"
model = "autoslm/tiny"
[environment]
id = "autoslm/arith"
params = {{ n_train = 512, n_eval = 8 }}
[train]
max_steps = {steps}
batch_size = 8
micro_batch_size = 4
learning_rate = 3e-3
max_length = 64
save_every = {save_every}
lora_rank = 8
lora_alpha = 16
eval_samples = 8
[compute]
gpu_count = {gpus}
[artifacts]
path = "{store}"
[limits]
max_restarts = {restarts}
"""


def sft_spec(tmp_path: Path, name: str, gpus: int, steps: int = 16, save_every: int = 8, restarts: int = 3) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        SFT.format(
            path=path, name=name, gpus=gpus, steps=steps, save_every=save_every, restarts=restarts, store=tmp_path / "store"
        )
    )
    return path


def run_dir(tmp_path: Path, phase: str, run_id: str) -> Path:
    return tmp_path / "store" / phase / run_id / "seed0"


def events(tmp_path: Path, phase: str, run_id: str) -> list[dict]:
    return [json.loads(line) for line in (run_dir(tmp_path, phase, run_id) / "events.jsonl").read_text().splitlines()]


def rank_pids(run_id: str) -> dict[int, int]:
    """rank -> pid of this run's training processes (read from /proc: they are ours)."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            raw = (d / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        env = dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)
        if env.get("AUTOSLM_RUN_ID") == run_id and "RANK" in env:
            out[int(env["RANK"])] = int(d.name)
    return out


def test_two_process_sft_matches_one_process(cli, tmp_path, home):
    one = cli("launch", str(sft_spec(tmp_path, "one", gpus=1)))
    assert one.code == 0, one.out + one.err
    two = cli("launch", str(sft_spec(tmp_path, "two", gpus=2)))
    assert two.code == 0, two.out + two.err
    one_id, two_id = run_id_from(one.out), run_id_from(two.out)
    st = status(cli, two_id)
    assert st["state"] == "succeeded" and st["step"] == st["total_steps"] == 16
    assert st["seeds"][0]["gpu"] == "2 CPU processes (gloo)"
    assert "on 2 CPU processes (gloo)" in cli("status", two_id).out

    # The world size is recorded, and the same effective batch (8 sequences per step: 1 x 4 x 2
    # accumulation, or 2 processes x 4) gives the same training.
    m2, m1 = st["metrics"]["seed0"], status(cli, one_id)["metrics"]["seed0"]
    assert m2["world_size"] == 2 and m1["world_size"] == 1
    meta = json.loads((run_dir(tmp_path, "sft", two_id) / "train_meta.json").read_text())
    assert meta["world_size"] == 2
    assert m2["final_loss"] == pytest.approx(m1["final_loss"], rel=0.02, abs=0.02)
    assert m2["tokens"] == m1["tokens"], "both ranks' tokens are counted"
    # Two processes evaluate the model the Trainer prepared, generating in step (under FSDP, before it is
    # prepared, a rank holds a CPU copy or empty weights): the same held-out figures as one process.
    b1, b2 = m1["eval"]["before"], m2["eval"]["before"]
    assert b2["n"] == b1["n"] == 8 and b2["score"] == b1["score"] and b2["loss"] == pytest.approx(b1["loss"], rel=1e-3)
    assert m2["eval"]["after"]["loss"] == pytest.approx(m1["eval"]["after"]["loss"], rel=0.02, abs=0.02)

    # Only rank 0 wrote: every event once, one adapter; each rank left its RNG state in the checkpoint.
    ev = events(tmp_path, "sft", two_id)
    kinds = [e["kind"] for e in ev]
    for kind in ("worker_start", "train_begin", "done"):
        assert kinds.count(kind) == 1, (kind, kinds)
    one_kinds = [e["kind"] for e in events(tmp_path, "sft", one_id)]
    assert kinds.count("eval") == 2 and kinds.count("step") == one_kinds.count("step") >= 16
    start = next(e for e in ev if e["kind"] == "worker_start")["data"]
    assert (start["world_size"], start["backend"]) == (2, "gloo")
    ckpt = run_dir(tmp_path, "sft", two_id) / "checkpoint" / "checkpoint-16"
    assert (ckpt / "rng_state_0.pth").exists() and (ckpt / "rng_state_1.pth").exists()
    assert (run_dir(tmp_path, "sft", two_id) / "adapter" / "adapter_model.safetensors").exists()


@pytest.mark.long
def test_a_killed_two_process_run_resumes_where_the_uninterrupted_one_ends(cli, tmp_path, home):
    """A 2-process run killed after its first checkpoint (the launcher and, with it, both ranks) resumes on
    2 processes from that checkpoint and ends where the uninterrupted run ended. `long`: a second angle on
    the resume `make test` proves on 2 nodes, one of them lost (tests/e2e/test_nodes_local.py)."""
    two = cli("launch", str(sft_spec(tmp_path, "two", gpus=2)))
    assert two.code == 0, two.out + two.err
    m2 = status(cli, run_id_from(two.out))["metrics"]["seed0"]
    r = cli("launch", str(sft_spec(tmp_path, "killed", gpus=2)), "--detach")
    killed_id = run_id_from(r.out)
    pod_id = status(cli, killed_id)["pod_id"]
    kill_after_first_checkpoint(run_dir(tmp_path, "sft", killed_id) / "checkpoint", pod_id)
    st = wait_for(cli, killed_id, lambda s: s["state"] in ("succeeded", "failed", "cancelled"))
    assert st["state"] == "succeeded", st
    assert st["restarts"] == 1 and st["step"] == st["total_steps"] == 16
    resumes = [e for e in events(tmp_path, "sft", killed_id) if e["kind"] == "resume"]
    assert resumes and resumes[0]["data"]["from_step"] == 8
    assert st["metrics"]["seed0"]["final_loss"] == pytest.approx(m2["final_loss"], rel=0.02, abs=0.02)
    assert not rank_pids(killed_id), "a rank outlived its run"


def test_two_process_grpo_finishes_with_dynamic_sampling(cli, tmp_path, home):
    spec = tmp_path / "grpo2.toml"
    spec.write_text(f"""# autoslm launch {spec}
name = "grpo2"
model = "autoslm/tiny"
[environment]
id = "autoslm/arith"
params = {{ n_train = 128, n_eval = 4 }}
[train]
method = "grpo"
max_steps = 3
prompts_per_step = 4
group_size = 4
max_completion_tokens = 6
max_length = 64
save_every = 10
eval_samples = 4
dynamic_sampling = true
[compute]
gpu_count = 2
[artifacts]
path = "{tmp_path / "store"}"
""")
    r = cli("launch", str(spec))
    assert r.code == 0, r.out + r.err
    run_id = run_id_from(r.out)
    st = status(cli, run_id)
    assert st["state"] == "succeeded" and st["step"] == 3
    m = st["metrics"]["seed0"]
    assert m["world_size"] == 2 and [s for s, _ in m["reward_curve"]] == [1, 2, 3]
    ev = events(tmp_path, "grpo", run_id)
    gen = next(e for e in ev if e["kind"] == "generation")["data"]["batching"]
    # 4 prompts x 4 completions per step, 2 whole groups per process
    assert (gen["num_processes"], gen["completions_per_step"], gen["per_device_train_batch_size"]) == (2, 16, 8)
    # The random tiny model scores every completion alike, so every step both ranks draw fresh prompts
    # together, and the counts are summed over both.
    ds = [e["data"] for e in ev if e["kind"] == "dynamic_sampling"]
    assert len(ds) == 3 and all(d["processes"] == 2 and d["dropped_groups"] == 4 for d in ds)


def test_a_dead_rank_ends_the_others_and_is_named(cli, tmp_path, home):
    r = cli("launch", str(sft_spec(tmp_path, "dies", gpus=2, steps=2000, save_every=1000, restarts=0)), "--detach")
    run_id = run_id_from(r.out)
    wait_for(cli, run_id, lambda s: s["seeds"][0]["stage"] == "training" and s["step"] > 0, timeout=180)
    pids = rank_pids(run_id)
    assert sorted(pids) == [0, 1]
    os.kill(pids[1], signal.SIGKILL)  # as the OOM killer would
    st = wait_for(cli, run_id, lambda s: s["state"] in ("succeeded", "failed"), timeout=120)
    assert st["state"] == "failed"
    assert "rank 1 of 2 failed" in st["error"] and "SIGKILL" in st["error"], st["error"]
    assert st["step"] > 0, "the error heartbeat keeps the step rank 0 reached"
    deadline = time.monotonic() + 30
    while rank_pids(run_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not rank_pids(run_id), "rank 0 outlived the failed rank"
    err = (run_dir(tmp_path, "sft", run_id) / "error_sft.txt").read_text()
    assert "rank 1 of 2 failed" in err
