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

``reward_issues(spec)`` runs inside ``autoslm validate``: it refuses a file outside the spec's folder
(the file is uploaded with the run), imports each file, checks that the names exist and are callables
whose signature takes those keywords, and calls each once on the first row of the data with a dummy
completion, so a reward that raises is one line on the laptop before anything is rented. The import
and the call run in a child process with a time limit (``CHECK_LIMIT_S`` each): a file that loops
forever is one line too, not a hung `validate`, `plan` or `launch`. The user's file is the only
foreign code it runs, and only in that child.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import inspect
import math
import numbers
import os
import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, NoReturn

from autoslm.envs.answers import gold_answer

MAX_REWARD_FILE_BYTES = 1024 * 1024  # a reward file is code, not data: 1 MiB is far beyond any real one
# validate's check of a reward file: the import may take this long, and then the one call on a row.
# A reward function scores a whole batch at every training step, so one row is far below this.
CHECK_LIMIT_S = 10
# Besides those two limits, how long the child may take to start (an interpreter and this module)
# before it is killed; it never needs this unless the machine is swamped.
CHECK_START_S = 10
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
    "get_soft_overlong_punishment": ("DAPO's penalty for completions near or past the length limit",
                                     {"max_completion_len": "max", "soft_punish_cache": "max/4"}),
    "get_repetition_penalty_reward": ("a penalty for repeated n-grams of completion tokens",
                                      {"ngram_size": 3, "max_penalty": -1.0}),
    "get_cosine_scaled_reward": ("accuracy_reward scaled by length on a cosine schedule (shorter right answers score more)",
                                 {"max_len": "max", "min_value_wrong": -1.0, "max_value_wrong": -0.5,
                                  "min_value_correct": 0.5, "max_value_correct": 1.0}),
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
        raise RewardRefError("a reward must be \"file.py:function\", \"trl:<name>\" or \"env\"")
    if text == ENV_REWARD:
        return RewardRef(text, "env", name="env")
    if text.startswith(TRL_PREFIX):
        name = text[len(TRL_PREFIX):]
        if name not in TRL_REWARDS:
            raise RewardRefError(f"{text!r} is not one of TRL's reward functions; known: "
                                 + ", ".join(TRL_PREFIX + n for n in TRL_REWARDS))
        return RewardRef(text, "trl", name=name)
    path, sep, name = text.rpartition(":")
    if not sep or not path or not name.isidentifier():
        raise RewardRefError(f"{text!r}: name a function in a Python file as \"rewards.py:my_reward\", "
                             "one of TRL's as \"trl:accuracy_reward\", or the environment's own as \"env\"")
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
            return (f"its parameters {sig} cannot take the keywords TRL passes ({', '.join(keywords)}): "
                    "add **kwargs, as TRL's reward functions have")
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


def load_reward_function(path: Path, ref: RewardRef) -> Callable:
    """Import ``path`` as a module of its own and return ``ref.name`` from it. Raises RewardRefError."""
    try:
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]  # a changed file is imported anew
    except OSError as e:
        raise RewardRefError(f"{ref.shown}: cannot read {path}: {e.strerror}") from None
    module_name = f"autoslm_rewards_{Path(path).stem}_{digest}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise RewardRefError(f"{ref.shown}: cannot import {path} as a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as e:  # noqa: BLE001 - the user's module may raise anything while it loads
            sys.modules.pop(module_name, None)
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            raise RewardRefError(f"{ref.shown}: importing the file raised {_said(e, path)}") from e
    fn = getattr(module, ref.name, None)
    if fn is None:
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                       and getattr(v, "__module__", None) == module_name)
        raise RewardRefError(f"{ref.shown}: the file has no {ref.name!r}"
                             + (f"; its functions: {', '.join(found)}" if found else ""))
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
            args = trl_factory_args(ref.name, env.reward_args.get(text), spec.train.max_completion_tokens) if ref.kind == "trl" else None
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


# ---------------------------------------------------------------------------------------------------
# validate


def reward_issues(spec, sample: Callable | None = None, root: Path | None = None) -> list[tuple[str, str]]:
    """(field, message) for each problem with ``[environment] rewards`` and its companions. ``sample()``
    gives the row a reward file's functions are called on (``envs.registry.sample_row``); ``root``, the
    folder holding the spec file, which every reward file must sit in (None: a spec without a file)."""
    env = spec.environment
    issues: list[tuple[str, str]] = []
    data = env.id
    if data == "autoslm/critique" and isinstance(env.params.get("data"), str):
        data = env.params["data"]  # the critique judges its data's answers: the format is that data's
    if env.answer_format is not None and not data.startswith(ROW_ENV_PREFIXES):
        issues.append(("environment.answer_format", f"applies to prompt + answer datasets (jsonl: or hf:), not to {data}"))
    if not env.rewards:
        if env.reward_weights is not None:
            issues.append(("environment.reward_weights", "weights without rewards: list the functions in environment.rewards"))
        if env.reward_args:
            issues.append(("environment.reward_args", "arguments without rewards: list the functions in environment.rewards"))
        return issues
    if spec.train.method != "grpo":
        return issues + [("environment.rewards", 'reward functions score GRPO completions: set train.method = "grpo", or remove them')]
    if env.judge is not None and ENV_REWARD not in env.rewards:
        issues.append(("environment.judge", 'the judge scores as part of the environment\'s reward: list "env" in '
                       "environment.rewards to keep it (its weight is environment.judge.weight)"))
    if env.reward_weights is not None and len(env.reward_weights) != len(env.rewards):
        issues.append(("environment.reward_weights", f"{len(env.reward_weights)} weights for {len(env.rewards)} rewards: "
                       "give one weight per entry of environment.rewards, in the same order"))
    refs = []
    for i, text in enumerate(env.rewards):
        try:
            refs.append(parse_reward(text))
        except RewardRefError as e:
            issues.append((f"environment.rewards.{i}", str(e)))
    if len(set(env.rewards)) != len(env.rewards):
        issues.append(("environment.rewards", "a reward is listed twice: give it a larger weight instead"))
    for key, args in env.reward_args.items():
        ref = next((r for r in refs if r.text == key), None)
        if ref is None or ref.kind != "trl":
            issues.append((f"environment.reward_args.{key}", "arguments go to TRL's factories listed in environment.rewards "
                           '(e.g. "trl:get_soft_overlong_punishment")'))
            continue
        try:
            trl_factory_args(ref.name, args, spec.train.max_completion_tokens)
        except RewardRefError as e:
            issues.append((f"environment.reward_args.{key}", str(e)))
    files = [(i, r) for i, r in enumerate(refs) if r.kind == "file"]
    if files:
        issues += _file_issues(spec, files, sample or (lambda: placeholder_row(env.answer_format)), root)
    return issues


def _file_issues(spec, files: list[tuple[int, RewardRef]], sample: Callable, root: Path | None) -> list[tuple[str, str]]:
    from autoslm.layout import is_store_ref

    issues = []
    row = None
    for i, ref in files:
        field = f"environment.rewards.{i}"
        if is_store_ref(ref.path):
            continue  # shipped already: checked on the laptop that shipped it
        path = Path(ref.path).expanduser()
        outside = _outside(path, root)
        if outside:
            issues.append((field, f"{ref.shown}: {outside}"))
            continue
        if not path.is_file():
            issues.append((field, f"{ref.shown}: file not found: {path} (paths are relative to the spec file)"))
            continue
        size = path.stat().st_size
        if size > MAX_REWARD_FILE_BYTES:
            issues.append((field, f"{ref.shown}: the file is {math.ceil(size / 1024)} KiB, above the {MAX_REWARD_FILE_BYTES // 1024} KiB "
                           "a reward file may have: keep the reward functions in a small file, and put data in the dataset"))
            continue
        if row is None:
            row = sample()
        problem = check_file(path, ref, row)
        if problem:
            issues.append((field, problem))
    return issues


def _outside(path: Path, root: Path | None) -> str | None:
    """Why ``path`` may not be used as a reward file of a spec in ``root`` (None: it may). Every file
    a reward names is uploaded with the run, so only the spec's own folder may be read: a "../" or an
    absolute path elsewhere, or a link out of the folder, could upload any file of this machine."""
    if root is None:
        return None
    try:
        real, base = path.resolve(), Path(root).expanduser().resolve()
    except (OSError, RuntimeError) as e:  # a loop of links
        return f"cannot resolve {path}: {e}"
    if real.is_relative_to(base):
        return None
    via = f" (a link to {real})" if real != Path(os.path.abspath(path)) else ""
    return (f"{path}{via} is outside {base}, the spec's folder: a reward file is uploaded with the run, so it "
            "must be in that folder or below it; move or copy it there")


# Results of check_file by (file, its content, function, row): a sweep validates every point and a
# command may load its spec twice, and neither should start a child, or wait out a loop, again.
_CHECKED: dict[tuple, str | None] = {}


def check_file(path: Path, ref: RewardRef, row, limit_s: float = CHECK_LIMIT_S) -> str | None:
    """The one-line problem of reward file ``path``'s function ``ref.name`` (None: none): imported in a
    child process and called there on ``row`` (``check_call``), each within ``limit_s`` seconds; a
    child that takes longer is stopped, and the line says where it was. The user's code never runs in
    this process: a loop, an exit or a crash in it is a line here, never a hang or the end of this one."""
    import pickle

    try:
        payload = pickle.dumps((str(path), ref, row, limit_s))
        key = (str(path), hashlib.sha256(path.read_bytes()).hexdigest(), ref.name, hashlib.sha256(payload).hexdigest())
    except OSError as e:
        return f"{ref.shown}: cannot read {path}: {e.strerror}"
    if key not in _CHECKED:
        _CHECKED[key] = _check_in_child(path, ref, payload, limit_s)
    return _CHECKED[key]


def _check_in_child(path: Path, ref: RewardRef, payload: bytes, limit_s: float) -> str | None:
    import json
    import signal
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="autoslm-reward-check-") as tmp:
        box = Path(tmp)
        (box / "in.pickle").write_bytes(payload)
        env = dict(os.environ)
        # This checkout, last: the child imports autoslm the way this process did, whatever its sys.path was.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(Path(__file__).resolve().parents[2])) if p)
        with open(box / "stderr.txt", "wb") as err:
            child = subprocess.Popen([sys.executable, "-c", "from autoslm.envs.reward_refs import _child_check; _child_check()",
                                      str(box)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env,
                                     start_new_session=True)  # its own group: whatever the file starts goes with it
            expired = False
            try:
                child.wait(timeout=2 * limit_s + CHECK_START_S)
            except subprocess.TimeoutExpired:
                expired = True
            if not (box / "out.json").exists():  # stopped at its limit, or gone without an answer: nothing of it may stay
                try:
                    if hasattr(os, "killpg"):
                        os.killpg(child.pid, signal.SIGKILL)
                    else:
                        child.kill()
                except OSError:
                    pass
                child.wait()
        if (box / "out.json").exists():
            return json.loads((box / "out.json").read_text())["problem"]
        importing = not (box / "imported").exists()
        stack = (box / "stack.txt").read_text(errors="replace") if (box / "stack.txt").exists() else ""
        if expired or stack.strip():  # faulthandler writes only when a stage ran past its limit
            line = _stuck_at(stack, path)
            at = f" (it was at line {line})" if line else ""
            if importing:
                return (f"{ref.shown}: importing the file did not finish within {limit_s:g} s{at}: fix the loop in the "
                        "file's top-level code, or make its import faster")
            return (f"{ref.shown} did not return within {limit_s:g} s when called on the first row of the data{at}: "
                    "fix the loop, or make it faster (it scores a whole batch at every training step)")
        said = (box / "stderr.txt").read_text(errors="replace").strip().splitlines()
        last = f": {' '.join(said[-1].split())[:300]}" if said else ""
        stage = "importing the file" if importing else "calling it on the first row of the data"
        code = child.returncode
        how = f"killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() else f"exit code {code}"
        return f"{ref.shown}: {stage} ended the process ({how}){last}; a reward file must return its scores, never end its process"


def _stuck_at(stack: str, path: Path) -> int | None:
    """The line of ``path`` the innermost frame of the user's file was at, from faulthandler's dump."""
    for m in re.finditer(r'File "(.*)", line (\d+)', stack):  # most recent call first
        if Path(m.group(1)) == Path(path):
            return int(m.group(2))
    return None


def _child_check() -> None:
    """The child of ``check_file``: import the file and call the function, then write the answer.
    faulthandler's own thread stops a stage that runs past its limit, even inside C code or a loop
    that never gives the interpreter back, and writes where each thread was."""
    import faulthandler
    import json
    import pickle

    box = Path(sys.argv[1])
    path, ref, row, limit_s = pickle.loads((box / "in.pickle").read_bytes())
    stack = open(box / "stack.txt", "w")  # noqa: SIM115 - faulthandler writes to it until the process ends

    def answer(problem: str | None) -> NoReturn:
        (box / "out.tmp").write_text(json.dumps({"problem": problem}))
        os.replace(box / "out.tmp", box / "out.json")
        os._exit(0)  # the file's own threads or atexit hooks must not keep the check waiting

    faulthandler.dump_traceback_later(limit_s, exit=True, file=stack)
    try:
        fn = load_reward_function(Path(path), ref)
    except RewardRefError as e:
        answer(str(e))
    except BaseException as e:  # noqa: BLE001 - sys.exit() or Ctrl-C in the file's top level
        answer(f"{ref.shown}: importing the file raised {_said(e, path)}")
    faulthandler.cancel_dump_traceback_later()
    (box / "imported").touch()
    faulthandler.dump_traceback_later(limit_s, exit=True, file=stack)
    try:
        problem = check_call(fn, row)
    except BaseException as e:  # noqa: BLE001 - check_call catches what a reward raises, but not sys.exit()
        problem = f"calling it on the first row of the data raised {_said(e, path)}"
    faulthandler.cancel_dump_traceback_later()
    answer(f"{ref.shown}: {problem}" if problem else None)


def placeholder_row(answer_format: str | None):
    """A row with only the columns every dataset row has, for data that cannot be read offline."""
    return [{"role": "user", "content": "(a prompt)"}], row_columns("", {}, answer_format), False


def check_call(fn: Callable, row) -> str | None:
    """None when ``fn`` takes TRL's call for one row and returns one float or None; else what is wrong.
    With a real row (``row[2]``) the function is called on it with a dummy completion (the row's answer)."""
    prompt, columns, real = row
    completion = [{"role": "assistant", "content": str(columns.get("answer") or "42")}]
    extras = {"completion_ids": [[0]], "trainer_state": SimpleNamespace(global_step=0, max_steps=1, epoch=0.0),
              "log_extra": lambda *a, **k: None, "log_metric": lambda *a, **k: None}
    kwargs = call_kwargs([prompt], [completion], [columns], extras)
    problem = signature_problem(fn, list(kwargs))
    if problem or not real:
        return problem
    try:
        values = run_reward(fn, kwargs)
    except Exception as e:  # noqa: BLE001 - the user's function may raise anything
        return f"calling it on the first row of the data raised {_said(e, inspect.getsourcefile(fn) or '')}"
    problem = values_problem(values, 1)
    return f"on the first row of the data it {problem}" if problem else None
