"""The SFT quickstart shape with the local provider and the Hugging Face store, on the fake Hub.

The layout appears in the dataset repo; another machine (another AUTOSLM_HOME, nothing but the repo)
follows the run with `autoslm status hf://...` and downloads its adapter; commits stay in budget; a
DONE check that fails on the network never trains a finished run again; the token is never written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.test_sft_local import run_id_from, status
from tests.fakes.hub import FAKE_HUB_TOKEN, fake_hub  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.worker]  # worker: run on the image's pins (make test: only there)
REPO = "someone/autoslm-runs"


def hf_spec(tmp_path: Path, name="hfrun", steps=24) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f"""# autoslm launch {path}
name = "{name}"
model = "autoslm/tiny"
[environment]
id = "autoslm/arith"
params = {{ n_train = 256, n_eval = 8 }}
[train]
max_steps = {steps}
batch_size = 8
learning_rate = 3e-3
max_length = 64
save_every = 8
eval_samples = 8
[artifacts]
store = "hf"
repo = "{REPO}"
""")
    return path


def test_sft_on_the_hub_store(cli, tmp_path, home, fake_hub):  # noqa: F811
    env = fake_hub.env()
    r = cli("launch", str(hf_spec(tmp_path)), env=env)
    assert r.code == 0, r.out + r.err
    run_id = run_id_from(r.out)
    st = json.loads(cli("status", run_id, "--json", env=env).out)
    assert st["state"] == "succeeded" and st["step"] == st["total_steps"] == 24
    assert st["adapter"] == f"hf://{REPO}/sft/{run_id}/seed0/adapter"
    assert st["metrics"]["seed0"]["eval"]["after"]["loss"] < st["metrics"]["seed0"]["eval"]["before"]["loss"]

    files = fake_hub.files(REPO)
    prefix = f"sft/{run_id}/seed0/"
    names = {f[len(prefix) :] for f in files if f.startswith(prefix)}
    for expected in (
        "heartbeat.json",
        "events.jsonl",
        "metrics.json",
        "train_meta.json",
        "DONE",
        "adapter/adapter_config.json",
        "adapter/adapter_model.safetensors",
    ):
        assert expected in names, (expected, sorted(names))
    ckpts = {n.split("/")[1] for n in names if n.startswith("checkpoint/")}
    # The final checkpoint is always uploaded; older ones are pruned in the commit that adds a new one
    # (or skipped while they wait for the commit budget and a newer one arrives).
    assert "checkpoint-24" in ckpts and len(ckpts) <= 2 and ckpts <= {"checkpoint-8", "checkpoint-16", "checkpoint-24"}

    # Commits per run-hour stay within the budget (60/hour by default, a small burst allowed).
    commits = [c for c in fake_hub.commits(REPO) if any(p.startswith(prefix) for p in c.added + c.deleted)]
    span_h = max((commits[-1].time - commits[0].time) / 3600, 1 / 60)
    assert len(commits) <= 6 + 60 * span_h + 8, f"{len(commits)} commits in {span_h * 3600:.0f}s"

    # Another machine follows the run from the repo alone, and downloads the adapter.
    other = {**env, "AUTOSLM_HOME": str(tmp_path / "other-home")}
    remote = cli("status", f"hf://{REPO}/sft/{run_id}", "--json", env=other)
    assert remote.code == 0, remote.err
    rst = json.loads(remote.out)
    assert rst["state"] == "succeeded" and rst["step"] == 24 and rst["metrics"]["final_loss"] is not None
    out = tmp_path / "remote-dl"
    d = cli("download", f"hf://{REPO}/sft/{run_id}", "--to", str(out), env=other)
    assert d.code == 0, d.err
    assert (out / "adapter_config.json").exists()
    local = tmp_path / "local-dl"
    assert cli("download", run_id, "--to", str(local), env=env).code == 0
    assert (local / "adapter_model.safetensors").read_bytes() == (out / "adapter_model.safetensors").read_bytes()

    # The token reaches the Hub in headers only: never in a stored file, a log or the registry.
    for path, content in files.items():
        assert FAKE_HUB_TOKEN.encode() not in content, path
    for p in home.rglob("*"):
        if p.is_file():
            assert FAKE_HUB_TOKEN.encode() not in p.read_bytes(), p
    assert FAKE_HUB_TOKEN not in r.out + r.err


def test_status_of_a_remote_run_that_does_not_exist(cli, tmp_path, fake_hub):  # noqa: F811
    # Nothing there: said as such, one line (a typo would otherwise read as "pending" forever).
    r = cli("status", f"hf://{REPO}/sft/nope", "--json", env=fake_hub.env())
    assert r.code == 2 and f"no store hf://{REPO}" in r.err and len(r.err.strip().splitlines()) == 1, r.err
    bad = cli("status", "hf://just-a-repo", env=fake_hub.env())
    assert bad.code == 2 and "hf://owner/repo/<phase>/<run_id>" in bad.err


def test_done_check_that_fails_on_the_network_never_retrains(cli, tmp_path, home, fake_hub):  # noqa: F811
    env = fake_hub.env()
    r = cli("launch", str(hf_spec(tmp_path, name="once", steps=8)), env=env)
    assert r.code == 0, r.out + r.err
    run_id = run_id_from(r.out)
    prefix = f"sft/{run_id}/seed0/"
    begins_before = fake_hub.files(REPO)[prefix + "events.jsonl"].count(b'"train_begin"')
    assert begins_before == 1

    # A second worker for the same run while the Hub fails every read: it must not train.
    import os
    import subprocess
    import sys

    from autoslm.controller.registry import Registry

    run = Registry(home).get_run(run_id)
    worker_env = {
        **os.environ,
        **env,
        "AUTOSLM_HOME": str(home),
        "AUTOSLM_JOBSPEC": run.spec_json,
        "AUTOSLM_RUN_ID": run_id,
        "AUTOSLM_SEED": "0",
        "AUTOSLM_STORE": run.store_uri,
        "AUTOSLM_ATTEMPT": "2",
    }
    fake_hub.fail_next(1000, status=503, match=f"{prefix}DONE")
    p = subprocess.run([sys.executable, "-m", "autoslm.engine"], env=worker_env, capture_output=True, text=True, timeout=300)
    fake_hub.clear_faults()
    assert p.returncode == 1, p.stdout + p.stderr  # retryable: the store could not tell
    assert fake_hub.files(REPO)[prefix + "events.jsonl"].count(b'"train_begin"') == 1
    assert "checkpoint" not in p.stdout.lower() or "train_begin" not in p.stdout

    # With the Hub back, the same worker sees DONE and exits 0 at once, training nothing.
    p = subprocess.run([sys.executable, "-m", "autoslm.engine"], env=worker_env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert fake_hub.files(REPO)[prefix + "events.jsonl"].count(b'"train_begin"') == 1
    assert status(cli, run_id)["state"] == "succeeded"
