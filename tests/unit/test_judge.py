"""The LLM judge against a fake OpenAI-compatible endpoint on 127.0.0.1."""

from __future__ import annotations

import logging
import time

import pytest

from autoslm.engine.rollout.rewards import build_reward_set
from autoslm.envs.base import Environment, Example
from autoslm.envs.judge import JudgeClient, JudgedEnvironment, fill_prompt, parse_score, with_judge
from autoslm.errors import FatalWorkerError, WorkerError
from autoslm.spec import JudgeSpec
from tests.fakes.openai_chat import FakeChatServer

KEY = "sk-test-very-secret-0123456789"


@pytest.fixture
def server():
    with FakeChatServer() as s:
        yield s


class Sleeps(list):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def client(server, **kw) -> JudgeClient:
    kw.setdefault("sleep", Sleeps())
    return JudgeClient(server.base_url, "judge-model", **kw)


@pytest.mark.parametrize(
    "reply,score",
    [
        ("SCORE: 1", 1.0),
        ("score: 0.25", 0.25),
        ("Reasoning...\nSCORE: 0\n", 0.0),
        ("SCORE: 7/10", 0.7),
        ("**Score**: 0.5", 0.5),
        ("first SCORE: 0.1 then SCORE: 0.9", 0.9),
        ("0.8", 0.8),
        ("3/4", 0.75),
        ("<think>SCORE: 0</think>SCORE: 1", 1.0),
        ("SCORE: 7", None),
        ("SCORE: -0.5", None),
        ("looks fine", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_score(reply, score):
    assert parse_score(reply) == score


def test_template_fills_literally():
    t = 'Q={prompt} A={answer} R={completion} {"json": true}'
    assert fill_prompt(t, "x {y}", "r", None) == 'Q=x {y} A= R=r {"json": true}'


def test_scores_in_order_concurrently(server):
    server.gather(4)  # each request waits until 4 are in flight: a client sending fewer times out
    c = client(server, concurrency=4)
    items = [(f"q{i}", "GOOD" if i % 2 else "BAD", "a") for i in range(8)]
    scores = c.score_many(items)
    assert scores == [0.0, 1.0] * 4
    assert server.max_in_flight == 4  # ran in parallel, as many at once as allowed (not a clock's word)
    assert c.stats.succeeded == 8 and c.stats.failed == 0
    body = server.requests[0]
    assert body["model"] == "judge-model" and body["temperature"] == 0
    assert body["messages"][0]["role"] == "system" and "q" in body["messages"][1]["content"]
    c.close()


def test_concurrency_one_is_sequential(server):
    server.delay_s = 0.05
    c = client(server, concurrency=1)
    c.score_many([("q", "GOOD", None)] * 4)
    assert server.max_in_flight == 1


def test_retries_5xx_with_growing_backoff(server):
    sleeps = Sleeps()
    c = client(server, retries=3, sleep=sleeps, backoff_s=0.5)
    server.fail_next(2, status=503)
    assert c.score("q", "GOOD") == 1.0
    assert c.stats.retries == 2 and c.stats.failed == 0
    assert len(sleeps) == 2 and sleeps[1] > sleeps[0] * 0.9  # exponential, with jitter in [0.5, 1)
    assert 0.25 <= sleeps[0] <= 0.5


def test_429_honours_retry_after(server):
    sleeps = Sleeps()
    c = client(server, sleep=sleeps, backoff_s=0.01)
    server.fail_next(1, status=429, retry_after=3)
    assert c.score("q", "GOOD") == 1.0
    assert sleeps == [3.0]


def test_gives_up_after_retries_scores_zero_and_counts(server, caplog):
    c = client(server, retries=2)
    server.fail_next(3, status=500)
    with caplog.at_level(logging.WARNING, logger="autoslm.judge"):
        assert c.score("q", "GOOD") == 0.0
    assert c.stats.failed == 1 and c.stats.retries == 2 and c.stats.last_error == "HTTP 500"
    assert "scored 0" in caplog.text
    assert c.score("q", "GOOD") == 1.0  # the next one goes through


def test_hanging_request_times_out_and_scores_zero(server):
    c = client(server, timeout_s=0.3, retries=1)
    server.hang_next(2, seconds=2.0)
    t0 = time.monotonic()
    assert c.score("q", "GOOD") == 0.0
    assert time.monotonic() - t0 < 1.8
    assert c.stats.failed == 1 and "timed out" in c.stats.last_error


def test_unreachable_endpoint_scores_zero():
    with FakeChatServer() as s:
        url = s.base_url
    c = JudgeClient(url, "m", retries=1, timeout_s=1.0, sleep=Sleeps())
    assert c.score_many([("q", "GOOD", None)] * 3) == [0.0, 0.0, 0.0]
    assert c.stats.failed == 3 and "connection failed" in c.stats.last_error


def test_unparsable_reply_scores_zero(server):
    c = client(server)
    server.reply_next(1, "I think it is fine.")
    assert c.score("q", "GOOD") == 0.0
    assert c.stats.unparsable == 1 and c.stats.failed == 0


def test_key_comes_from_the_named_variable_and_is_never_shown(caplog):
    spec = JudgeSpec(base_url="http://127.0.0.1:1/v1", model="m", api_key_env="JUDGE_API_KEY", retries=0)
    with FakeChatServer(api_key=KEY) as s:
        spec = spec.model_copy(update={"base_url": s.base_url})
        good = JudgeClient.from_spec(spec, environ={"JUDGE_API_KEY": KEY}, sleep=Sleeps())
        assert good.score("q", "GOOD") == 1.0
        assert s.auth_headers[-1] == f"Bearer {KEY}"

        bad = JudgeClient.from_spec(spec, environ={"JUDGE_API_KEY": KEY + "-wrong"}, sleep=Sleeps())
        with caplog.at_level(logging.DEBUG):
            assert bad.score("q", "GOOD") == 0.0
            with pytest.raises(FatalWorkerError) as err:
                bad.preflight()
        assert bad.stats.last_error == "HTTP 401"
        for text in (str(err.value), caplog.text, repr(bad.stats)):
            assert KEY not in text

    with pytest.raises(FatalWorkerError) as err:
        JudgeClient.from_spec(spec, environ={})
    assert "JUDGE_API_KEY" in str(err.value)


def test_preflight_unreachable_is_retryable():
    with FakeChatServer() as s:
        url = s.base_url
    c = JudgeClient(url, "m", retries=0, timeout_s=1.0)
    with pytest.raises(WorkerError) as err:
        c.preflight()
    assert not isinstance(err.value, FatalWorkerError)


class _Exact(Environment):
    name = "exact"

    def train_examples(self):
        return [Example(prompt=[{"role": "user", "content": "say GOOD"}], answer="GOOD")]

    def reward(self, example, completion):
        return 1.0 if completion.strip() == example.answer else 0.0


class _NoReward(Environment):
    name = "no-reward"

    def train_examples(self):
        return []


def _score_response_only(messages):
    # the task and the reference answer both say GOOD: grade only what follows "Response:"
    user = messages[-1]["content"]
    return "SCORE: 1" if "GOOD" in user.split("Response:", 1)[1] else "SCORE: 0"


def test_with_judge_adds_a_batched_reward():
    with FakeChatServer(scorer=_score_response_only) as server:
        server.gather(2)
        _judge_batch(server)


def _judge_batch(server):
    spec = JudgeSpec(base_url=server.base_url, model="m", weight=0.5, concurrency=4)
    env = with_judge(_Exact(), spec, sleep=Sleeps())
    assert isinstance(env, JudgedEnvironment)
    assert [n for n, _, _ in env.reward_functions()] == ["correct", "judge"]
    rs = build_reward_set(env, thinking=True)
    assert rs.names == ["correct", "judge"] and rs.weights == [1.0, 0.5]
    prompts = [[{"role": "user", "content": "say GOOD"}]] * 4
    completions = [
        [{"role": "assistant", "content": "<think>hm</think>GOOD"}],
        [{"role": "assistant", "content": "BAD"}],
        [{"role": "assistant", "content": "<think>never closed GOOD"}],
        [{"role": "assistant", "content": "GOOD"}],
    ]
    cols = {"answer": ["GOOD"] * 4, "info": ["{}"] * 4}
    judge_fn = rs.funcs[1]
    n_before = len(server.requests)
    assert judge_fn(prompts=prompts, completions=completions, **cols) == [1.0, 0.0, 0.0, 1.0]
    assert len(server.requests) - n_before == 3  # the unclosed think block is never sent
    assert server.max_in_flight >= 2
    sent = [r["messages"][1]["content"] for r in server.requests[n_before:]]
    assert all("<think>" not in t for t in sent)
    assert rs.funcs[0](prompts=prompts, completions=completions, **cols) == [1.0, 0.0, 0.0, 1.0]


def test_judge_alone_when_the_env_has_no_reward(server):
    env = with_judge(_NoReward(), JudgeSpec(base_url=server.base_url, model="m"), sleep=Sleeps())
    assert [n for n, _, _ in env.reward_functions()] == ["judge"]
    ex = Example(prompt=[{"role": "user", "content": "x"}])
    assert env.reward(ex, "GOOD") == 1.0
