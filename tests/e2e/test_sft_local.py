"""End to end on this CPU: `autoslm launch` trains the built-in model for real, through the CLI.

These are the product's promises: a run succeeds and its adapter loads; a worker killed after its
first checkpoint is relaunched, resumes, and ends where an uninterrupted run ends; the laptop side
never imports torch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import backoff

pytestmark = [pytest.mark.e2e, pytest.mark.worker]  # worker: run on the image's pins (make test: only there)

SPEC = """# autoslm launch {path}
name = "{name}"
model = "autoslm/tiny"
seed = {seed}
[environment]
id = "autoslm/arith"
params = {{ n_train = 512, n_eval = 16 }}
[train]
max_steps = {steps}
batch_size = 8
learning_rate = 3e-3
max_length = 64
save_every = {save_every}
lora_rank = 8
lora_alpha = 16
eval_samples = 16
[artifacts]
path = "{store}"
[limits]
max_hours = 1
"""


def make_spec(tmp_path: Path, name="e2e", steps=24, save_every=8, seed=0) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(SPEC.format(path=path, name=name, steps=steps, save_every=save_every, seed=seed, store=tmp_path / "store"))
    return path


def run_id_from(output: str) -> str:
    for line in output.splitlines():
        if line.startswith("run ") and " launched" in line:
            return line.split()[1]
    raise AssertionError(f"no run id in output:\n{output}")


def status(cli, run_id: str) -> dict:
    r = cli("status", run_id, "--json")
    assert r.code == 0, r.err
    return json.loads(r.out)


# How often a wait asks the real CLI (`status --json`, which also acts on a run nobody supervises) while
# it reads the run in its own process between those looks.
CLI_LOOK_S = 30.0


def read_status(home: Path, run_id: str) -> dict:
    """What `status RUN --json` prints, read in this process with the SDK and without acting (``tick=False``:
    no provider is asked, nothing is written). A wait reads this between the CLI's looks: each `autoslm
    status` is a Python process, and a wait of minutes asked it every few seconds."""
    from autoslm.sdk import Client

    client = Client(home)
    try:
        return client.status(run_id, tick=False).to_json()
    finally:
        client.registry.close()


def wait_for(cli, run_id: str, pred, timeout: float = 300) -> dict:
    """The run's `status --json` once ``pred`` holds on it. Between looks of the real CLI (the first at
    once, then every ``CLI_LOOK_S``) the run is read in this process; a read on which ``pred`` holds is
    confirmed by the CLI, whose answer is the one returned."""
    deadline = time.monotonic() + timeout
    pause = backoff()
    look_at = time.monotonic()
    st = None
    while time.monotonic() < deadline:
        if time.monotonic() >= look_at or pred(read_status(cli.home, run_id)):
            st, look_at = status(cli, run_id), time.monotonic() + CLI_LOOK_S
            if pred(st):
                return st
        time.sleep(next(pause))
    raise AssertionError(f"timed out; last status: {st}")


def test_quickstart_shaped_run_succeeds_and_adapter_loads(cli, tmp_path, home):
    r = cli("launch", str(make_spec(tmp_path)))
    assert r.code == 0, r.out + r.err
    run_id = run_id_from(r.out)
    assert "succeeded" in r.out and "adapter:" in r.out and "eval loss" in r.out

    st = status(cli, run_id)
    assert st["state"] == "succeeded"
    assert st["step"] == st["total_steps"] == 24
    assert st["restarts"] == 0 and st["provider"] == "local" and st["error"] is None
    assert st["last_heartbeat_age_s"] is not None
    metrics = st["metrics"]["seed0"]
    before, after = metrics["eval"]["before"], metrics["eval"]["after"]
    assert after["loss"] < before["loss"], "the model did not learn"
    assert metrics["tokens"] > 0 and metrics["tokens_per_s"] > 0 and metrics["final_loss"] is not None

    adapter = Path(st["adapter"])
    store_run = adapter.parent
    for name in ("heartbeat.json", "events.jsonl", "metrics.json", "train_meta.json", "DONE"):
        assert (store_run / name).exists(), name
    assert [p.name for p in (store_run / "checkpoint").iterdir()], "no checkpoint kept"

    # The adapter loads with peft onto the built-in model, and it changed the model.
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from autoslm.engine.train.tiny import ensure_tiny

    base = AutoModelForCausalLM.from_pretrained(ensure_tiny(home / "models"))
    ids = torch.tensor([[1, 2, 3, 4]])
    plain = base(ids).logits
    tuned = PeftModel.from_pretrained(base, str(adapter))
    assert not torch.allclose(plain, tuned(ids).logits)

    # download writes the same adapter elsewhere; list shows the run.
    out = tmp_path / "dl"
    d = cli("download", run_id, "--to", str(out))
    assert d.code == 0, d.err
    assert (out / "adapter_config.json").exists()
    lst = json.loads(cli("list", "--json").out)
    assert [x["run_id"] for x in lst] == [run_id]

    # Launching again with DONE present trains nothing: the worker exits at once.
    events = [json.loads(l) for l in (store_run / "events.jsonl").read_text().splitlines()]
    assert sum(e["kind"] == "train_begin" for e in events) == 1


def _worker_pid(home: Path, pod_id: str) -> int:
    return int(pod_id.split("-")[1])


def kill_after_first_checkpoint(ckpt_dir: Path, pod_id: str, timeout: float = 300) -> None:
    """SIGKILL a local worker (no goodbye: as a lost machine) once a complete checkpoint is stored."""
    deadline = time.monotonic() + timeout
    while not (ckpt_dir.exists() and any((p / "autoslm_manifest.json").exists() for p in ckpt_dir.iterdir())):
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    os.killpg(int(pod_id.split("-")[1]), signal.SIGKILL)


# make test-long's: make test kills and resumes the same promise where it is harder (two processes,
# test_multiprocess_local.py, and two nodes, test_nodes_local.py, each ending at the loss of the run never
# killed; GRPO, test_grpo_local.py; GRPO with colocated vLLM, test_vllm_worker.py).
@pytest.mark.long
def test_killed_worker_resumes_and_ends_at_the_same_step(cli, tmp_path, home):
    # Uninterrupted reference run.
    ref = cli("launch", str(make_spec(tmp_path, name="ref", steps=120, save_every=10)))
    assert ref.code == 0, ref.out + ref.err
    ref_st = status(cli, run_id_from(ref.out))

    r = cli("launch", str(make_spec(tmp_path, name="killed", steps=120, save_every=10)), "--detach")
    assert r.code == 0, r.err
    run_id = run_id_from(r.out)
    pod_id = status(cli, run_id)["pod_id"]
    kill_after_first_checkpoint(tmp_path / "store" / "sft" / run_id / "seed0" / "checkpoint", pod_id)

    st = wait_for(cli, run_id, lambda s: s["state"] in ("succeeded", "failed", "cancelled"))
    assert st["state"] == "succeeded", st
    assert st["restarts"] == 1
    assert st["step"] == st["total_steps"] == ref_st["total_steps"]
    events = [json.loads(l) for l in (tmp_path / "store" / "sft" / run_id / "seed0" / "events.jsonl").read_text().splitlines()]
    resumes = [e for e in events if e["kind"] == "resume"]
    assert resumes and 10 <= resumes[0]["data"]["from_step"] < 120
    # Resuming restores optimizer, scheduler and RNG: the loss curve continues as if never stopped.
    killed_loss = st["metrics"]["seed0"]["final_loss"]
    ref_loss = ref_st["metrics"]["seed0"]["final_loss"]
    assert killed_loss == pytest.approx(ref_loss, rel=0.02)


def test_cancel_stops_the_worker(cli, tmp_path, home):
    r = cli("launch", str(make_spec(tmp_path, name="cancelme", steps=400, save_every=100)), "--detach")
    run_id = run_id_from(r.out)
    wait_for(cli, run_id, lambda s: s["state"] == "running")
    pod_id = status(cli, run_id)["pod_id"]
    c = cli("cancel", run_id)
    assert c.code == 0 and "cancelled" in c.out
    st = status(cli, run_id)
    assert st["state"] == "cancelled" and st["pod_id"] is None
    from autoslm.procs import group_alive

    assert not group_alive(_worker_pid(home, pod_id)), "the worker outlived its cancelled run"


MALFORMED = {
    "bad_toml": ('name = "x"\nmodel = \n', "invalid TOML"),
    "unknown_key": (
        'name = "x"\nmodel = "autoslm/tiny"\n[environment]\nid = "autoslm/arith"\n[train]\nbatchsize = 3\n',
        "train.batchsize: unknown key",
    ),
    "wrong_type": (
        'name = "x"\nmodel = "autoslm/tiny"\n[environment]\nid = "autoslm/arith"\n[train]\nmax_steps = "ten"\n',
        "train.max_steps",
    ),
    "out_of_range": (
        'name = "x"\nmodel = "autoslm/tiny"\n[environment]\nid = "autoslm/arith"\n[train]\nlearning_rate = -1\n',
        "train.learning_rate",
    ),
    "missing_model": ('name = "x"\n[environment]\nid = "autoslm/arith"\n', "model: required field is missing"),
    "secret": (
        'name = "x"\nmodel = "autoslm/tiny"\n[environment]\nid = "autoslm/arith"\n[artifacts]\nhf_token = "hf_aaaaaaaaaaaaaaaaaaaaaaaaa"\n',
        "artifacts.hf_token: secrets do not belong",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
@pytest.mark.parametrize("command", ["validate", "launch"])
def test_malformed_spec_exit_2_one_clear_line_nothing_started(cli, tmp_path, home, case, command):
    text, expected = MALFORMED[case]
    spec = tmp_path / "bad.toml"
    spec.write_text(text)
    r = cli(command, str(spec))
    assert r.code == 2, r.out + r.err
    assert expected in r.err and str(spec) in r.err
    assert "Traceback" not in r.err + r.out
    assert "hf_aaaa" not in r.err + r.out
    assert not (home / "registry.db").exists() and not (home / "logs").exists()


def test_control_plane_never_imports_the_training_stack(cli, tmp_path, home):
    code = (
        "import sys, runpy\n"
        "sys.argv = ['autoslm'] + sys.argv[1:]\n"
        "try:\n    runpy.run_module('autoslm', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print('HEAVY=' + ','.join(m for m in ('torch', 'transformers', 'trl', 'peft') if m in sys.modules))\n"
    )
    env = {**os.environ, "AUTOSLM_HOME": str(home)}
    for args in (["--help"], ["status"], ["list"], ["validate", str(make_spec(tmp_path))]):
        p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
        assert "HEAVY=\n" in p.stdout, (args, p.stdout, p.stderr)
