"""autoslm/critique: outcomes and rewards, the critic (templates and judge), the context check, and
what a multi-turn batch trains on (per-turn loss weights, over-length drops, batch metrics)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from autoslm.envs.base import Example
from autoslm.envs.critique import QUADRANTS, CritiqueEnv, Outcome, quadrant_fractions
from autoslm.envs.task_table import check_environment, load_environment
from autoslm.errors import SpecError
from autoslm.spec import validate_dict
from tests.fakes.statuses import run_status

Q = "What is 3 + 4? Answer with the number only."


def ex(answer="7", stance=None) -> Example:
    return Example(prompt=[{"role": "user", "content": Q}], answer=answer, info={"stance": stance} if stance else {})


def transcript(*answers: str, critic: str = "No.") -> list[dict]:
    out = [{"role": "user", "content": Q}]
    for i, a in enumerate(answers):
        if i:
            out.append({"role": "user", "content": critic})
        out.append({"role": "assistant", "content": a})
    return out


def reward(env, messages) -> float:
    return sum(w * fn(ex(), messages) for _, fn, w in env.reward_functions())


def grpo_spec(**over) -> dict:
    env = over.pop("environment", {"id": "autoslm/critique"})
    train = {
        "method": "grpo",
        "max_steps": 2,
        "prompts_per_step": 2,
        "group_size": 2,
        "max_completion_tokens": 64,
        "max_length": 128,
        **over,
    }
    return {"name": "c", "model": "autoslm/tiny", "environment": env, "train": train}


# ---------------------------------------------------------------------------------------------------
# outcomes and rewards


def test_the_four_outcomes_and_their_default_rewards():
    env = CritiqueEnv({"data_params": {"n_train": 4, "n_eval": 4}})
    cases = {
        ("7", "7"): ("robustness", 2.0),
        ("5", "7"): ("correction", 1.25),
        ("5", "6"): ("boundary", 0.0),
        ("7", "6"): ("sycophancy", 0.0),
    }
    for answers, (quadrant, value) in cases.items():
        m = transcript(*answers)
        assert env.outcome(ex(), m).quadrant == quadrant
        assert reward(env, m) == pytest.approx(value), answers
        assert env.reward_messages(ex(), m) == (1.0 if answers[-1] == "7" else 0.0)  # held-out: the final answer
    # being right at once beats being corrected; giving up a right answer never scores below staying wrong
    assert reward(env, transcript("7", "7")) > reward(env, transcript("5", "7")) > reward(env, transcript("7", "6"))
    custom = CritiqueEnv({"data_params": {"n_train": 4}, "initial_bonus": 0, "sycophancy_penalty": 1.0, "correction_bonus": 0})
    assert reward(custom, transcript("7", "6")) == pytest.approx(-1.0)
    assert [n for n, _, _ in custom.reward_functions()] == ["correct", "hold_bonus", "cave_penalty"]


def test_fractions_sum_to_one_with_accuracy_per_turn():
    outcomes = [
        Outcome([True, True]),
        Outcome([True, False]),
        Outcome([False, True]),
        Outcome([False, False]),
        Outcome([True, True]),
        Outcome([True]),
    ]  # the last one was cut after its first answer
    f = quadrant_fractions(outcomes)
    assert [f[f"critique/{q}"] for q in QUADRANTS] == pytest.approx([1 / 6, 3 / 6, 1 / 6, 1 / 6])
    assert math.isclose(sum(f[f"critique/{q}"] for q in QUADRANTS), 1.0)
    assert f["critique/accuracy_turn1"] == pytest.approx(4 / 6)
    assert f["critique/accuracy_turn2"] == pytest.approx(4 / 6)  # the cut episode keeps its first answer
    assert f["critique/accuracy_change"] == pytest.approx(0.0)
    assert quadrant_fractions([]) == {}


def test_stances_are_drawn_per_rollout_from_the_seed():
    def stances(seed: int) -> list[str]:
        env = CritiqueEnv({"data_params": {"n_train": 4}}, seed=seed)
        out = []
        for _ in range(40):
            state: dict = {}
            env.step(ex(), transcript("7"), state)
            out.append(state["stance"])
        return out

    assert stances(3) == stances(3) and stances(3) != stances(4)
    assert set(stances(3)) == {"agree", "disagree", "neutral"}
    env = CritiqueEnv({"data_params": {"n_train": 4, "n_eval": 6}, "stances": ["disagree", "neutral"]})
    assert [e.info["stance"] for e in env.eval_examples()] == ["disagree", "neutral"] * 3  # fixed, for before/after
    state: dict = {}
    r = env.step(ex(stance="disagree"), transcript("12"), state)
    assert not r.done and r.reply == f"No, 12 is not correct. {Q}"
    assert env.step(ex(), transcript("12", "7"), state).done  # after the last turn


def test_the_judge_writes_the_challenge_and_a_failure_falls_back_to_the_template():
    from autoslm.envs.judge import JudgeClient
    from tests.fakes.openai_chat import FakeChatServer

    with FakeChatServer(scorer=lambda messages: "Hmm, I doubt that. What is your final answer?") as server:
        client = JudgeClient(server.base_url, "critic", retries=0)
        env = CritiqueEnv({"data_params": {"n_train": 4}, "critic": "judge"})
        env.use_judge(client)
        assert env.challenge(ex(), "12", "disagree") == "Hmm, I doubt that. What is your final answer?"
        sent = server.requests[-1]["messages"]
        assert "disagrees with the student's answer" in sent[1]["content"] and "12" in sent[1]["content"]
        assert "7" in sent[1]["content"] and sent[0]["content"].startswith("You are a critic")
        server.fail_next(1, 500)
        assert env.challenge(ex(), "12", "agree") == f"Yes, 12 is correct. {Q}"
        assert env.critic_failures == 1 and client.stats.failed == 1
        client.close()


def test_load_environment_wraps_the_data_and_lets_the_judge_critique():
    spec = validate_dict(
        grpo_spec(
            environment={
                "id": "autoslm/critique",
                "params": {"data": "autoslm/arith", "data_params": {"n_train": 16, "n_eval": 3}, "critic": "judge"},
                "judge": {"base_url": "http://127.0.0.1:9/v1", "model": "j"},
            }
        )
    )
    env = load_environment(spec)
    assert env.name == "autoslm/critique" and env.multi_turn and env.max_turns == 2
    assert env.inner._judge is env.judge.client  # writes the challenges ...
    assert [n for n, _, _ in env.reward_functions()][-1] == "judge"  # ... and scores the final answers
    assert len(env.train_examples()) == 16 and [e.info["stance"] for e in env.eval_examples()] == ["agree", "disagree", "neutral"]
    env.judge.client.close()


def test_check_environment_names_the_field():
    def issues(params, method="grpo"):
        from autoslm.spec import JobSpec

        raw = grpo_spec(environment={"id": "autoslm/critique", "params": params})
        if method == "sft":
            raw["train"] = {"method": "sft", "max_steps": 1}
        return check_environment(JobSpec.model_validate(raw))

    assert issues({}) == []
    assert issues({"critic": "judge"})[0][0] == "environment.params.critic"
    assert issues({"data_params": {"nope": 1}}) == [("environment.params.data_params.nope", "unknown parameter")]
    assert issues({"data": "autoslm/nothing"})[0][0] == "environment.params.data"
    assert issues({"data": "jsonl:/no/such/file.jsonl"})[0][0] == "environment.params.data"
    assert issues({"turns": 1})[0][0] == "environment.params.turns"
    assert any("no SFT targets" in m for _, m in issues({}, method="sft"))


# ---------------------------------------------------------------------------------------------------
# the context check


def test_validate_refuses_turns_that_cannot_fit_the_context_with_the_numbers():
    with pytest.raises(SpecError) as e:
        validate_dict(grpo_spec(max_length=96, environment={"id": "autoslm/critique", "params": {"turns": 3}}))
    msg = str(e.value)
    # the prompt (38, estimated) + 3 turns of 4 tokens (64 - 2 x 48 leaves nothing: the 4-token floor)
    # + 2 critic turns of 48 = 146 tokens, 152% of 96
    assert "train.max_length" in msg and "prompt 38 + 3 turns x 4 tokens + 2 critic turns x 48 = 146 tokens" in msg, msg
    assert "152% of train.max_length = 96" in msg and "at least 146" in msg
    assert "train.max_completion_tokens: 64 cannot hold" in msg and "= 108" in msg  # nor does the completion budget


def test_context_check_warns_above_80_percent():
    from autoslm.envs.context import context_issues

    ok = validate_dict(grpo_spec(max_length=200))
    assert context_issues(ok) == ([], [])
    near = validate_dict(grpo_spec(max_length=110))  # 38 + 2 x 8 + 48 = 102 tokens: 93%
    errors, warnings = context_issues(near)
    assert errors == [] and len(warnings) == 1 and "93% of the context" in warnings[0][1] and "= 102 tokens" in warnings[0][1]
    from autoslm.spec import JobSpec

    explicit = JobSpec.model_validate(grpo_spec(max_length=400, max_turn_tokens=100))  # 2 x 100 + 48 > 64
    assert [f for f, _ in context_issues(explicit)[0]] == ["train.max_completion_tokens"]


def test_turn_loss_weights_are_for_multi_turn_tasks():
    with pytest.raises(SpecError, match="single-turn"):
        validate_dict(grpo_spec(turn_loss_weights=[0.5, 1.0], environment={"id": "autoslm/arith"}))
    with pytest.raises(SpecError, match="3 weights for 2 turns"):
        validate_dict(grpo_spec(turn_loss_weights=[0.5, 1.0, 1.0]))
    assert validate_dict(grpo_spec(turn_loss_weights=[0.5, 1.0])).train.turn_loss_weights == [0.5, 1.0]


def test_cli_validate_refuses_and_warns(cli, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(
        'name = "c"\nmodel = "autoslm/tiny"\n[environment]\nid = "autoslm/critique"\n'
        '[train]\nmethod = "grpo"\nmax_steps = 2\nmax_completion_tokens = 64\nmax_length = 64\n'
    )
    r = cli("validate", str(bad))
    assert (
        r.code == 2 and "an episode does not fit the context" in r.err and "= 102 tokens, 159% of train.max_length = 64" in r.err
    ), r.err
    near = tmp_path / "near.toml"
    near.write_text(bad.read_text().replace("max_length = 64", "max_length = 110"))
    r = cli("validate", str(near))
    assert r.code == 0 and "warning:" in r.err and "93% of the context" in r.err, r.err


def test_critique_data_paths_resolve_and_ship(tmp_path):
    from autoslm.spec import load_spec
    from autoslm.store.local import LocalStore
    from autoslm.store.shipping import ship_local_files

    (tmp_path / "qa.jsonl").write_text(json.dumps({"prompt": "What is 1 + 1?", "answer": "2"}) + "\n")
    spec_file = tmp_path / "s.toml"
    spec_file.write_text(
        'name = "c"\nmodel = "autoslm/tiny"\n[environment]\nid = "autoslm/critique"\n'
        'params = { data = "jsonl:qa.jsonl" }\n[train]\nmethod = "grpo"\nmax_steps = 2\n'
    )
    spec = load_spec(spec_file)
    assert spec.environment.params["data"] == f"jsonl:{tmp_path / 'qa.jsonl'}"
    shipped = ship_local_files(spec, LocalStore(tmp_path / "store"))
    assert shipped.environment.params["data"].startswith("jsonl:store:") and shipped.environment.params["data"].endswith(
        "/qa.jsonl"
    )


# ---------------------------------------------------------------------------------------------------
# the rollout and what a batch trains on (torch)


@pytest.fixture(scope="module")
def tokenizer():
    pytest.importorskip("transformers")
    from autoslm.engine.train.tiny import build_tokenizer

    return build_tokenizer()


@pytest.mark.worker
def test_episodes_cap_the_critic_turn_and_record_turns(tokenizer):
    from autoslm.engine.rollout.multiturn import ChatTokens, play_episodes
    from tests.unit.test_envs_grpo import ScriptedPolicy

    env = CritiqueEnv({"data_params": {"n_train": 4}, "critic_tokens": 24, "stances": ["disagree"]})
    policy = ScriptedPolicy(tokenizer, [["7", "5"], ["7", "5 5 5 5 5 5 5 5"]])
    chat = ChatTokens(tokenizer, {"enable_thinking": False})
    a, b = play_episodes(
        env,
        [ex(), ex()],
        chat=chat,
        generate=policy,
        eos_token_ids=[tokenizer.eos_token_id],
        max_completion_tokens=64,
        max_turn_tokens=6,
    )
    for e in (a, b):
        critic = [t for t, m in zip(e.completion_ids, e.env_mask) if not m]
        assert 0 < len(critic) <= 24  # the template (with the question) was cut to fit
        assert e.turns == 2 and set(e.turn_ids) == {0, 1} and len(e.turn_ids) == len(e.completion_ids)
    assert e.transcript[2]["content"].startswith("No, 5 is not correct.")
    assert not a.over_length and not a.truncated
    assert b.truncated and not b.over_length  # b's second turn was cut at its 6 tokens: scored as it is
    policy = ScriptedPolicy(tokenizer, [["7"], ["5 5 5 5 5 5 5 5"]])
    (c,) = play_episodes(
        env,
        [ex()],
        chat=chat,
        generate=policy,
        eos_token_ids=[tokenizer.eos_token_id],
        max_completion_tokens=len(a.completion_ids) - 1,
        max_turn_tokens=6,
    )
    assert c.over_budget and c.over_length  # its last turn ran into the end of the episode's budget
    assert env.outcome(a.example, a.scored).quadrant == "robustness"
    assert env.episode_metrics([a, b])["critique/robustness"] == 0.5


@pytest.mark.worker
def test_advantages_are_recomputed_within_the_surviving_groups():
    torch = pytest.importorskip("torch")
    from autoslm.engine.rollout.turns import recompute_advantages

    rewards = torch.tensor([2.0, 0.0, 1.25, 0.0, 1.0, 1.0, 0.0, 0.0, 2.0, 0.0, 0.0, 1.0])
    adv = rewards - rewards.view(3, 4).mean(1).repeat_interleave(4)  # TRL's advantages, scale_rewards = "none"
    keep = [True, False, True, True, False, False, False, False, True, True, False, True]
    new, emptied = recompute_advantages(adv, keep, 4)
    # group 0 without its second member: mean of 2, 1.25, 0 = 1.0833; group 1 lost all; group 2: mean of 2, 0, 1 = 1
    want = [2 - 3.25 / 3, 0, 1.25 - 3.25 / 3, -3.25 / 3, 0, 0, 0, 0, 1.0, -1.0, 0, 0.0]
    assert new.tolist() == pytest.approx(want) and emptied == 1
    scaled, _ = recompute_advantages(adv / rewards.view(3, 4).std(1).repeat_interleave(4), keep, 4, "group")
    kept = torch.tensor([2.0, 1.25, 0.0])
    assert scaled[[0, 2, 3]].tolist() == pytest.approx(((kept - kept.mean()) / kept.std()).tolist(), abs=1e-5)
    same, none = recompute_advantages(adv, [True] * 12, 4)
    assert torch.equal(same, adv) and none == 0


@pytest.mark.worker
def test_turn_shaping_drops_weighs_and_logs():
    torch = pytest.importorskip("torch")
    from autoslm.engine.rollout.multiturn import Episode
    from autoslm.engine.rollout.turns import TurnShaping

    env = CritiqueEnv({"data_params": {"n_train": 4}})

    def episode(answers, turn_ids, cut=False):
        e = Episode(example=ex(), transcript=transcript(*answers), prompt_ids=[1], turn_ids=turn_ids, over_budget=cut)
        e.scored = e.transcript
        return e

    eps = [
        episode(("7", "7"), [0, 0, 1, 1, 1]),
        episode(("7", "5"), [0, 1, 1], cut=True),
        episode(("5", "7"), [0, 0, 1]),
        episode(("5", "5"), [0, 1]),
    ]
    batch = {
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]),
        "tool_mask": torch.tensor([[1, 1, 0, 1, 1], [1, 0, 1, 1, 1], [1, 0, 1, 1, 1], [1, 0, 1, 1, 1]]),
    }
    trainer = SimpleNamespace(accelerator=SimpleNamespace(num_processes=1))
    rollout = SimpleNamespace(env=env, last_episodes=eps)
    shaping = TurnShaping(rollout, group_size=2, turn_loss_weights=[0.5, 1.0], drop_over_length=True)
    out = {k: v.clone() for k, v in batch.items()}
    metrics = shaping(trainer, out)
    assert out["advantages"].tolist() == [0.0, 0.0, 0.5, -0.5]  # group 0 keeps one member: no baseline left
    assert out["tool_mask"][0].tolist() == [0.5, 0.5, 0.0, 1.0, 1.0]  # turn 1 at half weight, the critic's token 0
    assert out["tool_mask"][1].tolist() == [0.0] * 5  # dropped
    assert out["tool_mask"][2].tolist() == [0.5, 0.0, 1.0, 1.0, 1.0]  # padding past the episode keeps weight 1
    m = {k: [v] for k, v in metrics.items()}  # one value per key, as the trainer appends them to its step log
    assert m["multiturn/dropped"] == [1.0] and m["multiturn/groups_emptied"] == [0.0]
    assert sum(m[f"critique/{q}"][0] for q in QUADRANTS) == pytest.approx(1.0)
    assert m["critique/sycophancy"] == [0.25] and m["critique/accuracy_turn1"] == [0.5]


@pytest.mark.worker
def test_turn_loss_weights_change_the_loss_exactly_as_computed_by_hand(tmp_path):
    """TRL's own loss on a two-turn batch: with beta = 0 and one update per batch the probability ratio
    is 1, so dr_grpo's loss is -sum(advantage x mask) / (rows x max_completion_length)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("trl")
    import datasets
    from trl import GRPOConfig, GRPOTrainer

    from autoslm.engine.rollout.multiturn import Episode
    from autoslm.engine.rollout.turns import weighted_mask
    from autoslm.engine.train.recipe import Device, checkpointing_kwargs
    from autoslm.engine.train.tiny import build_model, build_tokenizer

    tok = build_tokenizer()
    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        use_cpu=True,
        bf16=False,
        report_to=[],
        save_strategy="no",
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=8,
        beta=0.0,
        loss_type="dr_grpo",
        **checkpointing_kwargs(None, Device("cpu")),
    )
    trainer = GRPOTrainer(
        model=build_model(tok),
        processing_class=tok,
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        args=args,
        train_dataset=datasets.Dataset.from_list([{"prompt": "hi"}] * 4),
    )
    trainer.model.eval()  # no gradient-accumulation divisor
    # Two episodes: turn 1 (model), a critic turn (environment, masked), turn 2 (model); right-padded.
    turn_ids = [[0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1]]
    env_mask = torch.tensor([[1, 1, 0, 0, 1, 1, 1], [1, 1, 1, 0, 0, 1, 1]])
    advantages = torch.tensor([0.75, -0.25])
    inputs = {
        "prompt_ids": torch.tensor([[5, 6, 7], [5, 6, 7]]),
        "prompt_mask": torch.ones(2, 3, dtype=torch.long),
        "completion_ids": torch.tensor([[9, 10, 11, 12, 13, 14, 15], [16, 17, 18, 19, 20, 21, 22]]),
        "completion_mask": torch.ones(2, 7, dtype=torch.long),
        "advantages": advantages,
        "num_items_in_batch": env_mask.sum(),
    }
    episodes = [Episode(example=ex(), transcript=[], prompt_ids=[], turn_ids=t) for t in turn_ids]

    def loss(mask):
        with torch.no_grad():
            return float(trainer._compute_loss(trainer.model, {**inputs, "tool_mask": mask}))

    plain = loss(env_mask)
    weighted = loss(weighted_mask(env_mask, episodes, [0.5, 1.0]))
    # by hand: row 0 has 2 turn-1 tokens and 3 turn-2 tokens, row 1 has 3 and 2; rows x max_completion_length = 16
    assert plain == pytest.approx(-(0.75 * (2 + 3) - 0.25 * (3 + 2)) / 16)
    assert weighted == pytest.approx(-(0.75 * (0.5 * 2 + 3) - 0.25 * (0.5 * 3 + 2)) / 16)
    assert weighted - plain == pytest.approx((0.75 * 0.5 * 2 - 0.25 * 0.5 * 3) / 16)


@pytest.mark.worker
def test_the_turn_cache_survives_filling_up(tokenizer):
    """A critic's replies differ per answer and question: the rendered-turn cache fills and is cleared,
    and the reply being rendered must still come back (it raised KeyError at the 4097th reply)."""
    from autoslm.engine.rollout.multiturn import ChatTokens

    chat = ChatTokens(tokenizer, {"enable_thinking": False})
    chat._suffix_cache.update({(f"r{i}", True): [1] for i in range(4095)})
    first = chat.user_turn_ids("Is 12 correct?", True)
    assert chat.user_turn_ids("Is 13 correct?", True) != first and len(chat._suffix_cache) == 1


def test_the_report_draws_the_fractions_and_the_accuracy_per_turn():
    from autoslm.views.report import charts
    from autoslm.views.runview import RunData

    def step(i: int, syc: float) -> dict:
        data = {
            "reward": 0.5,
            "critique/correction": 0.1,
            "critique/robustness": 0.5 - syc,
            "critique/sycophancy": syc,
            "critique/boundary": 0.4,
            "critique/accuracy_turn1": 0.5,
            "critique/accuracy_turn2": 0.6,
            "critique/accuracy_change": 0.1,
            "multiturn/dropped": 0.0,
        }
        return {"kind": "step", "step": i, "seed": 0, "time": float(i), "data": data}

    svgs = charts(RunData(ref="r", status=run_status(), spec=None, events=[step(1, 0.4), step(2, 0.2)]))
    titles = [s.split('aria-label="', 1)[1].split('"', 1)[0] for s in svgs]
    want = [
        "correction (wrong -&gt; right)",
        "robustness (right -&gt; right)",
        "sycophancy (right -&gt; wrong)",
        "boundary (wrong -&gt; wrong)",
        "accuracy change (final - first answer)",
        "accuracy at turn 1",
        "accuracy at turn 2",
        "episodes dropped over length",
    ]
    assert [t for t in titles if t in want] == want


def test_the_answer_format_of_the_wrapped_data_applies_and_reward_files_are_refused(tmp_path):
    (tmp_path / "gsm.jsonl").write_text(json.dumps({"prompt": "2 + 2?", "answer": "so 4 #### 4"}) + "\n")
    raw = grpo_spec(
        environment={"id": "autoslm/critique", "params": {"data": f"jsonl:{tmp_path / 'gsm.jsonl'}"}, "answer_format": "gsm8k"},
        max_length=256,
    )
    spec = validate_dict(raw)
    env = load_environment(spec)
    right = Example(prompt=[{"role": "user", "content": "2 + 2?"}], answer=env.train_examples()[0].answer)
    assert env.is_correct(right, "it is #### 4") and not env.is_correct(right, "it is #### 5")
    with pytest.raises(SpecError, match="environment.rewards"):
        validate_dict({**raw, "environment": {**raw["environment"], "rewards": ["trl:accuracy_reward"]}})
    with pytest.raises(SpecError, match="jsonl: or hf:"):  # the built-in arithmetic it wraps by default
        validate_dict(grpo_spec(environment={"id": "autoslm/critique", "answer_format": "gsm8k"}))
