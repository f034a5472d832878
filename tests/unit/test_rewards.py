"""Thinking handling, TRL reward functions built from environments, and group statistics."""

from __future__ import annotations

import json
import math

import pytest

from autoslm.engine.rollout.rewards import (
    build_reward_set,
    example_from_row,
    group_stats,
    groups_to_keep,
    keep_mask,
    rows_from_examples,
)
from autoslm.engine.rollout.thinking import strip_thinking, thinking_text, thinking_tokens
from autoslm.envs.base import Environment, Example

pytestmark = pytest.mark.worker  # also runs on the worker image's pins (make test-image)


@pytest.mark.parametrize(
    "text,thinking,want",
    [
        ("42", False, "42"),
        ("<think>hmm</think>42", False, "<think>hmm</think>42"),
        ("<think>hmm</think>\n\n42", True, "42"),
        ("<think>a</think>x<think>b</think> 7", True, "7"),
        ("<think>still thinking 42", True, None),
        ("no tags 42", True, "no tags 42"),
        ("prompt opened it</think>\n42", True, "42"),
        ("", True, ""),
        (None, True, None),
    ],
)
def test_strip_thinking(text, thinking, want):
    assert strip_thinking(text, thinking) == want


def test_strip_thinking_when_the_template_opens_the_block():
    assert strip_thinking("all thought, no close", True, opened_in_prompt=True) is None
    assert strip_thinking("thought</think>answer", True, opened_in_prompt=True) == "answer"


def test_thinking_text_and_tokens():
    assert thinking_text("<think>abcd</think>x") == "abcd"
    assert thinking_text("<think>ab</think>x<think>cd</think>y") == "abcd"
    assert thinking_text("<think>unclosed rest") == "unclosed rest"
    assert thinking_text("opened in prompt</think>answer") == "opened in prompt"
    assert thinking_text("plain") == ""
    assert thinking_tokens("<think>" + "x" * 400 + "</think>ok") == 100
    assert thinking_tokens("<think>a b c</think>", count_tokens=lambda s: len(s.split())) == 3


def test_rows_round_trip():
    ex = Example(prompt=[{"role": "user", "content": "q"}], answer="7", target="7", info={"k": [1, 2], "nested": {"a": 1}})
    rows = rows_from_examples([ex, Example(prompt=[{"role": "user", "content": "r"}])])
    assert rows[0]["answer"] == "7" and rows[1]["answer"] == "" and rows[1]["example_index"] == 1
    assert isinstance(rows[0]["info"], str) and json.loads(rows[0]["info"]) == ex.info
    back = example_from_row(rows[0]["prompt"], rows[0]["answer"], rows[0]["info"])
    assert back.prompt == ex.prompt and back.answer == "7" and back.info == ex.info
    assert example_from_row(rows[1]["prompt"], "", "{}").answer is None
    # the rows build an Arrow dataset whatever the info dicts hold
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(rows)
    assert ds.column_names == ["prompt", "answer", "info", "example_index"]


class Exact(Environment):
    name = "exact"

    def reward(self, example, completion):
        return 1.0 if completion.strip() == example.answer else 0.0


class TwoFuncs(Exact):
    calls: list

    def __init__(self):
        self.calls = []

    def reward_functions(self):
        def short(example, text):
            return 1.0 if len(text) < 5 else 0.0

        def saw(example, messages):
            self.calls.append(messages)
            return float(len(messages))

        saw.takes_messages = True
        return [("correct", self.reward, 1.0), ("short", short, 0.25), ("correct", saw, 0.5)]


def _call(fn, completions, answers, prompts=None, **extra):
    prompts = prompts or [[{"role": "user", "content": "q"}]] * len(completions)
    return fn(
        prompts=prompts,
        completions=completions,
        completion_ids=[[1]] * len(completions),
        answer=answers,
        info=["{}"] * len(completions),
        **extra,
    )


def test_reward_functions_match_trl_signature_and_strip_thinking():
    rs = build_reward_set(Exact(), thinking=True)
    assert rs.names == ["correct"] and rs.grpo_config_kwargs() == {"reward_weights": [1.0]}
    fn = rs.funcs[0]
    assert fn.__name__ == "correct"
    completions = [
        [{"role": "assistant", "content": "<think>x</think>\n7"}],
        [{"role": "assistant", "content": "<think>7 forever"}],  # no answer: 0, not None
        [{"role": "assistant", "content": "8"}],
        [
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "thought",
            }
        ],
    ]
    assert _call(fn, completions, ["7", "7", "7", "7"]) == [1.0, 0.0, 0.0, 0.0]
    # plain strings (non-conversational datasets)
    assert _call(fn, ["<think>x</think>7", "7"], ["7", "7"], prompts=["q", "q"]) == [1.0, 1.0]
    assert rs.log.last["correct"] == [1.0, 1.0]


def test_thinking_off_keeps_the_text():
    fn = build_reward_set(Exact(), thinking=False).funcs[0]
    assert _call(fn, ["<think>x</think>7"], ["7"]) == [0.0]


def test_names_weights_and_messages_functions():
    env = TwoFuncs()
    rs = build_reward_set(env, thinking=False)
    assert rs.names == ["correct", "short", "correct_2"] and rs.weights == [1.0, 0.25, 0.5]
    out = _call(
        rs.funcs[2],
        [[{"role": "assistant", "content": "a"}, {"role": "tool", "content": "b"}, {"role": "assistant", "content": "c"}]],
        ["c"],
    )
    assert out == [4.0]  # user prompt + 3 completion messages
    assert env.calls[0][0] == {"role": "user", "content": "q"}
    # the last assistant message is the answer for text functions
    assert _call(
        rs.funcs[0],
        [[{"role": "assistant", "content": "a"}, {"role": "tool", "content": "b"}, {"role": "assistant", "content": "c"}]],
        ["c"],
    ) == [1.0]


def test_transcript_column_replaces_the_completion():
    env = TwoFuncs()
    fn = build_reward_set(env, thinking=True).funcs[2]
    transcript = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<think>t</think>1"},
        {"role": "user", "content": "higher"},
        {"role": "assistant", "content": "<think>t</think>2"},
    ]
    assert _call(fn, ["garbage decoded text"], ["2"], transcript=[transcript]) == [4.0]
    assert env.calls[-1][1]["content"] == "1" and env.calls[-1][3]["content"] == "2"


def test_thinking_length_penalty_is_coef_times_thinking_tokens_as_its_own_reward():
    rs = build_reward_set(Exact(), thinking=True, thinking_length_penalty=0.0005, count_tokens=lambda s: len(s))
    assert rs.names == ["correct", "thinking_length_penalty"] and rs.weights == [1.0, 1.0]
    pen = rs.funcs[1]
    vals = _call(pen, ["<think>" + "x" * 2000 + "</think>7", "7", "<think>" + "y" * 1000], ["7"] * 3)
    assert vals == pytest.approx([-1.0, 0.0, -0.5])  # 2000 and 1000 thinking tokens x 0.0005
    # The total TRL trains on: the correct answer's 1.0 less its thinking, the unclosed ramble 0 less its.
    correct = _call(rs.funcs[0], ["<think>" + "x" * 2000 + "</think>7", "7", "<think>" + "y" * 1000], ["7"] * 3)
    assert [c + p for c, p in zip(correct, vals)] == pytest.approx([0.0, 1.0, -0.5])
    assert build_reward_set(Exact(), thinking=False, thinking_length_penalty=0.5).names == ["correct"]


def test_stop_strings_cut_the_completion_before_scoring():
    fn = build_reward_set(Exact(), thinking=False, stop=["\nUser:"]).funcs[0]
    assert _call(fn, ["7\nUser: and then 8"], ["7"]) == [1.0]


class Batched:
    weight = 0.3

    def __init__(self):
        self.batches = []

    def __call__(self, example, text):
        raise AssertionError("the batch path must be used")

    def score_batch(self, examples, texts):
        self.batches.append(list(texts))
        return [0.5 for _ in texts]


def test_batch_scorers_are_called_once_per_batch_and_skip_missing_answers():
    judge = Batched()
    rs = build_reward_set(Exact(), thinking=True, judge=judge)
    assert rs.names == ["correct", "judge"] and rs.weights == [1.0, 0.3]
    assert _call(rs.funcs[1], ["<think>a</think>x", "<think>never closed", "y"], ["x"] * 3) == [0.5, 0.0, 0.5]
    assert judge.batches == [["x", "y"]]


def test_reward_log_drains_means():
    rs = build_reward_set(Exact(), thinking=False)
    _call(rs.funcs[0], ["7", "8"], ["7", "7"])
    _call(rs.funcs[0], ["7", "7"], ["7", "7"])
    assert rs.log.drain() == {"correct": 0.75}
    assert rs.log.drain() == {}


def test_group_stats_and_dynamic_sampling():
    rewards = [1, 1, 1, 0, 1, 0, 0.5, 0.5, 0.5]
    stats = group_stats(rewards, 3)
    assert stats["reward_mean"] == pytest.approx(sum(rewards) / 9)
    assert stats["reward_std"] == pytest.approx(math.sqrt(sum((r - stats["reward_mean"]) ** 2 for r in rewards) / 9))
    assert stats["frac_groups_all_equal"] == pytest.approx(2 / 3)
    assert groups_to_keep(rewards, 3) == [1]
    assert keep_mask(rewards, 3) == [False] * 3 + [True] * 3 + [False] * 3
    assert groups_to_keep([0.1, 0.1 + 1e-9], 2) == []  # float noise is not signal
    assert groups_to_keep([float("nan"), 1.0, 0.0, 0.0], 2) == []  # NaN (unscorable) ignored
    with pytest.raises(ValueError):
        group_stats([1, 2, 3], 2)


_LOOPS = (
    "import threading, time\n"
    "release = threading.Event()\n"
    "def spins(prompts, completions, **kw):\n"
    "    end = time.monotonic() + 20\n"
    "    while time.monotonic() < end:\n"
    "        pass\n"
    "    return [1.0] * len(completions)\n"
    "def blocks(prompts, completions, **kw):\n"
    "    release.wait(20)\n"
    "    return [1.0] * len(completions)\n"
)


@pytest.mark.parametrize("on_error", ["fail", "none"])
def test_a_reward_that_loops_on_the_pod_ends_the_run_at_its_limit_naming_it_and_its_line(tmp_path, on_error):
    """A reward file's function that does not return is stopped at the call's limit with the local check's
    words (the function, the line it was at); a pure-Python loop is ended in its thread, and a wait in C
    is left behind; neither is scored None one by one, and the error is not retried."""
    import threading
    import time

    from autoslm.engine.rollout.named_rewards import NamedTRLReward, resolve
    from autoslm.engine.rollout.rewards import RewardLog
    from autoslm.envs.reward_refs import NamedReward, parse_reward
    from autoslm.errors import FatalWorkerError

    path = tmp_path / "r.py"
    path.write_text(_LOOPS + f"# {on_error}\n")  # a module of its own (modules are kept by content)
    for name, line in (("spins", 5), ("blocks", 9)):
        fn = resolve(NamedReward(parse_reward(f"{path}:{name}"), 1.0, path))
        reward = NamedTRLReward(name, fn, f"r.py:{name}", answer_format=None, on_error=on_error, log=RewardLog(), limit_s=0.3)
        t0 = time.monotonic()
        with pytest.raises(FatalWorkerError) as e:
            reward(prompts=["p", "q"], completions=["a", "b"], answer=["1", "1"], info=["{}", "{}"])
        assert time.monotonic() - t0 < 10
        assert str(e.value) == (
            f"reward r.py:{name} did not return within 0.3 s when called on a batch of 2 completions "
            f"(it was at line {line}): fix the loop, or make it faster (it scores a whole batch at every "
            "training step)"
        )
        assert not e.value.retryable
    fn.__globals__["release"].set()
    deadline = time.monotonic() + 10
    while any(t.name.startswith("reward r.py:") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("reward r.py:")]


def test_an_environment_reward_that_loops_is_bounded_too():
    from autoslm.errors import FatalWorkerError

    def loops(example, text):
        while True:
            pass

    class Env(Environment):
        name = "loops"

        def reward_functions(self):
            return [("correct", loops, 1.0)]

    rs = build_reward_set(Env(), thinking=False)
    # Long enough for the thread to be inside ``loops`` on a loaded machine, where its line is read.
    rs.funcs[0].limit_s = 2.0
    with pytest.raises(
        FatalWorkerError,
        match=r"^reward correct did not return within 2 s when called on a batch of 1 completions \(it was at line \d+\)",
    ):
        rs.funcs[0](prompts=["p"], completions=["a"], answer=["1"], info=["{}"])


def test_the_judge_is_not_bounded_by_the_reward_call_limit():
    """The LLM judge times each request out itself and retries with backoff: a batch may take longer."""

    class Judge:
        def score_batch(self, examples, texts):
            return [1.0] * len(texts)

    class Env(Environment):
        name = "plain"

        def reward_functions(self):
            return [("correct", lambda example, text: 0.0, 1.0)]

    rs = build_reward_set(Env(), thinking=False, judge=Judge())
    assert [f.limit_s for f in rs.funcs] == [300.0, None]
