"""The README's promise, run as written: the SFT quickstart learns (and `autoslm chat` answers a sum
with its adapter), then the GRPO quickstart continues its adapter and learns from the task's reward;
and the same check fails when GRPO is trained on a negated reward (so the check can tell learning
from its absence).

`make test` runs the SFT quickstart, chat and the negated run (GRPO continuing the SFT adapter, 40
steps, which the learning check must refuse). The GRPO quickstart's 400 steps, the learning check
that passes, are `long` (`make test-long`): about 170 CPU-s, a sixth of what `make test` may spend on
this stack. The quickstart's own seed runs there; the spread below was measured over seven, and the
vLLM stack's GRPO quickstart (tests/colocated/test_vllm_worker.py) runs the same learning check
through another generator, across a preemption.

Runs repeat exactly from their seed on a given kind of CPU (test_reproducible.py); what can differ
between machines (other CPU kernels) behaves like another seed. The bounds hold with a margin against
the spread measured with the built-in model v4 on 2 cores (docs/grpo.md has every run):

- SFT (150 steps, seed 0): eval loss 7.99 -> 1.98, greedy held-out score 0 -> 0.52; bounds: a drop of
  2.0 and a rise of 0.25.
- GRPO quickstart (400 steps), mean reward of the first tenth -> the last tenth, seeds 0-3, 11-13:
  +0.235, +0.205, +0.219, +0.216, +0.213, +0.191, +0.266. The bound, RISE = 0.15, is 0.04 below the smallest and
  far above what a GRPO that does not learn gives (the former recipe: +0.02 to +0.07; lr 3e-4: flat
  over 72 steps).
- Held-out score after GRPO vs the SFT adapter's: sampled at the training temperature (100 answers)
  +0.15 to +0.25 on those seeds; greedy (25 answers) -0.04 (seeds 1, 13) to +0.08, hence one answer of slack.
- A negated reward (the mutation below, 40 steps) takes the held-out scores to 0 (greedy 0.52 -> 0.00,
  sampled 0.07 -> 0.00) while the reward it is trained on rises 0.75 -> 1.00: the check fails on it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.e2e.test_sft_local import run_id_from, wait_for

# The laptop stack's: the README's `make demo` runs there. GRPO learning on the image's pins is the
# vLLM stack's test (tests/colocated/test_vllm_worker.py), which is how a GPU pod generates.
pytestmark = pytest.mark.e2e

# The rise (last tenth - first tenth of the reward) asserted per seed: below every measured one.
RISE = 0.15
# The seeds this test runs: the quickstart's own. Every seed measured clears RISE with a margin (above);
# a second seed here was two more 400-step runs' CPU in every `make test`.
SEEDS = (0,)
# The greedy held-out score is 25 answers: one of them may flip either way (seeds 1 and 13:
# 0.52 -> 0.48, while their sampled scores rose +0.15 and +0.23). The sampled score (100 answers)
# gets no slack.
GREEDY_SLACK = 0.04 + 1e-9
# The mutation run: the GRPO quickstart shortened to this many steps, reward negated.
MUTATION_STEPS = 40

# Loaded by the worker (PYTHONPATH): GRPO trains on 1 - reward; the held-out evaluation keeps the
# task's own reward, so it shows what the policy really learned.
NEGATE_REWARD = """
import autoslm.engine.rollout.rewards as rewards

_build = rewards.build_reward_set


def _negated(*args, **kwargs):
    rs = _build(*args, **kwargs)
    for f in rs.funcs:
        score = f._score
        f._score = lambda items, score=score: [1.0 - v for v in score(items)]
    return rs


rewards.build_reward_set = _negated
"""


def learning_failures(m: dict) -> list[str]:
    """Why a GRPO quickstart run did not learn (empty when it did): the reward's rise from the first
    to the last tenth, and the held-out score (greedy and sampled) against the SFT adapter's."""
    out = []
    rise = m["reward_last"] - m["reward_first"]
    if rise < RISE:
        out.append(f"reward rose {m['reward_first']:.3f} -> {m['reward_last']:.3f} (+{rise:.3f} < {RISE})")
    # What training ended with: "last" when keep_best (on for a continued adapter) handed back another.
    before, after = m["eval"]["before"], m["eval"].get("last") or m["eval"]["after"]
    for key, slack in (("score", GREEDY_SLACK), ("score_sampled", 0.0)):
        if after[key] < before[key] - slack:
            out.append(f"held-out {key} fell {before[key]} -> {after[key]}")
    return out


def grpo_spec(tmp_path: Path, seed: int, name: str, steps: int | None = None) -> Path:
    text = Path("jobspecs/quickstart-grpo.toml").read_text()
    edits = [("seed = 0", f"seed = {seed}"), ('name = "quickstart-grpo"', f'name = "{name}"')]
    if steps:
        edits.append(("max_steps = 400", f"max_steps = {steps}"))
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


ASK = "What is 3 + 4? Answer with the number only."


def ended(st: dict) -> bool:
    return st["state"] in ("succeeded", "failed", "cancelled")


def test_sft_quickstart_learns_and_a_grpo_run_on_a_negated_reward_fails_the_learning_check(cli, home, tmp_path):
    # The README's `make demo`, followed as written; while it trains, `autoslm chat` says there is no adapter yet.
    launch = subprocess.Popen(
        [sys.executable, "-m", "autoslm", "launch", "jobspecs/quickstart.toml"],
        cwd=str(REPO),
        env={**os.environ, "AUTOSLM_HOME": str(home), "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    listed: list = []
    deadline = time.monotonic() + 120
    while not listed and time.monotonic() < deadline:
        time.sleep(1)
        listed = json.loads(cli("list", "--json").out or "[]")
    assert listed, "the quickstart run was not created"
    early = cli("chat", listed[0]["run_id"], "--prompt", ASK)
    assert early.code == 2 and "it has no adapter yet" in early.err and "--base" in early.err, early.out + early.err
    out, err = launch.communicate(timeout=900)
    assert launch.returncode == 0, out + err
    sft_id = run_id_from(out)
    st = json.loads(cli("status", sft_id, "--json").out)
    assert st["state"] == "succeeded" and st["step"] == st["total_steps"]
    ev = st["metrics"]["seed0"]["eval"]
    assert ev["after"]["loss"] < ev["before"]["loss"] - 2.0
    assert ev["after"]["score"] >= ev["before"]["score"] + 0.25, ev

    # Try what was trained: the adapter answers the sum (greedy, so the same answer every time); the
    # bare model does not.
    chat = cli("chat", sft_id, "--prompt", ASK)
    assert chat.code == 0, chat.err
    assert re.findall(r"-?\d+", chat.out)[-1:] == ["7"], chat.out
    bare = cli("chat", sft_id, "--base", "--prompt", ASK, "--max-new-tokens", "12")
    assert bare.code == 0, bare.err
    assert bare.out.strip() and bare.out.strip() != chat.out.strip()

    # The GRPO quickstart continuing that adapter, on a negated reward: the learning check says so.
    mutation = tmp_path / "negate"
    mutation.mkdir()
    (mutation / "sitecustomize.py").write_text(NEGATE_REWARD)
    spec = grpo_spec(tmp_path, 0, "qs-grpo-negated", MUTATION_STEPS)
    r = cli("launch", str(spec), "--detach", env={"PYTHONPATH": f"{mutation}:{REPO}"})
    assert r.code == 0, r.out + r.err
    st = wait_for(cli, run_id_from(r.out), ended, timeout=1800)
    assert st["state"] == "succeeded" and st["step"] == MUTATION_STEPS, st
    fails = learning_failures(st["metrics"]["seed0"])
    assert any("held-out score_sampled fell" in f for f in fails), ("a negated reward passed the learning check", st["metrics"])


@pytest.mark.long
def test_grpo_quickstart_learns_from_the_sft_quickstarts_adapter(cli, home, tmp_path):
    # The SFT quickstart first: the GRPO quickstart continues its adapter.
    r = cli("launch", "jobspecs/quickstart.toml", timeout=900)
    assert r.code == 0, r.out + r.err
    runs = {}
    for seed in SEEDS:  # side by side (one CPU thread each)
        r = cli("launch", str(grpo_spec(tmp_path, seed, f"qs-grpo-{seed}")), "--detach")
        assert r.code == 0, r.out + r.err
        runs[seed] = run_id_from(r.out)
    for seed, run_id in runs.items():
        st = wait_for(cli, run_id, ended, timeout=1800)
        assert st["state"] == "succeeded" and st["step"] == st["total_steps"] == 400, st
        m = st["metrics"][f"seed{seed}"]
        assert len(m["reward_curve"]) == 400
        assert not learning_failures(m), (seed, learning_failures(m))
