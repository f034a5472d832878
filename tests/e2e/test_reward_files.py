"""A reward file of the user's, end to end: GRPO on the built-in model scores its completions with a
function from a Python file beside the spec.

Locally: the run trains, every step event carries the function's mean and std (TRL's
``rewards/<name>/mean``), and `watch` and `report` show it; a function that raises on the worker fails
the run once (not relaunched, its traceback in ``error_grpo.txt``), or with ``on_reward_error = "none"``
scores those completions None and counts them. On the fake RunPod with the fake Hub as the store: the
file reaches the pod through the store (the laptop's copy is deleted as soon as `launch --detach`
returns); a bad reward file is refused by `launch` before anything is rented.

    .venv/bin/python -m pytest -q tests/e2e/test_reward_files.py
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
from tests.fakes.hub import FakeHub
from tests.fakes.runpod import FakeRunPod

pytestmark = [pytest.mark.e2e, pytest.mark.worker]  # worker: run on the image's pins (make test: only there)

REPO = Path(__file__).resolve().parents[2]
TERMINAL = ("succeeded", "failed", "cancelled")

# Scores the parity of the completion's last number against the answer's: a reward the built-in
# model's random completions get right about half the time, so its mean is neither 0 nor 1.
REWARDS_PY = """import re


def parity(prompts, completions, answer, **kwargs):
    out = []
    for completion, want in zip(completions, answer):
        found = re.findall(r"-?\\d+", completion[0]["content"])
        out.append(1.0 if found and int(found[-1]) % 2 == int(want) % 2 else 0.0)
    return out


def on_the_pod_only(prompts, completions, trainer_state=None, **kwargs):
    if type(trainer_state).__name__ == "TrainerState":  # validate's call passes a stand-in
        raise KeyError("no such column")
    return [0.0 for _ in completions]
"""

GRPO = (
    '[train]\nmethod = "grpo"\nmax_steps = 4\nprompts_per_step = 4\ngroup_size = 4\nmax_completion_tokens = 8\n'
    "max_length = 64\nlearning_rate = 1e-3\nsave_every = 4\neval_samples = 4\n"
)


def write(tmp_path: Path, name: str, env_lines: str, tail: str = "") -> Path:
    (tmp_path / "rewards.py").write_text(REWARDS_PY)
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'# autoslm launch {path}\nname = "{name}"\nmodel = "autoslm/tiny"\n[environment]\n'
        f'id = "autoslm/arith"\n{env_lines}\n{GRPO}{tail}'
    )
    return path


def events_in(root: Path, run_id: str) -> list[dict]:
    return [json.loads(x) for x in (root / "grpo" / run_id / "seed0" / "events.jsonl").read_text().splitlines()]


def test_a_reward_file_trains_and_its_mean_is_in_every_step_event(cli, tmp_path, home):
    store = f'[artifacts]\npath = "{tmp_path / "store"}"\n'
    path = write(tmp_path, "parity", 'rewards = ["rewards.py:parity", "env"]\nreward_weights = [1.0, 0.5]', store)
    r = cli("launch", str(path))
    assert r.code == 0, r.out + r.err
    run_id = run_id_from(r.out)
    st = status(cli, run_id)
    assert st["state"] == "succeeded" and st["step"] == 4, st
    steps = [e["data"] for e in events_in(tmp_path / "store", run_id) if e["kind"] == "step" and "reward" in e["data"]]
    assert len(steps) == 4
    for d in steps:
        assert 0.0 <= d["rewards/parity/mean"] <= 1.0 and d["rewards/parity/std"] >= 0.0, d
        assert "rewards/correct/mean" in d  # "env": the task's own reward beside it
        # TRL's reward is the weighted sum of the functions' means.
        assert d["reward"] == pytest.approx(d["rewards/parity/mean"] + 0.5 * d["rewards/correct/mean"], abs=1e-5)
    assert 0.0 < sum(d["rewards/parity/mean"] for d in steps) / 4 < 1.0, steps

    r = cli("watch", run_id)
    assert r.code == 0 and "rewards parity " in r.out and "correct " in r.out, r.out
    out = tmp_path / "report.html"
    assert cli("report", run_id, "--out", str(out)).code == 0
    page = out.read_text()
    assert "Reward functions" in page and "<td>parity</td>" in page and "reward parity (mean)" in page


def test_a_reward_that_raises_on_the_worker_fails_once_or_scores_none(cli, tmp_path, home):
    store = f'[artifacts]\npath = "{tmp_path / "store"}"\n'
    fail = write(tmp_path, "raises", 'rewards = ["rewards.py:on_the_pod_only"]', store)
    assert cli("validate", str(fail)).code == 0  # the laptop's call passes: only the pod's raises
    r = cli("launch", str(fail))
    run_id = run_id_from(r.out)
    st = status(cli, run_id)
    assert st["state"] == "failed" and st["restarts"] == 0, st
    assert "reward rewards.py:on_the_pod_only raised KeyError: 'no such column'" in st["error"], st["error"]
    text = (tmp_path / "store" / "grpo" / run_id / "seed0" / "error_grpo.txt").read_text()
    assert "retryable: false" in text and 'raise KeyError("no such column")' in text and 'rewards.py", line 14' in text, text

    lenient = write(tmp_path, "lenient", 'rewards = ["rewards.py:on_the_pod_only", "env"]\non_reward_error = "none"', store)
    r = cli("launch", str(lenient))
    run_id = run_id_from(r.out)
    assert status(cli, run_id)["state"] == "succeeded"
    counted = [
        e["data"]["reward_errors/on_the_pod_only"]
        for e in events_in(tmp_path / "store", run_id)
        if e["kind"] == "rewards" and "reward_errors/on_the_pod_only" in e["data"]
    ]
    assert sum(counted) == 4 * 16, counted  # every completion of the 4 steps scored None, counted
    assert "(64 raised)" in cli("watch", run_id).out


def test_a_run_where_no_completion_could_be_scored_still_succeeds(cli, tmp_path, home):
    """on_reward_error = "none" with the only reward raising on every completion: every step's reward
    is None. The run finishes with its adapter (once, not restarted), its reward summary empty."""
    store = f'[artifacts]\npath = "{tmp_path / "store"}"\n[limits]\nmax_restarts = 0\n'
    path = write(tmp_path, "unscored", 'rewards = ["rewards.py:on_the_pod_only"]\non_reward_error = "none"', store)
    r = cli("launch", str(path))
    run_id = run_id_from(r.out)
    st = status(cli, run_id)
    assert r.code == 0 and st["state"] == "succeeded" and st["restarts"] == 0, (st, r.out[-2000:], r.err[-2000:])
    assert (tmp_path / "store" / "grpo" / run_id / "seed0" / "adapter" / "adapter_config.json").is_file()
    m = st["metrics"]["seed0"]
    assert m["reward_first"] is None and m["reward_last"] is None and m["reward_curve"] == [], m
    out = tmp_path / "report.html"
    assert cli("report", run_id, "--out", str(out)).code == 0 and out.is_file()
    assert "(64 raised)" in cli("watch", run_id).out


# -- on the fake RunPod, with the Hub as the store --------------------------------------------------
RUNPOD_KEY = "rpkey-RewardFileTestSecret-4e5f6a7b"
HF_TOKEN = "hf_RewardFileHubSecret2K8mQ4xZ7nB1"
HUB_REPO = "someone/runs"
CLOUD = (
    '[compute]\nprovider = "runpod"\ngpu = "RTX 4090"\n'
    'image = "ghcr.io/autoslm/worker:0.1.0"  # the worker runs as in the image\n'
    f'[artifacts]\nstore = "hf"\nrepo = "{HUB_REPO}"\n'
)


@pytest.fixture
def cloud(tmp_path, home):
    with FakeHub(token=HF_TOKEN) as hub, FakeRunPod(api_key=RUNPOD_KEY, workdir=tmp_path / "fake-runpod") as runpod:
        env = {k: v for k, v in os.environ.items() if k not in ("HUGGING_FACE_HUB_TOKEN", "AUTOSLM_DEBUG")}
        env.update({"AUTOSLM_HOME": str(home), **hub.env(), **runpod.env()})

        def run(*args, timeout=600):
            p = subprocess.run(
                [sys.executable, "-m", "autoslm", *args], capture_output=True, text=True, env=env, cwd=str(REPO), timeout=timeout
            )
            return p.returncode, p.stdout, p.stderr

        yield hub, runpod, run


def test_the_reward_file_reaches_the_pod_through_the_store(tmp_path, cloud):
    hub, runpod, cli = cloud
    path = write(tmp_path, "pod-parity", 'rewards = ["rewards.py:parity"]', CLOUD)
    code, out, err = cli("launch", str(path), "--detach", "--yes")
    assert code == 0, out + err
    run_id = run_id_from(out)
    (tmp_path / "rewards.py").unlink()  # the laptop's copy is gone before the worker could have read it
    deadline = time.monotonic() + 600
    while True:
        st = json.loads(cli("status", run_id, "--json")[1])
        if st["state"] in TERMINAL or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert st["state"] == "succeeded" and st["restarts"] == 0, (st, runpod.log(runpod.pods()[0].id)[-3000:])
    (pod,) = runpod.pods()
    job = json.loads(pod.env["AUTOSLM_JOBSPEC"])
    (ref,) = job["environment"]["rewards"]
    assert ref.startswith("store:") and ref.endswith("/rewards.py:parity") and str(tmp_path) not in pod.env["AUTOSLM_JOBSPEC"]
    files = hub.files(HUB_REPO)
    blob = f"data/sha256/{hashlib.sha256(REWARDS_PY.encode()).hexdigest()}"
    assert files[blob] == REWARDS_PY.encode()
    events = [json.loads(x) for x in files[f"grpo/{run_id}/seed0/events.jsonl"].decode().splitlines()]
    steps = [e["data"] for e in events if e["kind"] == "step" and "reward" in e["data"]]
    assert steps and all("rewards/parity/mean" in d for d in steps), steps


@pytest.mark.parametrize(
    "body, said",
    [
        (
            "def f(prompts, completions, **kw):\n    raise ValueError('bad reward')\n",
            "bad.py:f: calling it on the first row of the data raised ValueError: bad reward (line 2)",
        ),
        ("def g(prompts, completions, **kw):\n    return [0.0]\n", "bad.py:f: the file has no 'f'; its functions: g"),
        ("def f(prompts, completions):\n    return [0.0]\n", "cannot take the keywords TRL passes"),
        (
            "def f(prompts, completions, **kw):\n    return [0.0]\n" + "#" * (1024 * 1024),
            "above the 1024 KiB a reward file may have",
        ),
    ],
)
def test_a_bad_reward_file_is_one_line_and_nothing_is_rented(tmp_path, cloud, body, said):
    hub, runpod, cli = cloud
    path = write(tmp_path, "bad", 'rewards = ["bad.py:f"]', CLOUD)
    (tmp_path / "bad.py").write_text(body)
    for command in (("validate", str(path)), ("launch", str(path), "--yes")):
        code, out, err = cli(*command)
        assert code == 2, (command, out, err)
        lines = [x for x in err.splitlines() if x.strip()]
        assert len(lines) == 1 and "environment.rewards.0" in lines[0] and said in lines[0], err
    assert runpod.pods() == [] and not hub.files(HUB_REPO), "nothing is rented or shipped"


# Files that never finish: each command gives each 10 s. They wait in their loop rather than spin (a
# reward stuck on the network looks the same from outside): the check is cut by the clock, not by CPU,
# and six spinning children were half a minute of the suite's CPU.
LOOPING = {
    "import": (
        "import time\nwhile True:\n    time.sleep(0.01)\n",
        "loop.py:f: importing the file did not finish within 10 s (it was at line ",
    ),
    "call": (
        "import time\n\n\ndef f(prompts, completions, **kw):\n    while True:\n        time.sleep(0.01)\n",
        "loop.py:f did not return within 10 s when called on the first row of the data (it was at line ",
    ),
}


@pytest.mark.parametrize("where", sorted(LOOPING))
def test_a_reward_file_that_loops_is_one_line_from_validate_plan_and_launch(tmp_path, cloud, where):
    hub, runpod, cli = cloud
    body, said = LOOPING[where]
    path = write(tmp_path, "loop", 'rewards = ["loop.py:f"]', CLOUD)
    (tmp_path / "loop.py").write_text(body)
    for command in (("validate", str(path)), ("plan", str(path)), ("launch", str(path), "--yes")):
        started = time.monotonic()
        code, out, err = cli(*command, timeout=60)
        took = time.monotonic() - started
        assert code == 2 and took < 30, (command, code, took, out, err)
        lines = [x for x in err.splitlines() if x.strip()]
        assert len(lines) == 1 and "environment.rewards.0" in lines[0] and said in lines[0], err
        assert "Traceback" not in out + err
    assert runpod.pods() == [] and not hub.files(HUB_REPO), "nothing is rented or shipped"
