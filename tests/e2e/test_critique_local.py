"""autoslm/critique end to end on this CPU through the CLI: a short run of the critique quickstart
(from the bare built-in model, so no SFT run first) whose step events carry the four outcome
fractions, summing to 1, with the accuracy per turn, and whose report draws them.

The long run the quickstart's numbers come from (300 steps from the SFT adapter) is in docs/critique.md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.conftest import REPO, edited_spec
from tests.e2e.test_sft_local import run_id_from, status

pytestmark = [pytest.mark.e2e, pytest.mark.worker]  # worker: run on the image's pins (make test: only there)

QUADRANTS = ("correction", "robustness", "sycophancy", "boundary")


def short_spec(tmp_path: Path) -> Path:
    edits = [
        ('init_from_adapter = "quickstart"', "turn_loss_weights = [0.5, 1.0]"),
        ("max_steps = 300", "max_steps = 3"),
        ("prompts_per_step = 8", "prompts_per_step = 2"),
        ("group_size = 8", "group_size = 4"),
        ("eval_samples = 64", "eval_samples = 3"),
        ("n_train = 2048, n_eval = 64", "n_train = 32, n_eval = 3"),
        ('store = "local"', f'path = "{tmp_path / "store"}"'),
    ]
    return edited_spec(REPO / "jobspecs" / "quickstart-critique.toml", edits, tmp_path / "critique.toml")


def test_critique_step_events_carry_the_four_fractions(cli, tmp_path, home):
    r = cli("launch", str(short_spec(tmp_path)))
    assert r.code == 0, r.out + r.err
    run_id = run_id_from(r.out)
    assert status(cli, run_id)["state"] == "succeeded"
    events = [
        json.loads(line) for line in (tmp_path / "store" / "grpo" / run_id / "seed0" / "events.jsonl").read_text().splitlines()
    ]
    steps = [e["data"] for e in events if e["kind"] == "step" and "reward" in e["data"]]
    assert len(steps) == 3
    for data in steps:
        keys = {q: [k for k in data if q in k] for q in QUADRANTS}
        assert all(len(v) == 1 for v in keys.values()), data
        assert math.isclose(sum(data[v[0]] for v in keys.values()), 1.0, abs_tol=1e-6), data
        for key in ("critique/accuracy_turn1", "critique/accuracy_turn2", "critique/accuracy_change", "multiturn/dropped"):
            assert key in data, key
        assert data["critique/accuracy_change"] == pytest.approx(
            data["critique/accuracy_turn2"] - data["critique/accuracy_turn1"]
        )
    samples = [s for e in events if e["kind"] == "rollout" for s in e["data"]["samples"]]
    assert any(len([m for m in s["transcript"] if m["role"] == "assistant"]) == 2 for s in samples)
    out = tmp_path / "report.html"
    r = cli("report", run_id, "--out", str(out))
    assert r.code == 0, r.err
    page = out.read_text()
    assert "sycophancy (right -&gt; wrong)" in page and "accuracy at turn 2" in page


CRITIC_LINE = "I am not convinced. What is your final answer?"


def judge_or_critic(messages: list[dict]) -> str:
    """The fake endpoint as both: a critic when asked to write a challenge, else a grader."""
    if messages and messages[0].get("content", "").startswith("You are a critic"):
        return CRITIC_LINE
    return "SCORE: 1" if "7" in messages[-1].get("content", "") else "SCORE: 0"


def test_a_judge_writes_the_challenges_and_its_score_is_logged(cli, tmp_path, home):
    from tests.fakes.openai_chat import FakeChatServer

    with FakeChatServer(scorer=judge_or_critic) as server:
        text = short_spec(tmp_path).read_text()
        text = text.replace("turns = 2 }", 'turns = 2, critic = "judge" }').replace("max_steps = 3", "max_steps = 2")
        text = text.replace(
            "[train]", f'[environment.judge]\nbase_url = "{server.base_url}"\nmodel = "judge"\nweight = 0.5\n\n[train]'
        )
        spec = tmp_path / "judged.toml"
        spec.write_text(text)
        r = cli("launch", str(spec))
        assert r.code == 0, r.out + r.err
        run_id = run_id_from(r.out)
        assert status(cli, run_id)["state"] == "succeeded"
        critics = [b for b in server.requests if b["messages"][0]["content"].startswith("You are a critic")]
        graders = [b for b in server.requests if not b["messages"][0]["content"].startswith("You are a critic")]
    assert critics and graders
    events = [
        json.loads(line) for line in (tmp_path / "store" / "grpo" / run_id / "seed0" / "events.jsonl").read_text().splitlines()
    ]
    steps = [e["data"] for e in events if e["kind"] == "step" and "reward" in e["data"]]
    assert steps and all("rewards/judge/mean" in d and "critique/sycophancy" in d for d in steps)
    samples = [s for e in events if e["kind"] == "rollout" for s in e["data"]["samples"]]
    assert any(m["content"] == CRITIC_LINE for s in samples for m in s["transcript"] if m["role"] == "user")
