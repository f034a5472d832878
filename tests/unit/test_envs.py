"""Built-in arithmetic task and jsonl datasets."""

from __future__ import annotations

import json

import pytest

from autoslm.envs.arith import ArithEnv, last_number
from autoslm.envs.jsonl import JsonlEnv
from autoslm.errors import FatalWorkerError


def test_arith_splits_are_disjoint_and_fixed():
    env = ArithEnv({"n_train": 300, "n_eval": 20}, seed=0)
    train = {ex.prompt[0]["content"] for ex in env.train_examples()}
    evals = {ex.prompt[0]["content"] for ex in env.eval_examples()}
    assert len(env.eval_examples()) == 20 and not train & evals
    again = ArithEnv({"n_train": 300, "n_eval": 20}, seed=7)  # replicates see the same data
    assert [e.prompt for e in again.eval_examples()] == [e.prompt for e in env.eval_examples()]


def test_arith_reward_checks_the_last_number():
    env = ArithEnv({"ops": ["*"], "max_operand": 5}, seed=0)
    ex = env.eval_examples()[0]
    assert env.reward(ex, f"The answer is {ex.answer}") == 1.0
    assert env.reward(ex, f"{ex.answer} no wait 999") == 0.0
    assert env.reward(ex, "") == 0.0
    assert last_number("a -3 b 12") == "12"


def test_jsonl_prompt_answer_and_messages_rows(tmp_path):
    path = tmp_path / "d.jsonl"
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(9)] + [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    env = JsonlEnv(path, {"eval_fraction": 0.2})
    assert len(env.train_examples()) == 8 and len(env.eval_examples()) == 2
    last = env.eval_examples()[-1]
    assert last.prompt == [{"role": "user", "content": "hi"}] and last.target == "hello"
    first = env.train_examples()[3]
    assert env.reward(first, "it is 3") == 1.0 and env.reward(first, "4") == 0.0
    assert env.reward(last, " Hello. ") == 1.0


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json\n", "not valid JSON"),
        ('{"messages": [{"role": "user", "content": "y"}]}\n', "no assistant turn"),
        ('{"text": "x"}\n', 'missing column "messages" (or "prompt")'),
        ("\n", "no rows"),
    ],
)
def test_jsonl_bad_rows_are_fatal_with_line_numbers(tmp_path, content, message):
    path = tmp_path / "d.jsonl"
    path.write_text(content)
    with pytest.raises(FatalWorkerError) as e:
        JsonlEnv(path, {})
    assert message in str(e.value)
