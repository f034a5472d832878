"""Colocated vLLM through the real worker, on vLLM's CPU build (the .venv-vllm stack: make test-vllm).

Each run is `autoslm launch` of a JobSpec with ``train.vllm.enabled = true``: the local provider starts
the worker, TRL starts vLLM colocated with the trainer and generates every rollout (and the held-out
evaluation's completions) with it. Starting a colocated vLLM costs 20-45 s on 2 cores, so each test
checks several things of one run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoslm.engine.train.gpu import installed
from tests.e2e.test_sft_local import kill_after_first_checkpoint, run_id_from, status, wait_for

if not installed("vllm"):
    pytest.skip("vllm is not installed in this stack (make test-vllm runs these in .venv-vllm)", allow_module_level=True)

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

ENGINE = "colocated vLLM 0.31.0 (cpu)"


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


def worker_logs(home: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted((home / "logs").rglob("*.log")))


def engines(events: list[dict]) -> list[str]:
    return [e["data"]["engine"] for e in events if e["kind"] == "generation"]


# The GRPO quickstart through colocated vLLM, shortened to this many steps (docs/grpo.md: with
# transformers generation the rise over the first 150 steps of the quickstart was +0.07 to +0.15 on
# seeds 0-2; the full 300 steps through vLLM, seed 0: +0.193). `long` (make test-long): what make test
# runs of it is the same run cut to RESUME_STEPS, across the same preemption, without the learning check.
VLLM_STEPS = 150
VLLM_RISE = 0.04
RESUME_STEPS = 20


def grpo_quickstart_with_vllm_resumed(cli, tmp_path: Path, home: Path, steps: int, sft_steps: int | None = None) -> dict:
    """The SFT quickstart (cut to ``sft_steps``), then the GRPO quickstart continuing it, cut to ``steps``,
    with train.vllm.enabled = true: killed after its first checkpoint (a third of the way, at least 10
    steps), relaunched, resumed with a fresh colocated vLLM. Both attempts and the held-out evaluations
    (before and after, greedy and sampled) generate with vLLM (through rollout.multiturn.vllm_generate).
    Returns the run's metrics."""
    store = f'path = "{tmp_path / "store"}"'
    sft_text = Path("jobspecs/quickstart.toml").read_text().replace('store = "local"', store)
    if sft_steps:
        assert "max_steps = 150" in sft_text
        sft_text = sft_text.replace("max_steps = 150", f"max_steps = {sft_steps}")
    sft = tmp_path / "quickstart.toml"
    sft.write_text(sft_text)
    r = cli("launch", str(sft))
    assert r.code == 0, r.out + r.err
    text = Path("jobspecs/quickstart-grpo.toml").read_text()
    save_every = max(10, steps // 3)
    for old, new in [
        ("max_steps = 400", f"max_steps = {steps}"),
        ("save_every = 100", f"save_every = {save_every}"),
        ('store = "local"', store),
        ("[compute]", "[train.vllm]\nenabled = true\n\n[compute]"),
    ]:
        assert old in text, old
        text = text.replace(old, new)
    spec = tmp_path / "quickstart-grpo.toml"
    spec.write_text(text)
    r = cli("launch", str(spec), "--detach")
    assert r.code == 0, r.out + r.err
    run_id = run_id_from(r.out)
    pod_id = status(cli, run_id)["pod_id"]
    kill_after_first_checkpoint(tmp_path / "store" / "grpo" / run_id / "seed0" / "checkpoint", pod_id, timeout=600)
    st = wait_for(cli, run_id, lambda s: s["state"] in ("succeeded", "failed", "cancelled"), timeout=900)
    assert st["state"] == "succeeded", st
    assert st["restarts"] == 1 and st["step"] == st["total_steps"] == steps
    events = events_of(tmp_path, "grpo", run_id)
    assert engines(events) == [ENGINE, ENGINE], "both attempts generate with colocated vLLM"
    resumes = [e for e in events if e["kind"] == "resume"]
    assert resumes and save_every <= resumes[0]["data"]["from_step"] < steps
    evals = {e["data"]["when"]: e["data"] for e in events if e["kind"] == "eval"}
    assert all(evals[w][k] is not None for w in ("before", "after") for k in ("score", "score_sampled")), evals
    assert f"'engine': '{ENGINE}'" in worker_logs(home)
    m = st["metrics"]["seed0"]
    assert len(m["reward_curve"]) == steps
    return m


def test_grpo_quickstart_with_vllm_evaluates_and_resumes(cli, tmp_path, home):
    grpo_quickstart_with_vllm_resumed(cli, tmp_path, home, RESUME_STEPS, sft_steps=30)


@pytest.mark.long
def test_grpo_quickstart_with_vllm_learns_evaluates_and_resumes(cli, tmp_path, home):
    """The learning check of tests/e2e/test_quickstart.py, with a bound for the shorter run, across the restart."""
    from tests.e2e.test_quickstart import learning_failures

    m = grpo_quickstart_with_vllm_resumed(cli, tmp_path, home, VLLM_STEPS)
    # A shorter run: its own bound on the rise; the greedy score of 25 problems may move by one either way.
    fails = [f for f in learning_failures(m) if "score_sampled" in f]
    assert not fails, fails
    assert m["reward_last"] - m["reward_first"] >= VLLM_RISE, (m["reward_first"], m["reward_last"])


def test_multi_turn_guess_through_vllm(cli, tmp_path, home):
    """Multi-turn episodes played turn by turn on the colocated engine (rollout.multiturn.vllm_generate)."""
    spec = write(
        tmp_path,
        "guess",
        """
[environment]
id = "autoslm/guess"
params = { n_train = 32, n_eval = 2, max_number = 8, max_turns = 3 }
[train]
method = "grpo"
max_steps = 2
prompts_per_step = 2
group_size = 2
max_completion_tokens = 36
max_length = 384
save_every = 10
eval_samples = 2
vllm = { enabled = true }
[limits]
max_restarts = 0
""",
    )
    r = cli("launch", str(spec))
    assert r.code == 0, r.out + r.err
    run_id = run_id_from(r.out)
    st = status(cli, run_id)
    assert st["state"] == "succeeded" and st["step"] == 2
    events = events_of(tmp_path, "grpo", run_id)
    assert engines(events) == [ENGINE]
    gen = next(e["data"] for e in events if e["kind"] == "generation")
    assert any("turn by turn" in n for n in gen["notes"])
    transcripts = [s["transcript"] for e in events if e["kind"] == "rollout" for s in e["data"]["samples"] if s.get("transcript")]
    roles = [m["role"] for m in max(transcripts, key=len)]
    assert roles.count("assistant") >= 2 and "user" in roles[roles.index("assistant") :], roles


def test_tool_task_through_vllm(cli, tmp_path, home):
    """The tool task with vLLM generating: TRL hands the tools to the chat template and runs the calls
    the model makes (the random tiny model rarely makes one: this checks the path runs end to end)."""
    spec = write(
        tmp_path,
        "calc",
        """
[environment]
id = "autoslm/calc-tool"
params = { n_train = 64, n_eval = 2, max_operand = 9 }
[train]
method = "grpo"
max_steps = 2
prompts_per_step = 2
group_size = 4
max_completion_tokens = 48
max_length = 320
save_every = 10
eval_samples = 0
vllm = { enabled = true }
[limits]
max_restarts = 0
""",
    )
    r = cli("launch", str(spec))
    assert r.code == 0, r.out + r.err
    run_id = run_id_from(r.out)
    assert status(cli, run_id)["state"] == "succeeded"
    events = events_of(tmp_path, "grpo", run_id)
    assert engines(events) == [ENGINE]
    steps = [e["data"] for e in events if e["kind"] == "step" and "train_runtime" not in e["data"]]
    assert len(steps) == 2, steps


@pytest.mark.long  # make test-long: two engines on 2 cores; make test runs 2 ranks with transformers generation
def test_two_processes_each_with_colocated_vllm(cli, tmp_path, home):
    """compute.gpu_count = 2 on this CPU: two gloo ranks, each with its own colocated vLLM (TRL's
    external_launcher on the ranks' process group). Both generate, train and leave cleanly: vLLM's
    exit hook runs after its groups are gone (engine.distributed's leave), so no rank prints a traceback."""
    spec = write(
        tmp_path,
        "two",
        """
[environment]
id = "autoslm/arith"
params = { n_train = 256, n_eval = 4, max_operand = 9 }
[train]
method = "grpo"
max_steps = 2
prompts_per_step = 4
group_size = 4
max_completion_tokens = 8
max_length = 64
save_every = 10
eval_samples = 4
vllm = { enabled = true }
[compute]
gpu_count = 2
[limits]
max_restarts = 0
""",
    )
    r = cli("launch", str(spec))
    assert r.code == 0, r.out + r.err
    run_id = run_id_from(r.out)
    st = status(cli, run_id)
    assert st["state"] == "succeeded" and st["step"] == 2, st
    events = events_of(tmp_path, "grpo", run_id)
    assert engines(events) == [ENGINE]
    gen = next(e["data"] for e in events if e["kind"] == "generation")
    assert gen["batching"]["num_processes"] == 2
    logs = worker_logs(home)
    assert "Traceback" not in logs, logs[-3000:]


def test_critique_quickstart_evaluates_on_vllm_within_its_context(cli, tmp_path, home):
    """jobspecs/quickstart-critique.toml, shortened and from the base model, on colocated vLLM: its
    held-out episodes keep to training's per-turn budget and the context (train.max_length = 128 is
    vLLM's max_model_len), so a long greedy turn cannot push the next turn's prompt past what vLLM
    accepts, and the evaluations before and after training score every episode."""
    text = Path("jobspecs/quickstart-critique.toml").read_text()
    for old, new in [
        ('init_from_adapter = "quickstart"', ""),
        ("max_steps = 300", "max_steps = 1"),
        ("prompts_per_step = 8", "prompts_per_step = 2"),
        ("group_size = 8", "group_size = 2"),
        ("eval_samples = 64", "eval_samples = 8"),
        ('store = "local"', f'path = "{tmp_path / "store"}"'),
        ("[compute]", "[train.vllm]\nenabled = true\n\n[compute]"),
        ("[limits]", "[limits]\nmax_restarts = 0"),
    ]:
        assert old in text, old
        text = text.replace(old, new)
    spec = tmp_path / "critique.toml"
    spec.write_text(text)
    r = cli("launch", str(spec))
    assert r.code == 0, r.out + r.err + worker_logs(home)[-3000:]
    run_id = run_id_from(r.out)
    assert status(cli, run_id)["state"] == "succeeded"
    events = events_of(tmp_path, "grpo", run_id)
    assert engines(events) == [ENGINE]
    evals = {e["data"]["when"]: e["data"] for e in events if e["kind"] == "eval"}
    assert set(evals) == {"before", "after"} and all(evals[w]["n"] == 8 and evals[w]["score"] is not None for w in evals), evals
