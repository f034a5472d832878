"""``[environment] rewards``: reward functions named by reference, and their check at ``validate``.

A reference is one of

- ``"rewards.py:correct"``: the function ``correct`` of a Python file (the path is relative to the
  spec). The file travels with the run through its store, like a ``jsonl:`` file, up to
  ``MAX_REWARD_FILE_BYTES``; the worker imports the store's copy.
- ``"trl:accuracy_reward"``: one of TRL's own reward functions (``trl.rewards``), taken from the TRL
  installed on the pod. The ``get_*`` ones are factories; ``reward_args`` gives their arguments (the
  lengths default to ``train.max_completion_tokens``).
- ``"env"``: the environment's own reward (the answer match of a ``prompt + answer`` dataset, a
  built-in task's score), so a file's reward can be added to it rather than replace it.

Every function is called the way TRL calls a reward function: ``fn(prompts=..., completions=...,
completion_ids=..., trainer_state=..., log_extra=..., log_metric=..., **columns)`` with one value per
completion in every list, and returns a list of floats (or None: "cannot score this one"). The
columns are the row's own: ``answer`` (as the dataset has it), ``solution`` (the final answer, after
``answer_format``: what TRL's math rewards compare against), and every other column of the row.

This module parses references and loads a file's function; it never runs a user's file in the
process that validates a spec: ``autoslm.envs.reward_check`` does that check, in a child process.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import inspect
import numbers
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from autoslm.envs.answers import gold_answer

MAX_REWARD_FILE_BYTES = 1024 * 1024  # a reward file is code, not data: 1 MiB is far beyond any real one
TRL_PREFIX = "trl:"
ENV_REWARD = "env"
ROW_ENV_PREFIXES = ("jsonl:", "hf:")
# What TRL adds to every reward call besides prompts, completions and the dataset's columns.
TRL_EXTRAS = ("completion_ids", "trainer_state", "log_extra", "log_metric")

# trl.rewards of TRL 1.16 (the pod's pin), checked against the installed TRL on the pod: name -> (what it
# scores, the factory's arguments with their defaults; None for a plain reward function). "max" is
# train.max_completion_tokens, "max/4" a quarter of it.
TRL_REWARDS: dict[str, tuple[str, dict[str, Any] | None]] = {
    "accuracy_reward": ("math-verify: the completion's final expression (\\boxed{} or $...$) equals the row's solution", None),
    "reasoning_accuracy_reward": ("as accuracy_reward, on the text after the reasoning (after </think>)", None),
    "think_format_reward": ("1 when the completion opens with a <think>...</think> block", None),
    "get_soft_overlong_punishment": (
        "DAPO's penalty for completions near or past the length limit",
        {"max_completion_len": "max", "soft_punish_cache": "max/4"},
    ),
    "get_repetition_penalty_reward": (
        "a penalty for repeated n-grams of completion tokens",
        {"ngram_size": 3, "max_penalty": -1.0},
    ),
    "get_cosine_scaled_reward": (
        "accuracy_reward scaled by length on a cosine schedule (shorter right answers score more)",
        {"max_len": "max", "min_value_wrong": -1.0, "max_value_wrong": -0.5, "min_value_correct": 0.5, "max_value_correct": 1.0},
    ),
}


class RewardRefError(ValueError):
    """A reward reference that cannot be used; the message names it and says what to do."""


@dataclass(frozen=True)
class RewardRef:
    text: str  # as written in the spec (after its path was made absolute, or shipped)
    kind: str  # "file" | "trl" | "env"
    path: str | None = None  # kind "file": a local path or a store reference
    name: str = ""  # the function (kind "file"), TRL's name (kind "trl")

    @property
    def shown(self) -> str:
        """How messages name it: the file's name, not the laptop's directories or the store's hash."""
        if self.kind == "file":
            return f"{Path(self.path.split('/')[-1]).name}:{self.name}"
        return self.text


def parse_reward(text: str) -> RewardRef:
    if not isinstance(text, str) or not text.strip():
        raise RewardRefError('a reward must be "file.py:function", "trl:<name>" or "env"')
    if text == ENV_REWARD:
        return RewardRef(text, "env", name="env")
    if text.startswith(TRL_PREFIX):
        name = text[len(TRL_PREFIX) :]
        if name not in TRL_REWARDS:
            raise RewardRefError(
                f"{text!r} is not one of TRL's reward functions; known: " + ", ".join(TRL_PREFIX + n for n in TRL_REWARDS)
            )
        return RewardRef(text, "trl", name=name)
    path, sep, name = text.rpartition(":")
    if not sep or not path or not name.isidentifier():
        raise RewardRefError(
            f'{text!r}: name a function in a Python file as "rewards.py:my_reward", '
            'one of TRL\'s as "trl:accuracy_reward", or the environment\'s own as "env"'
        )
    if not path.endswith(".py"):
        raise RewardRefError(f"{text!r}: the reward file must be a Python file (.py)")
    return RewardRef(text, "file", path=path, name=name)


def with_path(ref: RewardRef, path: str) -> str:
    """The reference text with the file's path replaced (made absolute, or shipped into the store)."""
    return f"{path}:{ref.name}"


def trl_factory_args(name: str, given: dict[str, Any] | None, max_completion_tokens: int) -> dict[str, Any] | None:
    """The arguments a ``get_*`` factory is called with (None for a plain function). Raises RewardRefError."""
    defaults = TRL_REWARDS[name][1]
    given = dict(given or {})
    if defaults is None:
        if given:
            raise RewardRefError(f"trl:{name} takes no arguments; remove its reward_args")
        return None
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise RewardRefError(f"trl:{name} has no argument {', '.join(unknown)}; it takes {', '.join(defaults)}")
    out = {}
    for key, value in defaults.items():
        if value == "max":
            value = max_completion_tokens
        elif value == "max/4":
            value = max(1, max_completion_tokens // 4)
        out[key] = given.get(key, value)
    return out


# ---------------------------------------------------------------------------------------------------
# The columns a reward function sees


def row_columns(answer: str | None, info: dict[str, Any] | None, answer_format: str | None) -> dict[str, Any]:
    """One row's columns, as keyword values: its extra columns, ``answer`` and ``solution``."""
    cols = {k: v for k, v in (info or {}).items()}
    cols["answer"] = "" if answer is None else answer
    if "solution" not in cols:
        gold = gold_answer(answer, answer_format)
        cols["solution"] = "" if gold is None else gold
    return cols


def call_kwargs(prompts: list, completions: list, columns: list[dict[str, Any]], extras: dict[str, Any]) -> dict[str, Any]:
    """TRL's keywords for a batch: prompts, completions, each column as a list (a row without it: None)."""
    names = list(dict.fromkeys(k for row in columns for k in row))
    out = {"prompts": prompts, "completions": completions}
    out.update({k: [row.get(k) for row in columns] for k in names})
    out.update(extras)
    return out


def signature_problem(fn: Callable, keywords: list[str], partial: bool = False) -> str | None:
    """None when ``fn`` can be called with these keywords; otherwise what is wrong. ``partial``: only
    whether it can take them (a parameter they leave unfilled may be a column they do not name)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # a builtin or C callable: nothing to read, the call itself will tell
    try:
        (sig.bind_partial if partial else sig.bind)(**dict.fromkeys(keywords))
    except TypeError as e:
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
        msg = str(e)
        if "unexpected keyword" in msg and not takes_kwargs:
            return (
                f"its parameters {sig} cannot take the keywords TRL passes ({', '.join(keywords)}): "
                "add **kwargs, as TRL's reward functions have"
            )
        if "missing" in msg:
            return f"its parameters {sig} ask for what TRL does not pass ({msg}); the keywords it gets: {', '.join(keywords)}"
        return f"its parameters {sig} do not fit TRL's call ({msg})"
    return None


def run_reward(fn: Callable, kwargs: dict[str, Any]) -> Any:
    """Call a reward function (async ones too) the way TRL does."""
    out = fn(**kwargs)
    if inspect.isawaitable(out):
        out = asyncio.run(_await(out))
    return out


async def _await(x):
    return await x


def values_problem(values: Any, n: int) -> str | None:
    """None when ``values`` is one float (or None) per completion."""
    if not isinstance(values, (list, tuple)):
        return f"returned {type(values).__name__}, not a list with one float (or None) per completion"
    if len(values) != n:
        return f"returned {len(values)} values for {n} completions"
    bad = [v for v in values if v is not None and not isinstance(v, numbers.Real)]
    if bad:
        return f"returned {bad[0]!r} ({type(bad[0]).__name__}); each value must be a float or None"
    return None


# ---------------------------------------------------------------------------------------------------
# Loading a reward file


def load_reward_function(path: Path, ref: RewardRef, source: bytes | None = None) -> Callable:
    """Import ``path`` as a module of its own and return ``ref.name`` from it. ``source``: the file's
    bytes as already read (the check runs exactly the bytes it hashed), else read here. Raises RewardRefError."""
    try:
        source = Path(path).read_bytes() if source is None else source
    except OSError as e:
        raise RewardRefError(f"{ref.shown}: cannot read {path}: {e.strerror}") from None
    digest = hashlib.sha256(source).hexdigest()[:16]  # a changed file is imported anew
    module_name = f"autoslm_rewards_{Path(path).stem}_{digest}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise RewardRefError(f"{ref.shown}: cannot import {path} as a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102 - the user's reward file
        except BaseException as e:  # noqa: BLE001 - the user's module may raise anything while it loads
            sys.modules.pop(module_name, None)
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            raise RewardRefError(f"{ref.shown}: importing the file raised {_said(e, path)}") from e
    fn = getattr(module, ref.name, None)
    if fn is None:
        found = sorted(
            n
            for n, v in vars(module).items()
            if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module_name
        )
        raise RewardRefError(
            f"{ref.shown}: the file has no {ref.name!r}" + (f"; its functions: {', '.join(found)}" if found else "")
        )
    if not callable(fn):
        raise RewardRefError(f"{ref.shown}: {ref.name!r} is not a function (it is {type(fn).__name__})")
    return fn


def _said(e: BaseException, path) -> str:
    """``ValueError: boom (line 7)``: the exception and the deepest line of the user's file it passed."""
    line = None
    for frame in traceback.extract_tb(e.__traceback__):
        if Path(frame.filename) == Path(path):
            line = frame.lineno
    text = " ".join(str(e).split())[:300]
    return f"{type(e).__name__}" + (f": {text}" if text else "") + (f" (line {line})" if line else "")


@dataclass(frozen=True)
class NamedReward:
    """One entry of ``[environment] rewards`` as the worker uses it."""

    ref: RewardRef
    weight: float
    local_path: Path | None = None  # kind "file": the file to import (the store's copy on a pod)
    args: dict[str, Any] | None = None  # kind "trl": a factory's arguments


def named_rewards(spec, files=None) -> list[NamedReward]:
    """The spec's rewards with their weights; a shipped file is fetched through ``files``
    (``autoslm.store.shipping.DataFiles``). Raises FatalWorkerError for a reference that cannot be used."""
    from autoslm.errors import FatalWorkerError
    from autoslm.layout import is_store_ref

    env = spec.environment
    weights = env.reward_weights or [1.0] * len(env.rewards)
    out = []
    for text, weight in zip(env.rewards, weights, strict=True):
        try:
            ref = parse_reward(text)
            args = (
                trl_factory_args(ref.name, env.reward_args.get(text), spec.train.max_completion_tokens)
                if ref.kind == "trl"
                else None
            )
        except RewardRefError as e:
            raise FatalWorkerError(f"environment.rewards: {e}") from None
        local = None
        if ref.kind == "file":
            if files is not None:
                local, _ = files.local_path(ref.path)
            elif is_store_ref(ref.path):
                raise FatalWorkerError(f"{ref.shown} is a file in the run's store, and this worker was not given the store")
            else:
                local = Path(ref.path).expanduser()
        out.append(NamedReward(ref, float(weight), local, args))
    return out


def placeholder_row(answer_format: str | None):
    """A row with only the columns every dataset row has, for data that cannot be read offline."""
    return [{"role": "user", "content": "(a prompt)"}], row_columns("", {}, answer_format), False
