"""GRPO end to end on this CPU through the CLI: the tool task, the multi-turn task, and resume.

The tiny model is random, so the tool test first teaches it the tool-call format with a short SFT
run (the calc-tool task's SFT target is the call), then GRPO continues that adapter and TRL executes
the calls it makes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.test_sft_local import kill_after_first_checkpoint, run_id_from, status, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.worker]  # worker: run on the image's pins (make test: only there)


def write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'# autoslm launch {path}\nname = "{name}"\nmodel = "autoslm/tiny"\n'
        + body
        + f'\n[artifacts]\npath = "{tmp_path / "store"}"\n'
    )
    return path


def events_of(tmp_path: Path, phase: str, run_id: str) -> list[dict]:
    f = tmp_path / "store" / phase / run_id / "seed0" / "events.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines()]


def test_tool_task_calls_are_executed(cli, tmp_path, home):
    sft = write(
        tmp_path,
        "calc-sft",
        """
[environment]
id = "autoslm/calc-tool"
params = { n_train = 256, n_eval = 4, max_operand = 9 }
[train]
method = "sft"
max_steps = 60
batch_size = 8
learning_rate = 3e-3
max_length = 320
save_every = 60
eval_samples = 0
""",
    )
    r = cli("launch", str(sft))
    assert r.code == 0, r.out + r.err
    grpo = write(
        tmp_path,
        "calc-grpo",
        """
[environment]
id = "autoslm/calc-tool"
params = { n_train = 64, n_eval = 4, max_operand = 9 }
[train]
method = "grpo"
init_from_adapter = "calc-sft"
max_steps = 2
prompts_per_step = 2
group_size = 4
max_completion_tokens = 48
max_length = 320
temperature = 0.3
save_every = 10
eval_samples = 0
""",
    )
    r = cli("launch", str(grpo))
    assert r.code == 0, r.out + r.err
    run_id = run_id_from(r.out)
    assert status(cli, run_id)["state"] == "succeeded"
    events = events_of(tmp_path, "grpo", run_id)
    calls = [e["data"].get("tools/call_frequency", 0) for e in events if e["kind"] == "step"]
    assert max(calls) > 0, f"no tool call was made: {calls}"
    samples = [s for e in events if e["kind"] == "rollout" for s in e["data"]["samples"]]
    tool_turns = [m for s in samples if isinstance(s["completion"], list) for m in s["completion"] if m.get("role") == "tool"]
    assert tool_turns, "no executed tool result in the rollouts"
    assert any(m["content"].strip().lstrip("-").isdigit() for m in tool_turns), tool_turns


def test_multi_turn_task_runs_and_dumps_transcripts(cli, tmp_path, home):
    spec = write(
        tmp_path,
        "guess",
        """
[environment]
id = "autoslm/guess"
params = { n_train = 32, n_eval = 4, max_number = 8, max_turns = 3 }
[train]
method = "grpo"
max_steps = 2
prompts_per_step = 2
group_size = 2
max_completion_tokens = 36
max_length = 384
save_every = 10
eval_samples = 4
""",
    )
    r = cli("launch", str(spec))
    assert r.code == 0, r.out + r.err
    run_id = run_id_from(r.out)
    st = status(cli, run_id)
    assert st["state"] == "succeeded" and st["step"] == 2
    events = events_of(tmp_path, "grpo", run_id)
    transcripts = [s["transcript"] for e in events if e["kind"] == "rollout" for s in e["data"]["samples"] if s.get("transcript")]
    assert transcripts, "no transcript in the rollout dump"
    longest = max(transcripts, key=len)
    roles = [m["role"] for m in longest]
    assert roles.count("assistant") >= 2 and "user" in roles[roles.index("assistant") :], roles


def test_grpo_killed_after_checkpoint_resumes_to_the_planned_step(cli, tmp_path, home):
    spec = write(
        tmp_path,
        "arith-grpo",
        """
[environment]
id = "autoslm/arith"
params = { n_train = 256, n_eval = 8 }
[train]
method = "grpo"
max_steps = 12
prompts_per_step = 4
group_size = 4
max_completion_tokens = 6
max_length = 64
save_every = 3
eval_samples = 8
""",
    )
    r = cli("launch", str(spec), "--detach")
    assert r.code == 0, r.err
    run_id = run_id_from(r.out)
    pod_id = status(cli, run_id)["pod_id"]
    kill_after_first_checkpoint(tmp_path / "store" / "grpo" / run_id / "seed0" / "checkpoint", pod_id)
    st = wait_for(cli, run_id, lambda s: s["state"] in ("succeeded", "failed", "cancelled"))
    assert st["state"] == "succeeded", st
    assert st["restarts"] == 1 and st["step"] == st["total_steps"] == 12
    resumes = [e for e in events_of(tmp_path, "grpo", run_id) if e["kind"] == "resume"]
    assert resumes and 3 <= resumes[0]["data"]["from_step"] < 12
    curve = st["metrics"]["seed0"]["reward_curve"]
    assert [s for s, _ in curve] == list(range(1, 13)), "the reward curve must cover every step, across the restart"


def test_thinking_length_penalty_is_its_own_reward_in_the_step_events(cli, tmp_path, home):
    spec = write(
        tmp_path,
        "think",
        """thinking = true
[environment]
id = "autoslm/arith"
params = { n_train = 64, n_eval = 4, max_operand = 9 }
[train]
method = "grpo"
max_steps = 2
prompts_per_step = 2
group_size = 4
max_completion_tokens = 24
max_length = 96
thinking_length_penalty = 0.01
save_every = 10
eval_samples = 0
""",
    )
    r = cli("launch", str(spec))
    assert r.code == 0, r.out + r.err
    run_id = run_id_from(r.out)
    steps = [e["data"] for e in events_of(tmp_path, "grpo", run_id) if e["kind"] == "step"]
    penalty = [s[k] for s in steps for k in s if "thinking_length_penalty" in k and k.endswith("/mean")]
    assert len(penalty) == 2 and all(p <= 0 for p in penalty), steps
