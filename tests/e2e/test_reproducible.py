"""A seeded CPU run of the built-in model repeats exactly: the same spec launched twice logs the same
numbers at every step (loss, gradient norm, rewards, sampled completions) and saves the same adapter.

This is what lets the learning-curve checks (test_quickstart.py) compare against fixed margins: on a
given machine a run's curve is a function of its seed, not of the machine's load. The worker fixes the
built-in model's CPU threads (engine/train/recipe.py: cpu_threads); the data order, LoRA init and sampling
follow the seed. Numbers still differ between CPUs of different instruction sets (other kernels).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.e2e.test_sft_local import run_id_from, status

# worker: run on the image's pins; long (make test-long): beside the learning checks whose margins it underwrites.
pytestmark = [pytest.mark.e2e, pytest.mark.worker, pytest.mark.long]

# Logged values that measure time, not training.
TIMING = ("time", "per_second", "runtime", "tokens_per_s")

COMMON = """seed = 3
[environment]
id = "autoslm/arith"
params = { n_train = 256, n_eval = 4, max_operand = 2 }
"""


def write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'# autoslm launch {path}\nname = "{name}"\nmodel = "autoslm/tiny"\n'
        + COMMON
        + body
        + f'\n[artifacts]\npath = "{tmp_path / "store"}"\n'
    )
    return path


def trace(tmp_path: Path, phase: str, run_id: str) -> tuple[list, list, str, int]:
    """(per-step numbers without timings, rollouts, sha256 of the adapter's weights, CPU threads)."""
    run = tmp_path / "store" / phase / run_id / "seed3"  # the seed the spec sets
    steps, rollouts, threads = [], [], None
    for line in (run / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e["kind"] == "step":
            steps.append((e["step"], {k: v for k, v in e["data"].items() if not any(t in k for t in TIMING)}))
        elif e["kind"] == "rollout":
            rollouts.append(e["data"])
        elif e["kind"] == "model_loaded":
            threads = e["data"]["cpu_threads"]
    weights = hashlib.sha256((run / "adapter" / "adapter_model.safetensors").read_bytes()).hexdigest()
    return steps, rollouts, weights, threads


def launch_twice(cli, tmp_path: Path, phase: str, spec: Path) -> tuple[tuple, tuple]:
    traces = []
    for _ in range(2):
        r = cli("launch", str(spec))
        assert r.code == 0, r.out + r.err
        run_id = run_id_from(r.out)
        assert status(cli, run_id)["state"] == "succeeded"
        traces.append(trace(tmp_path, phase, run_id))
    return traces[0], traces[1]


def test_a_seeded_sft_and_grpo_run_repeat_step_for_step(cli, tmp_path, home):
    sft = write(
        tmp_path,
        "rep-sft",
        """[train]
method = "sft"
max_steps = 8
batch_size = 8
learning_rate = 3e-3
max_length = 64
save_every = 8
eval_samples = 0
""",
    )
    a, b = launch_twice(cli, tmp_path, "sft", sft)
    assert a[3] == 1, "the built-in model trains on one CPU thread on every machine"
    assert a[0][-1][0] == 8 and all(s["loss"] > 0 for _, s in a[0] if "loss" in s)
    assert a == b, "the same seeded SFT spec gave different numbers"

    grpo = write(
        tmp_path,
        "rep-grpo",
        """[train]
method = "grpo"
init_from_adapter = "rep-sft"
max_steps = 2
prompts_per_step = 4
group_size = 4
max_completion_tokens = 6
max_length = 64
learning_rate = 1e-3
save_every = 2
eval_samples = 0
""",
    )
    a, b = launch_twice(cli, tmp_path, "grpo", grpo)
    # Eight SFT steps teach no arithmetic, so rewards are mostly zero here: this half checks what GRPO
    # adds, the sampled completions and the step log (the quickstarts' learning curves show the rest).
    assert a[0][-1][0] == 2 and a[1], "no steps or no rollouts logged"
    assert a == b, "the same seeded GRPO spec gave different numbers or completions"
