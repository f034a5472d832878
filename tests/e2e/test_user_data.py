"""Users' own data, end to end through the CLI: Hub datasets, local files shipped through the store.

On the local provider: SFT learns a private parquet chat dataset (every assistant turn, tool calls
included) and GRPO rewards answers from a jsonl dataset with train/test splits, both loaded by the
worker with ``datasets`` from the fake Hub; a dataset that is missing or lacks a column is refused by
`plan` and `launch` before anything starts; bad data the worker finds fails the run at once, never
relaunched (a bad row, a bad line, a shipped file missing from the store). On the fake RunPod: a local jsonl file (and its eval file) reaches the pod through the
Hub store, although the laptop's copy is deleted as soon as `launch --detach` returns; a local store
with a cloud provider is refused with exit 2.

    .venv/bin/python -m pytest -q tests/e2e/test_user_data.py
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.test_sft_local import run_id_from, status
from tests.fakes.hub import FakeHub, fake_hub  # noqa: F401
from tests.fakes.hub_datasets import make_repos
from tests.fakes.runpod import FakeRunPod

pytestmark = [pytest.mark.e2e, pytest.mark.worker]  # worker: run on the image's pins (make test: only there)

REPO = Path(__file__).resolve().parents[2]
TERMINAL = ("succeeded", "failed", "cancelled")


def spec(tmp_path: Path, name: str, env: str, train: str, extra: str = "") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'# autoslm launch {path}\nname = "{name}"\nmodel = "autoslm/tiny"\n[environment]\n{env}\n'
        f'[train]\n{train}\n[artifacts]\npath = "{tmp_path / "store"}"\n{extra}'
    )
    return path


def events(tmp_path: Path, phase: str, run_id: str) -> list[dict]:
    f = tmp_path / "store" / phase / run_id / "seed0" / "events.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines()]


def wait_terminal(cli, run_id: str, env: dict, timeout: float = 600) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        r = cli("status", run_id, "--json", env=env)
        st = json.loads(r.out)
        if st["state"] in TERMINAL or time.monotonic() > deadline:
            return st
        time.sleep(1.0)


def test_sft_on_a_private_hub_chat_dataset_and_grpo_on_hub_answers(cli, tmp_path, home, fake_hub):  # noqa: F811
    make_repos(fake_hub)
    env = fake_hub.env()
    sft = spec(
        tmp_path,
        "hub-chats",
        'id = "hf:someone/chats"\nparams = { eval_split = "test" }',
        "max_steps = 4\nbatch_size = 2\nlearning_rate = 3e-3\nmax_length = 512\nsave_every = 4\neval_samples = 2",
    )
    grpo = spec(
        tmp_path,
        "hub-arith",
        'id = "hf:someone/arith"\nparams = { eval_split = "test" }',
        'method = "grpo"\nmax_steps = 2\nprompts_per_step = 2\ngroup_size = 4\nmax_completion_tokens = 8\n'
        "max_length = 96\nsave_every = 2\neval_samples = 4",
    )
    r = cli("launch", str(sft), env=env)
    assert r.code == 0, r.out + r.err
    run_id = run_id_from(r.out)
    st = status(cli, run_id)
    assert st["state"] == "succeeded" and st["step"] == st["total_steps"] == 4, st
    chats = [e["data"] for e in events(tmp_path, "sft", run_id) if e["kind"] == "sft_chats"]
    # Tokenized with the chat template's assistant mask: one row per chat, every assistant turn learned.
    assert chats == [{"chats": 6, "rows": 6, "loss_mask": "assistant tokens (chat template)"}], chats
    assert st["metrics"]["seed0"]["eval"]["before"]["n"] == 2  # the test split, held out

    r = cli("launch", str(grpo), env=env)
    assert r.code == 0, r.out + r.err
    run_id = run_id_from(r.out)
    st = status(cli, run_id)
    assert st["state"] == "succeeded" and st["step"] == 2, st
    evs = events(tmp_path, "grpo", run_id)
    rewards = [e["data"]["reward"] for e in evs if e["kind"] == "step" and "reward" in e["data"]]
    assert len(rewards) == 2, [e for e in evs if e["kind"] == "step"]
    assert next(e for e in evs if e["kind"] == "eval")["data"]["n"] == 4
    # The worker read the private repo with the token, through datasets (resolve of the data files).
    assert any(
        r.path.endswith("data/train-00000-of-00001.parquet") and r.method == "GET" and r.authorized for r in fake_hub.requests
    )


def test_missing_or_unusable_hub_datasets_are_refused_before_anything_starts(cli, tmp_path, home, fake_hub):  # noqa: F811
    make_repos(fake_hub)
    env = fake_hub.env()
    train = "max_steps = 2\nbatch_size = 2"
    bad_shape = spec(tmp_path, "shape", 'id = "hf:only-a-name"', train)
    before = len(fake_hub.requests)
    r = cli("validate", str(bad_shape), env=env)
    assert r.code == 2 and 'environment.id: a Hub dataset id looks like "hf:owner/name"' in r.err, r.err
    assert len(fake_hub.requests) == before, "validate must not touch the network"

    no_column = spec(tmp_path, "nocol", 'id = "hf:someone/renamed"', train)
    assert cli("validate", str(no_column), env=env).code == 0  # offline: the columns are not known yet
    for command in ("plan", "launch"):
        r = cli(command, str(no_column), env=env)
        assert r.code == 2, r.out + r.err
        assert 'missing column "messages" (or "prompt")' in r.err and "columns found: question, solution" in r.err, r.err
        assert '"prompt" + "answer"' in r.err and "Traceback" not in r.err
    missing = spec(tmp_path, "missing", 'id = "hf:someone/not-there"', train)
    r = cli("launch", str(missing), env=env)
    assert r.code == 2 and "no such dataset on the Hub" in r.err, r.err
    assert json.loads(cli("list", "--json", env=env).out) == []


def test_bad_data_found_by_the_worker_fails_at_once_and_is_not_relaunched(cli, tmp_path, home, fake_hub):  # noqa: F811
    make_repos(fake_hub)
    env = fake_hub.env()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1", "answer": "2"}\n{"prompt": "2+2", "answer": "4"}\n{"prompt": "3+3", "answer": \n')
    train = "max_steps = 2\nbatch_size = 2\nsave_every = 2"
    cases = {
        "late-bad": (
            spec(tmp_path, "late-bad", 'id = "hf:someone/late-bad"', train),
            "hf:someone/late-bad split 'train' row 8 (counting from 0)",
        ),
        "bad-line": (spec(tmp_path, "bad-line", f'id = "jsonl:{bad}"', train), "bad.jsonl:3: not valid JSON"),
        # A shipped file that is not in the store (a store emptied by hand, a copied spec).
        "no-copy": (
            spec(tmp_path, "no-copy", f'id = "jsonl:store:{"0" * 64}/gone.jsonl"', train),
            "gone.jsonl: the run's copy is missing from the store (data/sha256/000",
        ),
    }
    run_ids = {}
    for key, (path, _) in cases.items():
        r = cli("launch", str(path), "--detach", env=env)
        assert r.code == 0, r.out + r.err
        run_ids[key] = run_id_from(r.out)
    for key, (_, message) in cases.items():
        st = wait_terminal(cli, run_ids[key], env)
        assert st["state"] == "failed", st
        assert message in (st["error"] or ""), st["error"]
        assert st["restarts"] == 0, "bad data must not be relaunched"
        files = tmp_path / "store" / "sft" / run_ids[key] / "seed0"
        assert "retryable: false" in (files / "error_sft.txt").read_text()


# -- on the fake RunPod, with the Hub as the store --------------------------------------------------
RUNPOD_KEY = "rpkey-UserDataTestSecret-0a1b2c3d"
HF_TOKEN = "hf_UserDataHubSecret7Y3pL9sQ2wE6"
HUB_REPO = "someone/runs"


def cloud_spec(tmp_path: Path, name: str, env_lines: str, store: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f"""# autoslm launch {path} --yes
name = "{name}"
model = "autoslm/tiny"
[environment]
{env_lines}
[train]
max_steps = 8
batch_size = 8
learning_rate = 3e-3
max_length = 64
save_every = 8
eval_samples = 4
[compute]
provider = "runpod"
gpu = "RTX 4090"
image = "ghcr.io/autoslm/worker:0.1.0"  # the worker runs as in the image (test_bootstrap.py covers bootstrap)
[artifacts]
{store}
""")
    return path


def test_a_local_jsonl_reaches_the_pod_through_the_store(tmp_path, home):
    with FakeHub(token=HF_TOKEN) as hub, FakeRunPod(api_key=RUNPOD_KEY, workdir=tmp_path / "fake-runpod") as runpod:
        env = {k: v for k, v in os.environ.items() if k not in ("HUGGING_FACE_HUB_TOKEN", "AUTOSLM_DEBUG")}
        env.update({"AUTOSLM_HOME": str(home), **hub.env(), **runpod.env()})

        def cli(*args):
            p = subprocess.run(
                [sys.executable, "-m", "autoslm", *args], capture_output=True, text=True, env=env, cwd=str(REPO), timeout=600
            )
            return p.returncode, p.stdout, p.stderr

        data = tmp_path / "laptop" / "sums.jsonl"
        data.parent.mkdir()
        data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(64)))
        held = tmp_path / "laptop" / "held.jsonl"
        held.write_text("".join(json.dumps({"prompt": f"{i}+2=", "answer": str(i + 2)}) + "\n" for i in range(8)))
        env_lines = f'id = "jsonl:{data}"\nparams = {{ eval_path = "{held}" }}'

        local = cloud_spec(tmp_path, "local-store", env_lines, 'store = "local"')
        code, out, err = cli("validate", str(local))
        assert code == 2 and "artifacts.store" in err and 'store = "hf"' in err, err

        path = cloud_spec(tmp_path, "shipped", env_lines, f'store = "hf"\nrepo = "{HUB_REPO}"')
        code, out, err = cli("launch", str(path), "--detach", "--yes")
        assert code == 0, out + err
        run_id = run_id_from(out)
        data.unlink()  # the laptop's copies are gone before the worker could have read them
        held.unlink()

        deadline = time.monotonic() + 600
        while True:
            code, out, err = cli("status", run_id, "--json")
            st = json.loads(out)
            if st["state"] in TERMINAL or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        assert st["state"] == "succeeded" and st["restarts"] == 0, (st, runpod.log(runpod.pods()[0].id)[-3000:])
        assert st["metrics"]["seed0"]["eval"]["before"]["n"] == 4

        files = hub.files(HUB_REPO)
        shipped = sorted(p for p in files if p.startswith("data/sha256/"))
        assert len(shipped) == 2, shipped
        for p in shipped:  # content-addressed: the name is the sha256 of the bytes
            assert hashlib.sha256(files[p]).hexdigest() == p.rsplit("/", 1)[1]
        (pod,) = runpod.pods()
        job = json.loads(pod.env["AUTOSLM_JOBSPEC"])
        assert job["environment"]["id"].startswith("jsonl:store:") and str(tmp_path) not in pod.env["AUTOSLM_JOBSPEC"]
        assert job["environment"]["params"]["eval_path"].startswith("store:")
        ships = [c for c in hub.commits(HUB_REPO) if c.message.startswith("ship ")]
        assert [c.message for c in ships] == ["ship sums.jsonl", "ship held.jsonl"]
