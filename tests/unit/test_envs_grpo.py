"""GRPO environments: the calculator tool task, the guessing game and its multi-turn rollout, verifiers."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from autoslm.engine.rollout.multiturn import ChatTokens, MultiTurnRollout, episodes_to_rollout, play_episodes
from autoslm.engine.rollout.rewards import build_reward_set, rows_from_examples
from autoslm.engine.train.recipe import Device, checkpointing_kwargs
from autoslm.envs.base import Example
from autoslm.envs.guess import CORRECT, HIGHER, LOWER, GuessEnv, parse_guess
from autoslm.envs.tools_task import CalcToolEnv, calculator, called_calculator
from autoslm.envs.verifiers_adapter import VerifiersEnv, check_verifiers, module_name
from autoslm.errors import FatalWorkerError

pytestmark = pytest.mark.worker  # also runs on the worker image's pins (make test-image)


def no_checkpointing() -> dict:
    """The option's name differs between transformers 5.17 (the image) and 5.2x: ask the recipe for it.
    Asked by the tests that build a trainer, not at import: collecting this module imports no transformers."""
    return checkpointing_kwargs(None, Device("cpu"))


# ---------------------------------------------------------------------------------------------------
# calculator tool task


@pytest.mark.parametrize(
    "expr,want",
    [
        ("12 * (3 + 4)", "84"),
        ("7 / 2", "3.5"),
        ("2^10", "1024"),
        ("-3 + 1", "-2"),
        ("10 // 3", "3"),
        ("10 % 4", "2"),
        ("1.5 * 2", "3"),
        ("3 × 4", "12"),
    ],
)
def test_calculator(expr, want):
    assert calculator(expr) == want


@pytest.mark.parametrize(
    "expr",
    [
        '__import__("os").system("true")',
        "open('x')",
        "a + 1",
        "(1).real",
        "[1, 2]",
        "lambda: 1",
        "2 ** 1000",
        "9 ** 9 ** 9",
        "1 / 0",
        "",
        "x" * 300,
        "1e308 * 10",
    ],
)
def test_calculator_refuses_anything_but_arithmetic(expr):
    with pytest.raises(ValueError):
        calculator(expr)


def test_calc_tool_env_is_deterministic_with_disjoint_splits():
    a, b = CalcToolEnv({"n_train": 50, "n_eval": 10}, seed=0), CalcToolEnv({"n_train": 50, "n_eval": 10}, seed=7)
    assert [e.prompt for e in a.train_examples()] == [e.prompt for e in b.train_examples()]
    train = {e.prompt[0]["content"] for e in a.train_examples()}
    assert len(a.eval_examples()) == 10 and not train & {e.prompt[0]["content"] for e in a.eval_examples()}
    ex = a.train_examples()[0]
    assert calculator(ex.info["expression"]) == ex.answer
    # SFT learns the call, in the Qwen3 tool-call format, that computes the answer.
    call = json.loads(ex.target.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
    assert call == {"name": "calculator", "arguments": {"expression": ex.info["expression"]}}
    assert a.tools() == [calculator]
    with pytest.raises(ValidationError):
        CalcToolEnv({"n_train": 0})
    with pytest.raises(ValidationError):
        CalcToolEnv({"unknown": 1})


def test_calculator_schema_for_trl():
    utils = pytest.importorskip("transformers.utils")
    schema = utils.get_json_schema(calculator)
    assert schema["function"]["name"] == "calculator"
    assert schema["function"]["parameters"]["properties"]["expression"]["type"] == "string"


def test_calc_tool_rewards_answer_and_tool_call():
    env = CalcToolEnv({"n_train": 5, "n_eval": 0, "tool_bonus": 0.2})
    ex = env.train_examples()[0]
    rs = build_reward_set(env, thinking=False)
    assert rs.names == ["correct", "tool_use"] and rs.weights == [1.0, 0.2]
    with_tool = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "calculator", "arguments": {"expression": ex.info["expression"]}}}
            ],
        },
        {"role": "tool", "name": "calculator", "content": ex.answer},
        {"role": "assistant", "content": f"The answer is {ex.answer}"},
    ]
    without = [{"role": "assistant", "content": "12345678"}]
    rows = rows_from_examples([ex, ex])
    cols = {k: [r[k] for r in rows] for k in ("answer", "info")}
    prompts = [ex.prompt, ex.prompt]
    assert rs.funcs[0](prompts=prompts, completions=[with_tool, without], **cols) == [1.0, 0.0]
    assert rs.funcs[1](prompts=prompts, completions=[with_tool, without], **cols) == [1.0, 0.0]
    assert called_calculator([{"role": "assistant", "content": '<tool_call>{"name": "calculator", "arguments": {}}</tool_call>'}])
    assert (
        CalcToolEnv({"tool_bonus": 0}).reward_functions()[0][0] == "correct"
        and len(CalcToolEnv({"tool_bonus": 0}).reward_functions()) == 1
    )


# ---------------------------------------------------------------------------------------------------
# guessing game


def test_guess_env_plays_by_the_rules():
    env = GuessEnv({"n_train": 20, "n_eval": 5, "max_number": 50, "max_turns": 3})
    assert env.multi_turn and env.max_turns == 3
    assert [e.answer for e in env.train_examples()] == [
        e.answer for e in GuessEnv({"n_train": 20, "max_number": 50, "max_turns": 3}, seed=9).train_examples()
    ]
    ex = Example(prompt=[{"role": "user", "content": "go"}], answer="30")
    msgs, state = list(ex.prompt), {}
    msgs.append({"role": "assistant", "content": "25"})
    r = env.step(ex, msgs, state)
    assert (r.reply, r.done) == (HIGHER, False)
    msgs += [{"role": "user", "content": r.reply}, {"role": "assistant", "content": "I guess 40"}]
    r = env.step(ex, msgs, state)
    assert (r.reply, r.done) == (LOWER, False)
    msgs += [{"role": "user", "content": r.reply}, {"role": "assistant", "content": "30"}]
    r = env.step(ex, msgs, state)
    assert (r.reply, r.done) == (CORRECT, True) and r.reward == pytest.approx(1 + 0.5 * (1 / 3))
    msgs.append({"role": "user", "content": r.reply})
    assert env.outcome(ex, msgs) == (True, 3)
    assert env.reward_messages(ex, msgs) == pytest.approx(r.reward)
    # out of turns
    state = {}
    for _ in range(3):
        r = env.step(ex, [*ex.prompt, {"role": "assistant", "content": "no idea"}], state)
    assert r.done and r.reward == 0.0 and "number" in r.reply
    assert parse_guess("maybe 12 or 13") == 13 and parse_guess("none") is None


def test_guess_rewards_from_transcript_column():
    env = GuessEnv({"n_train": 2, "max_turns": 4, "speed_weight": 0.5})
    ex = Example(prompt=[{"role": "user", "content": "go"}], answer="7")
    rs = build_reward_set(env, thinking=True)
    assert rs.names == ["solved", "speed"] and rs.weights == [1.0, 0.5]
    won = [
        *ex.prompt,
        {"role": "assistant", "content": "<think>mid</think>5"},
        {"role": "user", "content": HIGHER},
        {"role": "assistant", "content": "<think>x</think>7"},
        {"role": "user", "content": CORRECT},
    ]
    lost = [*ex.prompt, {"role": "assistant", "content": "<think>7 never closed"}]
    row = rows_from_examples([ex])[0]
    kw = dict(
        prompts=[ex.prompt] * 2,
        completions=["decoded", "decoded"],
        answer=[row["answer"]] * 2,
        info=[row["info"]] * 2,
        transcript=[won, lost],
    )
    assert rs.funcs[0](**kw) == [1.0, 0.0]
    assert rs.funcs[1](**kw) == [pytest.approx(3 / 4), 0.0]


# ---------------------------------------------------------------------------------------------------
# multi-turn rollout: real tokenizer, scripted policy


@pytest.fixture(scope="module")
def tokenizer():
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from autoslm.engine.train.tiny import build_tokenizer

    return build_tokenizer()


class ScriptedPolicy:
    """Replies with the next scripted text for each context, ending the turn with EOS (or not)."""

    def __init__(self, tok, replies: list[list[str]], stop: bool = True):
        self.tok, self.replies, self.stop = tok, replies, stop
        self.turn = 0
        self.contexts: list[list[list[int]]] = []

    def __call__(self, contexts, max_new_tokens):
        self.contexts.append([list(c) for c in contexts])
        out = []
        for i, _ in enumerate(contexts):
            ids = self.tok(self.replies[self.turn][i], add_special_tokens=False)["input_ids"]
            if self.stop:
                ids = ids + [self.tok.eos_token_id]
            ids = ids[:max_new_tokens]
            out.append((ids, [-0.5] * len(ids)))
        self.turn += 1
        return out


def test_play_episodes_masks_environment_tokens(tokenizer):
    env = GuessEnv({"n_train": 2, "max_number": 10, "max_turns": 3})
    a = Example(prompt=[{"role": "user", "content": "go"}], answer="4")
    b = Example(prompt=[{"role": "user", "content": "go"}], answer="9")
    policy = ScriptedPolicy(tokenizer, [["5", "5"], ["4", "8"], ["-", "9"]])
    chat = ChatTokens(tokenizer, {"enable_thinking": False})
    eps = play_episodes(
        env, [a, b], chat=chat, generate=policy, eos_token_ids=[tokenizer.eos_token_id], max_completion_tokens=200
    )
    ea, eb = eps
    assert (ea.turns, ea.done, ea.reward) == (2, True, pytest.approx(1 + 0.5 * 2 / 3))
    assert (eb.turns, eb.done) == (3, True)
    assert [m["content"] for m in ea.transcript] == ["go", "5", LOWER, "4", CORRECT]
    assert len(policy.contexts[1]) == 2 and len(policy.contexts[2]) == 1  # finished episodes stop generating
    for e in eps:
        assert len(e.completion_ids) == len(e.env_mask) == len(e.logprobs)
        model_text = tokenizer.decode([t for t, m in zip(e.completion_ids, e.env_mask) if m])
        env_text = tokenizer.decode([t for t, m in zip(e.completion_ids, e.env_mask) if not m])
        assert "lower" not in model_text and "higher" not in model_text
        assert "lower" in env_text or "higher" in env_text
        assert all(lp == 0.0 for lp, m in zip(e.logprobs, e.env_mask) if not m)
        assert e.completion_ids[-1] == tokenizer.eos_token_id  # ends on the model's own EOS: not "truncated"
    # the second turn's context is the prompt, the model's turn and the environment's reply, as the template renders them
    ctx = tokenizer.decode(policy.contexts[1][0])
    assert ctx.endswith("<|im_start|>user\nlower<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    out = episodes_to_rollout(eps)
    assert set(out) >= {"prompt_ids", "completion_ids", "logprobs", "env_mask", "transcript"}


def test_play_episodes_respects_the_token_budget(tokenizer):
    env = GuessEnv({"n_train": 1, "max_number": 10, "max_turns": 8})
    ex = Example(prompt=[{"role": "user", "content": "go"}], answer="4")
    policy = ScriptedPolicy(tokenizer, [["1 2 3 5 6 7 8 9 10 1 2 3"]] * 8, stop=False)
    chat = ChatTokens(tokenizer, {})
    (e,) = play_episodes(
        env,
        [ex],
        chat=chat,
        generate=policy,
        eos_token_ids=[tokenizer.eos_token_id],
        max_completion_tokens=40,
        max_turn_tokens=10,
    )
    assert len(e.completion_ids) <= 40 and not e.done and e.out_of_tokens
    assert sum(e.env_mask) >= 10
    assert e.turns == len([m for m in e.transcript if m["role"] == "assistant"])


def test_play_episodes_strips_thinking_before_the_environment_sees_it(tokenizer):
    env = GuessEnv({"n_train": 1, "max_number": 10, "max_turns": 2})
    ex = Example(prompt=[{"role": "user", "content": "go"}], answer="4")
    policy = ScriptedPolicy(tokenizer, [["<think>4 is likely</think>7"], ["<think>hmm</think>4"]])
    (e,) = play_episodes(
        env,
        [ex],
        chat=ChatTokens(tokenizer, {"enable_thinking": True}),
        generate=policy,
        eos_token_ids=[tokenizer.eos_token_id],
        max_completion_tokens=200,
        thinking=True,
    )
    assert [m["content"] for m in e.transcript[1:]] == ["<think>4 is likely</think>7", LOWER, "<think>hmm</think>4", CORRECT]


def test_rollout_func_finds_examples_from_captured_rows(tokenizer):
    env = GuessEnv({"n_train": 2, "max_number": 10, "max_turns": 2})
    exs = [
        Example(prompt=[{"role": "user", "content": "go"}], answer="3"),
        Example(prompt=[{"role": "user", "content": "go"}], answer="6"),
    ]
    rows = rows_from_examples(exs)
    rows = [rows[0], rows[0], rows[1], rows[1]]  # TRL repeats each prompt group_size times
    policy = ScriptedPolicy(tokenizer, [["3", "1", "6", "1"], ["2", "2"]])
    rollout = MultiTurnRollout(env, generate_factory=lambda trainer: policy)
    trainer = SimpleNamespace(
        processing_class=tokenizer,
        eos_token_ids=[tokenizer.eos_token_id],
        max_completion_length=64,
        chat_template_kwargs={"enable_thinking": False},
        autoslm_rows=rows,
    )
    out = rollout([r["prompt"] for r in rows], trainer)
    assert len(out["completion_ids"]) == 4 and out["turns"] == [1, 2, 1, 2]
    rs = build_reward_set(env, thinking=False)
    cols = {"answer": [r["answer"] for r in rows], "info": [r["info"] for r in rows], "transcript": out["transcript"]}
    assert rs.funcs[0](prompts=[r["prompt"] for r in rows], completions=["x"] * 4, **cols) == [1.0, 0.0, 1.0, 0.0]
    assert len(rollout.last_episodes) == 4
    # without captured rows identical prompts cannot be told apart
    trainer.autoslm_rows = None
    with pytest.raises(RuntimeError, match="AutoslmGRPOTrainer"):
        MultiTurnRollout(env, examples=exs, generate_factory=lambda t: policy)([r["prompt"] for r in rows], trainer)


def test_grpo_trainer_runs_the_guessing_game(tmp_path):
    """One real TRL GRPO step with the tiny model: multi-turn rollout, env mask, transcript rewards."""
    pytest.importorskip("trl")
    import datasets
    from peft import LoraConfig
    from trl import GRPOConfig

    from autoslm.engine.train.tiny import build_model, build_tokenizer
    from autoslm.engine.train.trainer import AutoslmGRPOTrainer
    from autoslm.recipes.batching import plan_grpo_batches
    from autoslm.recipes.grpo import GRPOTrain

    tok = build_tokenizer()
    model = build_model(tok)
    env = GuessEnv({"n_train": 8, "n_eval": 0, "max_number": 5, "max_turns": 3})
    plan = plan_grpo_batches(GRPOTrain(prompts_per_step=2, group_size=3, micro_batch_size=3))
    rewards = build_reward_set(env, thinking=False)
    rollout = MultiTurnRollout(env, max_turn_tokens=6)
    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        learning_rate=1e-3,
        use_cpu=True,
        bf16=False,
        **no_checkpointing(),
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        max_completion_length=64,
        chat_template_kwargs={"enable_thinking": False},
        seed=0,
        **plan.grpo_config_kwargs(),
        **rewards.grpo_config_kwargs(),
    )
    trainer = AutoslmGRPOTrainer(
        model=model,
        processing_class=tok,
        reward_funcs=rewards.funcs,
        args=args,
        train_dataset=datasets.Dataset.from_list(rows_from_examples(env.train_examples())),
        rollout_func=rollout,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    trainer.train()
    eps = rollout.last_episodes
    assert len(eps) == plan.per_device_train_batch_size * plan.steps_per_generation
    assert all(len(e.completion_ids) <= 64 for e in eps)
    assert any(0 in e.env_mask for e in eps)  # some episodes went past the first turn
    logged = trainer.state.log_history[0]
    assert "rewards/solved/mean" in logged and "rewards/speed/mean" in logged
    # completion lengths count only the model's tokens
    model_tokens = [sum(e.env_mask) for e in eps]
    assert logged["completions/max_length"] == max(model_tokens)


# ---------------------------------------------------------------------------------------------------
# verifiers


def test_check_verifiers_says_what_to_install():
    none = lambda name: None  # noqa: E731
    msg = check_verifiers("primeintellect/gsm8k-env", find_spec=none)
    assert "pip install verifiers" in msg and "primeintellect/gsm8k-env" in msg and "\n" not in msg
    only_vf = lambda name: object() if name == "verifiers" else None  # noqa: E731
    msg = check_verifiers("primeintellect/gsm8k-env", find_spec=only_vf)
    assert "gsm8k_env" in msg and "prime env install primeintellect/gsm8k-env" in msg
    assert check_verifiers("primeintellect/gsm8k-env", find_spec=lambda name: object()) is None
    assert "owner/name" in check_verifiers("nope", find_spec=none)
    assert module_name("will/wordle-nothink") == "wordle_nothink"


class FakeRubric:
    def __init__(self):
        self.parser = SimpleNamespace(parse_answer=lambda completion: completion[-1]["content"].strip())

        def exact(completion, answer, parser, **kwargs):
            return 1.0 if parser.parse_answer(completion) == answer else 0.0

        async def has_info(completion, info):
            await asyncio.sleep(0)
            return 1.0 if info.get("level") == 1 else 0.0

        def broken(completion):
            raise RuntimeError("bug in the environment")

        def group(completions, answers):
            return [0.0 for _ in completions]

        self.funcs = [exact, has_info, broken, group]
        self.weights = [1.0, 0.5, 0.1, 1.0]
        self.class_objects = {"parser": self.parser}


class SingleTurnEnv:
    system_prompt = "Answer briefly."
    few_shot = None

    def __init__(self):
        self.rubric = FakeRubric()
        self.parser = self.rubric.parser

    def get_dataset(self):
        return [
            {"question": "2+2?", "answer": "4", "info": {"level": 1}, "task": "math"},
            {"prompt": [{"role": "user", "content": "3+3?"}], "answer": "6", "info": {}, "task": "math"},
        ]

    def get_eval_dataset(self):
        return [{"question": "1+1?", "answer": "2"}]


class MultiTurnEnv:
    pass


class WordleEnv(MultiTurnEnv):
    pass


def test_verifiers_env_adapts_dataset_and_rubric():
    loaded = {}

    def loader(env_id, params):
        loaded.update(env_id=env_id, params=params)
        return SingleTurnEnv()

    env = VerifiersEnv("someone/arith-env", {"num_train_examples": 2}, loader=loader)
    assert loaded == {"env_id": "someone/arith-env", "params": {"num_train_examples": 2}}
    train = env.train_examples()
    assert train[0].prompt == [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "2+2?"}]
    assert train[1].prompt == [{"role": "user", "content": "3+3?"}] and train[1].answer == "6"
    assert env.eval_examples()[0].answer == "2"
    rs = build_reward_set(env, thinking=True)
    assert rs.names == ["exact", "has_info", "broken"] and rs.weights == [1.0, 0.5, 0.1]  # the group function is skipped
    rows = rows_from_examples(train)
    cols = {k: [r[k] for r in rows] for k in ("answer", "info")}
    completions = [[{"role": "assistant", "content": "<think>2+2</think> 4"}], [{"role": "assistant", "content": "7"}]]
    prompts = [r["prompt"] for r in rows]
    assert rs.funcs[0](prompts=prompts, completions=completions, **cols) == [1.0, 0.0]
    assert rs.funcs[1](prompts=prompts, completions=completions, **cols) == [1.0, 0.0]
    assert rs.funcs[2](prompts=prompts, completions=completions, **cols) == [0.0, 0.0]  # a failing function scores 0
    assert env.reward(train[0], "4") == pytest.approx((1.0 + 0.5 * 1.0) / 1.6)


def test_verifiers_refuses_custom_multi_turn_and_reports_load_errors():
    with pytest.raises(FatalWorkerError, match="multi-turn"):
        VerifiersEnv("someone/wordle", {}, loader=lambda i, p: WordleEnv())

    def failing(env_id, params):
        raise ValueError("unknown argument foo")

    with pytest.raises(FatalWorkerError, match="unknown argument foo"):
        VerifiersEnv("someone/x", {"foo": 1}, loader=failing)
    with pytest.raises(FatalWorkerError, match="pip install verifiers"):
        VerifiersEnv("someone/x", {}, find_spec=lambda name: None)


def test_grpo_trainer_runs_the_calculator_task_with_tools(tmp_path):
    """One real TRL GRPO step with tools=[calculator]: completions arrive as parsed messages."""
    pytest.importorskip("trl")
    import datasets
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from autoslm.engine.train.tiny import build_model, build_tokenizer
    from autoslm.recipes.batching import plan_grpo_batches
    from autoslm.recipes.grpo import GRPOTrain

    tok = build_tokenizer()
    env = CalcToolEnv({"n_train": 8, "n_eval": 0, "max_operand": 20})
    plan = plan_grpo_batches(GRPOTrain(prompts_per_step=2, group_size=2))
    rewards = build_reward_set(env, thinking=False)
    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        use_cpu=True,
        bf16=False,
        **no_checkpointing(),
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        max_completion_length=16,
        chat_template_kwargs={"enable_thinking": False},
        **plan.grpo_config_kwargs(),
        **rewards.grpo_config_kwargs(),
    )
    trainer = GRPOTrainer(
        model=build_model(tok),
        processing_class=tok,
        reward_funcs=rewards.funcs,
        args=args,
        tools=env.tools(),
        train_dataset=datasets.Dataset.from_list(rows_from_examples(env.train_examples())),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    trainer.train()
    logged = trainer.state.log_history[0]
    assert "rewards/correct/mean" in logged and "rewards/tool_use/mean" in logged
    assert len(rewards.log.last["correct"]) == plan.completions_per_step


def test_evaluate_episodes_with_a_plain_model():
    pytest.importorskip("transformers")
    from autoslm.engine.rollout.multiturn import evaluate_episodes
    from autoslm.engine.train.tiny import build_model, build_tokenizer

    tok = build_tokenizer()
    env = GuessEnv({"n_train": 1, "n_eval": 3, "max_number": 5, "max_turns": 2})
    score, eps = evaluate_episodes(
        env, env.eval_examples(), build_model(tok), tok, thinking=False, max_completion_tokens=40, max_turn_tokens=8
    )
    assert score is not None and 0.0 <= score <= 1.5 and len(eps) == 3
    assert all(1 <= e.turns <= 2 and len(e.completion_ids) <= 40 for e in eps)
    assert evaluate_episodes(env, [], None, tok, thinking=False, max_completion_tokens=8) == (None, [])


def test_a_turn_asks_for_no_more_than_its_share_the_budget_and_the_context_leave(tokenizer):
    from autoslm.engine.rollout.multiturn import Episode, turn_budget

    ep = Episode(example=Example(prompt=[]), transcript=[], prompt_ids=[0] * 26, completion_ids=[0] * 50)
    assert turn_budget(8, 64, ep) == 8  # the turn's share
    assert turn_budget(32, 64, ep) == 14  # what the episode's budget has left
    assert turn_budget(32, 256, ep, max_context=96) == 20  # what the context has left
    assert turn_budget(8, 256, ep, max_context=76) == 0  # a full context leaves nothing, never less

    # A long first turn fills the context: the next turn's context would not fit, so the episode ends
    # there, and no call asks for more than the room its contexts have.
    env = GuessEnv({"n_train": 1, "max_number": 10, "max_turns": 3})
    ex = Example(prompt=[{"role": "user", "content": "go"}], answer="4")
    asked = []

    seven = tokenizer("7", add_special_tokens=False)["input_ids"][0]

    def policy(contexts, max_new_tokens):  # a turn that never ends by itself
        asked.append((max(map(len, contexts)), max_new_tokens))
        return [([seven] * max_new_tokens, [-0.5] * max_new_tokens) for _ in contexts]

    chat = ChatTokens(tokenizer, {"enable_thinking": False})
    prompt = len(chat.prompt_ids(ex.prompt))
    (e,) = play_episodes(
        env,
        [ex],
        chat=chat,
        generate=policy,
        eos_token_ids=[tokenizer.eos_token_id],
        max_completion_tokens=256,
        thinking=False,
        max_context=prompt + 40,
    )
    assert (
        asked == [(prompt, 40)] and e.turns == 1 and e.out_of_tokens and len(e.prompt_ids) + len(e.completion_ids) <= prompt + 40
    )
    # A prompt that fills the context plays no turn at all.
    asked.clear()
    (e,) = play_episodes(
        env,
        [ex],
        chat=chat,
        generate=policy,
        eos_token_ids=[tokenizer.eos_token_id],
        max_completion_tokens=256,
        max_context=prompt,
    )
    assert asked == [] and e.turns == 0 and e.out_of_tokens


def test_held_out_episodes_keep_to_training_budget_and_the_context():
    """jobspecs/quickstart-critique.toml: training gives each of 2 turns 8 tokens of a 64-token episode,
    in a context of 128 (train.max_length, vLLM's max_model_len); its held-out episodes get the same."""
    from pathlib import Path

    from autoslm.engine.rollout.evaluate import episode_limits
    from autoslm.envs.critique import CritiqueEnv
    from autoslm.spec import parse_spec

    text = Path(__file__).resolve().parents[2].joinpath("jobspecs/quickstart-critique.toml").read_text()
    spec = parse_spec(text.replace('init_from_adapter = "quickstart"', ""))
    env = CritiqueEnv(dict(spec.environment.params), seed=0)
    assert episode_limits(spec, env) == {"max_completion_tokens": 64, "max_turn_tokens": 8, "max_context": 128}
    assert (
        episode_limits(
            spec.model_copy(
                update={
                    "train": spec.train.model_copy(update={"vllm": spec.train.vllm.model_copy(update={"max_model_len": 256})})
                }
            ),
            env,
        )["max_context"]
        == 256
    )
