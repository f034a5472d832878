"""``[environment] rewards`` on the worker: a reward file's functions and TRL's own, called as TRL calls them.

``build_named`` turns each ``NamedReward`` (``autoslm.envs.reward_refs``) into a TRL reward function: a
file is imported from its local copy (the store's, fetched by ``load_environment``), a ``trl:`` name
is looked up in the installed ``trl.rewards`` (a factory is called with its arguments). Each call gets
TRL's keywords with the row's own columns (``answer``, ``solution``, and the dataset's other columns)
in place of the GRPO dataset's internal ``answer``/``info`` ones; completions arrive as TRL gives them
(messages, thinking included).

A function that raises ends the run (``on_reward_error = "fail"``): a ``FatalWorkerError`` that names
it, chained to the user's exception so the traceback lands in ``error_<phase>.txt``; it is never
retried, since the same code raises again. So does one that does not return within
``REWARD_CALL_LIMIT_S`` (``reward_call.bounded_call``: the reward and the line of its file it was at). With ``"none"`` the batch is scored again one completion at
a time, each one that raises scores None (TRL leaves it out of the group's baseline) and is counted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from autoslm.engine.rollout.reward_call import REWARD_CALL_LIMIT_S, bounded_call
from autoslm.engine.rollout.rewards import RewardLog, example_from_row
from autoslm.envs.reward_refs import (
    TRL_EXTRAS,
    NamedReward,
    RewardRefError,
    call_kwargs,
    load_reward_function,
    row_columns,
    run_reward,
    signature_problem,
    values_problem,
)
from autoslm.errors import FatalWorkerError

# Columns of autoslm's own GRPO dataset: rebuilt into the row's columns before a named reward sees them.
_INTERNAL = ("answer", "info", "example_index")


def resolve(named: NamedReward) -> Callable:
    """The callable behind one named reward. Raises FatalWorkerError."""
    ref = named.ref
    if ref.kind == "file":
        try:
            return load_reward_function(named.local_path, ref)
        except RewardRefError as e:
            raise FatalWorkerError(f"environment.rewards: {e}") from e.__cause__
    try:
        import trl.rewards as trl_rewards

        fn = getattr(trl_rewards, ref.name)
    except (ImportError, AttributeError) as e:
        import trl

        raise FatalWorkerError(
            f"environment.rewards: {ref.text} is not in the installed TRL {trl.__version__} ({e})",
            hint="use a reward this TRL has, or a reward file",
        ) from None
    return fn(**named.args) if named.args is not None else fn


class NamedTRLReward:
    """A user's (or TRL's) reward function behind TRL's call, with the row's columns and the error policy."""

    def __init__(
        self,
        name: str,
        fn: Callable,
        shown: str,
        *,
        answer_format: str | None,
        on_error: str,
        log: RewardLog,
        limit_s: float = REWARD_CALL_LIMIT_S,
    ):
        self.__name__ = name  # TRL logs rewards/<__name__>/mean and /std at every step
        self.fn = fn
        self.limit_s = limit_s
        self.shown = shown
        self.answer_format = answer_format
        self.on_error = on_error
        self.log = log

    def columns(self, prompts, kwargs) -> list[dict]:
        answers, infos = kwargs.get("answer"), kwargs.get("info")
        out = []
        for i, prompt in enumerate(prompts):
            ex = example_from_row(prompt, _pick(answers, i), _pick(infos, i))
            out.append(row_columns(ex.answer, ex.info, self.answer_format))
        return out

    def __call__(self, prompts, completions, **kwargs) -> list[float | None]:
        extras = {k: v for k, v in kwargs.items() if k not in _INTERNAL}
        call = call_kwargs(prompts, completions, self.columns(prompts, kwargs), extras)
        try:
            values = self._run(call, len(completions))
        except FatalWorkerError:
            raise
        except Exception as e:  # noqa: BLE001 - the user's function may raise anything
            if self.on_error != "none":
                raise self._fatal(e) from e
            values = self._one_by_one(call, len(completions))
        problem = values_problem(values, len(completions))
        if problem:
            raise FatalWorkerError(
                f"reward {self.shown} {problem}",
                hint="return a list with one float (or None) per completion, as TRL's reward functions do",
            )
        values = [None if v is None else float(v) for v in values]
        self.log.record(self.__name__, values)
        return values

    def _one_by_one(self, call: dict, n: int) -> list[float | None]:
        """Each completion on its own; those that raise score None and are counted."""
        out: list[float | None] = []
        failed = 0
        for i in range(n):
            one = {k: ([v[i]] if isinstance(v, list) and len(v) == n else v) for k, v in call.items()}
            try:
                got = self._run(one, 1)
                out.append(got[0] if isinstance(got, (list, tuple)) and len(got) == 1 else got)
            except FatalWorkerError:
                raise
            except Exception:  # noqa: BLE001
                failed += 1
                out.append(None)
        self.log.count_errors(self.__name__, failed)
        return out

    def _run(self, call: dict, n: int):
        """One call of the function, within ``limit_s`` (``reward_call.bounded_call``)."""
        code = getattr(self.fn, "__code__", None)
        return bounded_call(
            lambda: run_reward(self.fn, call),
            shown=self.shown,
            n=n,
            limit_s=self.limit_s,
            source=code.co_filename if code is not None else None,
        )

    def _fatal(self, e: Exception) -> FatalWorkerError:
        text = " ".join(str(e).split())[:300]
        return FatalWorkerError(
            f"reward {self.shown} raised {type(e).__name__}" + (f": {text}" if text else ""),
            hint='fix the function (its traceback is in the run\'s error file), or set environment.on_reward_error = "none" '
            "to score such completions None",
        )


def _pick(column, i):
    if isinstance(column, list):
        return column[i] if i < len(column) else None
    return column


@dataclass(frozen=True)
class Prepared:
    """One entry of ``[environment] rewards`` ready for ``rewards.build_reward_set``."""

    kind: str  # "env" | "file" | "trl"
    name: str
    weight: float
    make: Callable[[str, RewardLog], Callable] | None = None  # (unique name, the set's log) -> TRL function


def prepare(named: list[NamedReward] | None, *, answer_format: str | None, on_error: str) -> list[Prepared] | None:
    """Resolve every named reward now (a file imported, a TRL name looked up, the signature checked),
    so a bad one fails before the trainer is built. None when the spec names none."""
    if not named:
        return None
    out = []
    for item in named:
        if item.ref.kind == "env":
            out.append(Prepared("env", "env", item.weight))
            continue
        fn = resolve(item)
        check_signature(fn, item.ref.shown)

        def make(name, log, fn=fn, shown=item.ref.shown):
            return NamedTRLReward(name, fn, shown, answer_format=answer_format, on_error=on_error, log=log)

        out.append(Prepared(item.ref.kind, item.ref.name, item.weight, make))
    return out


def check_signature(fn: Callable, shown: str) -> None:
    """A function TRL could not call (no **kwargs, a parameter no column fills) fails now, not mid-step."""
    problem = signature_problem(fn, ["prompts", "completions", *TRL_EXTRAS, "answer", "solution"], partial=True)
    if problem:
        raise FatalWorkerError(f"reward {shown}: {problem}")
