"""The README's promise, run as written: the SFT quickstart learns (and `autoslm chat` answers a sum
with its adapter), then the GRPO quickstart continues its adapter and trains on the task's reward
without losing what SFT taught.

Both runs repeat exactly from their seed on a given kind of CPU (test_reproducible.py), so these checks
do not flip from run to run; what can differ between machines (other CPU kernels) behaves like another
seed. The bounds below hold with a margin against the spread over seeds, measured with the built-in
model v4 on 2 loaded cores (per-step rewards are means of 64 sampled answers, sd 0.075 step to step):

- SFT eval loss 7.99 -> 1.25 (seed 0) and 1.87 (seed 1): a drop of 6.1-6.7, bound 2.0. Greedy score
  0 -> 0.84 and 0.64, bound +0.25.
- GRPO mean reward of the whole run 0.50 (seed 0) and 0.49 (seed 1); of its last tenth 0.528 and
  0.483 (another machine: 0.416). The bound, 0.30, is 0.12 or more below all of these (8 standard
  errors of a 30-step mean) and above what a broken run gives: a policy that lost its SFT
  (learning rate 3e-3: 0.03 after 61 steps; 2e-3: 0.29 after 73 steps, falling), a reward that
  never pays, or an adapter that was not continued (the bare model scores 0).

Not asserted: that the reward rises. From the first to the last tenth of the 300 steps it rose +0.066
(seed 0: 0.462 -> 0.528), +0.030 (seed 1: 0.453 -> 0.483) and +0.020 on another machine (0.395 ->
0.416); the standard error of that difference is 0.02, so the former bound (+0.05) failed on two of
these three and any positive bound would fail on some seeds. With the built-in model GRPO at this
learning rate mostly holds the SFT policy's reward (5e-4: flat at 0.50-0.54 over 188 steps).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO
from tests.e2e.test_sft_local import run_id_from

pytestmark = [pytest.mark.e2e, pytest.mark.worker]  # worker: also on the image's pins

# Floor for the GRPO run's mean reward, over the whole run and over its last tenth (see above).
REWARD_FLOOR = 0.30


ASK = "What is 3 + 4? Answer with the number only."


def test_sft_then_grpo_quickstarts(cli, home):
    # The README's `make demo`, followed as written; while it trains, `autoslm chat` says there is no adapter yet.
    launch = subprocess.Popen([sys.executable, "-m", "autoslm", "launch", "jobspecs/quickstart.toml"], cwd=str(REPO),
                              env={**os.environ, "AUTOSLM_HOME": str(home), "PYTHONPATH": str(REPO)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs: list = []
    deadline = time.monotonic() + 120
    while not runs and time.monotonic() < deadline:
        time.sleep(1)
        runs = json.loads(cli("list", "--json").out or "[]")
    assert runs, "the quickstart run was not created"
    early = cli("chat", runs[0]["run_id"], "--prompt", ASK)
    assert early.code == 2 and "it has no adapter yet" in early.err and "--base" in early.err, early.out + early.err
    out, err = launch.communicate(timeout=900)
    assert launch.returncode == 0, out + err
    run_id = run_id_from(out)
    st = json.loads(cli("status", run_id, "--json").out)
    assert st["state"] == "succeeded" and st["step"] == st["total_steps"] == 300
    ev = st["metrics"]["seed0"]["eval"]
    assert ev["after"]["loss"] < ev["before"]["loss"] - 2.0
    assert ev["after"]["score"] >= ev["before"]["score"] + 0.25, ev

    # Try what was trained: the adapter answers the sum (greedy, so the same answer every time); the
    # bare model does not.
    chat = cli("chat", run_id, "--prompt", ASK)
    assert chat.code == 0, chat.err
    assert re.findall(r"-?\d+", chat.out)[-1:] == ["7"], chat.out
    bare = cli("chat", run_id, "--base", "--prompt", ASK, "--max-new-tokens", "12")
    assert bare.code == 0, bare.err
    assert bare.out.strip() and bare.out.strip() != chat.out.strip()

    grpo = cli("launch", "jobspecs/quickstart-grpo.toml")
    assert grpo.code == 0, grpo.out + grpo.err
    assert "reward" in grpo.out
    st = json.loads(cli("status", run_id_from(grpo.out), "--json").out)
    assert st["state"] == "succeeded" and st["step"] == st["total_steps"] == 300
    m = st["metrics"]["seed0"]
    rewards = [r for _, r in m["reward_curve"]]
    assert len(rewards) == 300
    summary = (round(sum(rewards) / len(rewards), 4), m["reward_first"], m["reward_last"])
    # The policy GRPO trains keeps answering correctly about half the time at temperature 1.
    assert sum(rewards) / len(rewards) >= REWARD_FLOOR, summary
    assert m["reward_last"] >= REWARD_FLOOR, summary
