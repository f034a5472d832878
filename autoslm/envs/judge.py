"""An LLM judge as a GRPO reward: asks an OpenAI-compatible ``/chat/completions`` endpoint for a score.

``JudgeClient`` sends requests concurrently (a thread pool of ``concurrency`` workers sharing one httpx
client), with a per-request timeout and retries with exponential backoff on 429, 5xx, timeouts and
connection errors (``Retry-After`` is honoured). A request that still fails scores 0 and is counted in
``JudgeClient.stats``: a judge outage must never crash training. ``with_judge`` adds the judge to an
environment's reward functions; ``build_reward_set`` calls its ``score_batch`` once per batch.

The prompt sent to the judge
----------------------------
One system message (``SYSTEM_PROMPT``) and one user message: ``JudgeSpec.prompt`` or
``DEFAULT_PROMPT``, where ``{prompt}`` becomes the last user message of the task, ``{completion}`` the
model's answer (thinking removed) and ``{answer}`` the reference answer ("" when there is none). The
placeholders are replaced literally, so other braces in the template or the texts are left alone. The
judge must reply with a line ``SCORE: <number>``: a number in [0, 1], or a fraction such as ``7/10``.
The last such line counts; a reply that is only a number is accepted too; anything else scores 0 and
is counted as unparsable. Temperature is 0.

The API key is read from the environment variable ``JudgeSpec.api_key_env`` names, sent only in the
``Authorization`` header, and never written into an error, a log line or ``stats``.
"""

from __future__ import annotations

import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import httpx

from autoslm.envs.base import Environment, Example, Messages, StepResult
from autoslm.errors import FatalWorkerError, WorkerError

log = logging.getLogger("autoslm.judge")

SYSTEM_PROMPT = (
    "You are a strict and fair grader. You read a task, a reference answer and a response, and you grade the response."
)
DEFAULT_PROMPT = """Grade the response to the task below.

Task:
{prompt}

Reference answer (empty if there is none):
{answer}

Response:
{completion}

Judge whether the response correctly and completely solves the task. End your reply with one line of the
form "SCORE: <number from 0 to 1>", where 1 means fully correct and 0 means wrong."""

_SCORE = re.compile(r"score\W{0,5}?(-?\d+(?:\.\d+)?)(?:\s*/\s*(\d+(?:\.\d+)?))?", re.IGNORECASE)
_BARE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)(?:\s*/\s*(\d+(?:\.\d+)?))?\s*$")
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_RETRY_STATUS = {408, 409, 425, 429}


def parse_score(reply: str | None) -> float | None:
    """The score in a judge reply, in [0, 1]; None when there is none or it is out of range."""
    if not reply:
        return None
    text = _THINK.sub("", reply)
    matches = _SCORE.findall(text)
    if matches:
        num, den = matches[-1]
    else:
        m = _BARE.match(text)
        if not m:
            return None
        num, den = m.groups()
    value = float(num)
    if den:
        d = float(den)
        if d <= 0:
            return None
        value /= d
    return value if 0.0 <= value <= 1.0 else None


def fill_prompt(template: str, prompt: str, completion: str, answer: str | None) -> str:
    # str.replace, not str.format: task texts and templates may hold JSON or code braces.
    return template.replace("{prompt}", prompt).replace("{completion}", completion).replace("{answer}", answer or "")


@dataclass
class JudgeStats:
    requests: int = 0  # scoring calls (one per completion)
    succeeded: int = 0
    failed: int = 0  # gave up after retries (scored 0)
    unparsable: int = 0  # the judge answered without a usable score (scored 0)
    retries: int = 0  # extra attempts made
    last_error: str | None = None  # never holds the key

    def to_dict(self) -> dict:
        return asdict(self)


class _Retryable(Exception):
    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class _Fatal(Exception):
    pass


class JudgeClient:
    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        concurrency: int = 8,
        timeout_s: float = 30.0,
        retries: int = 3,
        prompt: str | None = None,
        backoff_s: float = 0.5,
        max_backoff_s: float = 20.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.concurrency = max(1, int(concurrency))
        self.timeout_s = float(timeout_s)
        self.retries = max(0, int(retries))
        self.template = prompt or DEFAULT_PROMPT
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._key = api_key or None
        self._sleep = sleep
        self._rng = rng or random.Random(0)
        self._lock = threading.Lock()
        self.stats = JudgeStats()
        headers = {"Content-Type": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        self._http = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(self.timeout_s),
            limits=httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency),
            transport=transport,
        )
        self._pool: ThreadPoolExecutor | None = None

    @classmethod
    def from_spec(cls, spec, *, environ: Mapping[str, str] | None = None, **kwargs) -> "JudgeClient":
        """Build from a ``JudgeSpec``. A named key variable that is unset is a configuration error."""
        environ = os.environ if environ is None else environ
        key = None
        if spec.api_key_env:
            key = environ.get(spec.api_key_env)
            if not key:
                raise FatalWorkerError(
                    f"environment.judge.api_key_env names {spec.api_key_env}, but it is not set in the worker's environment",
                    hint=f"export {spec.api_key_env} where the worker runs (it is passed to pods as a secret)",
                )
        return cls(
            spec.base_url,
            spec.model,
            api_key=key,
            concurrency=spec.concurrency,
            timeout_s=spec.timeout_s,
            retries=spec.retries,
            prompt=spec.prompt,
            **kwargs,
        )

    # -- public ----------------------------------------------------------------------------------

    def score(self, prompt: str, completion: str, answer: str | None = None) -> float:
        """One completion's score in [0, 1]; 0 when the judge could not be asked or did not answer."""
        with self._lock:
            self.stats.requests += 1
        try:
            reply = self._ask(fill_prompt(self.template, prompt, completion, answer))
        except (_Retryable, _Fatal) as e:
            self._failed(str(e))
            return 0.0
        value = parse_score(reply)
        if value is None:
            with self._lock:
                self.stats.unparsable += 1
                self.stats.last_error = "judge reply had no SCORE line"
            return 0.0
        with self._lock:
            self.stats.succeeded += 1
        return value

    def complete(self, system: str, user: str) -> str | None:
        """A free-text reply to one request (the critique task's critic writes with it); None when
        the request failed after its retries (counted like a failed score)."""
        with self._lock:
            self.stats.requests += 1
        try:
            reply = self._ask(user, system)
        except (_Retryable, _Fatal) as e:
            self._failed(str(e))
            return None
        reply = _THINK.sub("", reply).strip()
        with self._lock:
            if reply:
                self.stats.succeeded += 1
            else:
                self.stats.unparsable += 1
        return reply or None

    def score_many(self, items: Sequence[tuple[str, str, str | None]]) -> list[float]:
        """Scores for (prompt, completion, answer) triples, ``concurrency`` requests at a time, in order."""
        if not items:
            return []
        if len(items) == 1 or self.concurrency == 1:
            return [self.score(*it) for it in items]
        pool = self._executor()
        return list(pool.map(lambda it: self.score(*it), items))

    def preflight(self) -> None:
        """One real request, at worker start: a refused key or a wrong URL fails the run clearly and
        once, instead of silently scoring every completion 0."""
        try:
            reply = self._ask(fill_prompt(self.template, "What is 1 + 1?", "2", "2"))
        except _Fatal as e:
            raise FatalWorkerError(f"the judge at {self.url} refused the request: {e}", hint="check environment.judge") from None
        except _Retryable as e:
            raise WorkerError(f"the judge at {self.url} is unreachable: {e}") from None
        if parse_score(reply) is None:
            log.warning("judge preflight: the reply had no SCORE line; check environment.judge.prompt")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- internals -------------------------------------------------------------------------------

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="judge")
            return self._pool

    def _ask(self, user: str, system: str = SYSTEM_PROMPT) -> str:
        body = {
            "model": self.model,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "temperature": 0,
        }
        attempt = 0
        while True:
            try:
                return self._once(body)
            except _Retryable as e:
                if attempt >= self.retries:
                    raise
                delay = min(self.max_backoff_s, self.backoff_s * (2**attempt)) * (0.5 + self._rng.random() / 2)
                if e.retry_after is not None:
                    delay = min(self.max_backoff_s, max(delay, e.retry_after))
                attempt += 1
                with self._lock:
                    self.stats.retries += 1
                self._sleep(delay)

    def _once(self, body: dict) -> str:
        try:
            r = self._http.post(self.url, json=body)
        except httpx.TimeoutException:
            raise _Retryable(f"timed out after {self.timeout_s:g}s") from None
        except httpx.TransportError as e:
            raise _Retryable(f"connection failed ({type(e).__name__})") from None
        if r.status_code in _RETRY_STATUS or r.status_code >= 500:
            raise _Retryable(f"HTTP {r.status_code}", _retry_after(r.headers.get("retry-after")))
        if r.status_code >= 400:
            raise _Fatal(f"HTTP {r.status_code}")
        try:
            data = r.json()
            return str(data["choices"][0]["message"].get("content") or "")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            return ""

    def _failed(self, reason: str) -> None:
        reason = self._redact(reason)
        with self._lock:
            self.stats.failed += 1
            self.stats.last_error = reason
            n = self.stats.failed
        if n <= 5 or n % 100 == 0:  # enough to notice, not enough to flood the log
            log.warning("judge request failed after %d retries (%s); scored 0 [%d failures so far]", self.retries, reason, n)

    def _redact(self, text: str) -> str:
        return text.replace(self._key, "***") if self._key else text


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------------------
# The judge as an environment reward


def _prompt_text(messages: Messages) -> str:
    for m in reversed(messages or []):
        if m.get("role") == "user":
            c = m.get("content")
            return c if isinstance(c, str) else "".join(p.get("text", "") for p in c or [] if isinstance(p, dict))
    return ""


class JudgeReward:
    """A reward function ``(Example, completion) -> float`` backed by a ``JudgeClient``."""

    __name__ = "judge"

    def __init__(self, client: JudgeClient, weight: float = 1.0):
        self.client = client
        self.weight = weight

    def __call__(self, example: Example, completion: str) -> float:
        return self.client.score(_prompt_text(example.prompt), completion, example.answer)

    def score_batch(self, examples: Sequence[Example], completions: Sequence[str]) -> list[float]:
        return self.client.score_many([(_prompt_text(e.prompt), c, e.answer) for e, c in zip(examples, completions, strict=True)])


class JudgedEnvironment(Environment):
    """``env`` with the judge added to its reward functions (or as the only one, when ``env`` has none)."""

    def __init__(self, env: Environment, judge: JudgeReward):
        self.inner = env
        self.judge = judge
        self.name = env.name
        self.multi_turn = env.multi_turn
        self.max_turns = env.max_turns

    def train_examples(self) -> list[Example]:
        return self.inner.train_examples()

    def eval_examples(self) -> list[Example]:
        return self.inner.eval_examples()

    def reward(self, example: Example, completion: str) -> float:
        if _has_own_reward(self.inner):
            return self.inner.reward(example, completion)
        return self.judge(example, completion)

    def reward_messages(self, example: Example, messages: Messages) -> float:
        return (
            self.inner.reward_messages(example, messages)
            if _has_own_reward(self.inner)
            else super().reward_messages(example, messages)
        )

    def reward_functions(self):
        own = self.inner.reward_functions() if _has_own_reward(self.inner) else []
        return [*own, ("judge", self.judge, self.judge.weight)]

    def tools(self):
        return self.inner.tools()

    def step(self, example: Example, messages: Messages, state: dict) -> StepResult:
        return self.inner.step(example, messages, state)

    def __getattr__(self, name):  # everything else (params, helpers) from the wrapped env
        if name == "inner":  # not set yet (copy/unpickle): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


def _has_own_reward(env: Environment) -> bool:
    cls = type(env)
    return cls.reward is not Environment.reward or cls.reward_functions is not Environment.reward_functions


def with_judge(env: Environment, spec, *, environ: Mapping[str, str] | None = None, **client_kwargs) -> JudgedEnvironment:
    """Wrap ``env`` so that the judge in ``spec`` (a ``JudgeSpec``) scores its completions too."""
    client = JudgeClient.from_spec(spec, environ=environ, **client_kwargs)
    return JudgedEnvironment(env, JudgeReward(client, spec.weight))
