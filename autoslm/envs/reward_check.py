"""The check of a reward file at ``validate``, ``plan`` and ``launch``: the user's file imported and
called once, in a child process (``python -m autoslm.envs.reward_check <folder>``), never in this one.

``reward_issues(spec)`` refuses a file outside the spec's folder (the file is uploaded with the run),
and has each file's functions checked: the file is read once, and exactly those bytes are imported in
the child, checked (the names exist, are callables whose signature takes TRL's keywords, and a call on
the first row of the data with a dummy completion returns one float) and kept: ``checked_source``
gives them to ``store.shipping``, so the run ships the bytes that were checked, not a later rewrite.

The child is bounded: ``CHECK_LIMIT_S`` for the import and again for the call (faulthandler says where
it was), ``MEMORY_LIMIT_BYTES`` of memory, the last ``STDERR_KEEP_BYTES`` of its stderr kept. When it
ends, every process it started ends too: its process group, and any process (a ``setsid`` one
included) that carries the check's mark in its environment, found through /proc.

A file importing a module not installed here while ``[environment] packages`` lists packages for the
pod is not refused: its syntax and the function's name are checked here, and one warning line
(``reward_warnings``) says the rest is checked only on the pod.

It must never run the user's code in the calling process, and never let the child, or anything the
child started, outlive the check.

Here: what is checked and what is kept of it. Starting, bounding and ending the child, and the line for
a child that gave no answer: ``reward_sandbox.py``; what runs in the child: ``reward_child.py``.
"""

from __future__ import annotations

import hashlib
import math
import os
import pickle
import sys
from pathlib import Path
from typing import Callable

from autoslm.envs.reward_refs import (
    ENV_REWARD,
    MAX_REWARD_FILE_BYTES,
    ROW_ENV_PREFIXES,
    RewardRef,
    RewardRefError,
    parse_reward,
    placeholder_row,
    trl_factory_args,
)
from autoslm.envs.reward_sandbox import CHECK_LIMIT_S, MEMORY_LIMIT_BYTES, check_in_child

# ---------------------------------------------------------------------------------------------------
# validate


def reward_issues(spec, sample: Callable | None = None, root: Path | None = None) -> list[tuple[str, str]]:
    """(field, message) for each problem with ``[environment] rewards`` and its companions. ``sample()``
    gives the row a reward file's functions are called on (``envs.task_table.sample_row``); ``root``, the
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
        return issues + [
            ("environment.rewards", 'reward functions score GRPO completions: set train.method = "grpo", or remove them')
        ]
    if env.judge is not None and ENV_REWARD not in env.rewards:
        issues.append(
            (
                "environment.judge",
                'the judge scores as part of the environment\'s reward: list "env" in '
                "environment.rewards to keep it (its weight is environment.judge.weight)",
            )
        )
    if env.reward_weights is not None and len(env.reward_weights) != len(env.rewards):
        issues.append(
            (
                "environment.reward_weights",
                f"{len(env.reward_weights)} weights for {len(env.rewards)} rewards: "
                "give one weight per entry of environment.rewards, in the same order",
            )
        )
    refs = _parsed(env.rewards, issues)
    issues += _reward_args_issues(spec, refs)
    files = [(i, r) for i, r in enumerate(refs) if r.kind == "file"]
    if files:
        issues += _file_issues(spec, files, sample or (lambda: placeholder_row(env.answer_format)), root)
    return issues


def _parsed(rewards: list[str], issues: list[tuple[str, str]]) -> list[RewardRef]:
    """The references that parse; each that does not, and a reward listed twice, said in ``issues``."""
    refs = []
    for i, text in enumerate(rewards):
        try:
            refs.append(parse_reward(text))
        except RewardRefError as e:
            issues.append((f"environment.rewards.{i}", str(e)))
    if len(set(rewards)) != len(rewards):
        issues.append(("environment.rewards", "a reward is listed twice: give it a larger weight instead"))
    return refs


def _reward_args_issues(spec, refs: list[RewardRef]) -> list[tuple[str, str]]:
    """``[environment.reward_args]``: each key one of TRL's factories in the rewards, its arguments theirs."""
    issues = []
    for key, args in spec.environment.reward_args.items():
        ref = next((r for r in refs if r.text == key), None)
        if ref is None or ref.kind != "trl":
            issues.append(
                (
                    f"environment.reward_args.{key}",
                    'arguments go to TRL\'s factories listed in environment.rewards (e.g. "trl:get_soft_overlong_punishment")',
                )
            )
            continue
        try:
            trl_factory_args(ref.name, args, spec.train.max_completion_tokens)
        except RewardRefError as e:
            issues.append((f"environment.reward_args.{key}", str(e)))
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
            issues.append(
                (
                    field,
                    f"{ref.shown}: the file is {math.ceil(size / 1024)} KiB, above the {MAX_REWARD_FILE_BYTES // 1024} KiB "
                    "a reward file may have: keep the reward functions in a small file, and put data in the dataset",
                )
            )
            continue
        if row is None:
            row = sample()
        problem = check_file(path, ref, row, packages=spec.environment.packages)
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
    return (
        f"{path}{via} is outside {base}, the spec's folder: a reward file is uploaded with the run, so it "
        "must be in that folder or below it; move or copy it there"
    )


# Results by (file, its content, function, row, packages): a sweep validates every point and a command
# may load its spec twice, and neither should start a child, or wait out a loop, again.
_CHECKED: dict[tuple, tuple[str | None, str | None]] = {}
# The last check of each file (resolved path): the bytes it ran, and its warning by function name.
_SOURCE: dict[str, bytes] = {}
_WARNINGS: dict[tuple[str, str], str] = {}


def check_file(
    path: Path, ref: RewardRef, row, limit_s: float = CHECK_LIMIT_S, packages=(), memory_bytes: int = MEMORY_LIMIT_BYTES
) -> str | None:
    """The one-line problem of reward file ``path``'s function ``ref.name`` (None: none): imported in a
    child process and called there on ``row`` (``check_call``), each within ``limit_s`` seconds; a
    child that takes longer is stopped, and the line says where it was. ``packages``: what
    ``[environment] packages`` installs on the pod. The user's code never runs in this process."""
    try:
        source = Path(path).read_bytes()
    except OSError as e:
        return f"{ref.shown}: cannot read {path}: {e.strerror}"
    payload = pickle.dumps((str(path), ref, row, limit_s, source, tuple(packages), memory_bytes))
    key = (str(path), hashlib.sha256(source).hexdigest(), ref.name, hashlib.sha256(payload).hexdigest())
    if key not in _CHECKED:
        _CHECKED[key] = check_in_child(Path(path), ref, payload, limit_s)
    problem, warning = _CHECKED[key]
    real = str(Path(path).resolve())
    _SOURCE[real] = source
    if warning:
        _WARNINGS[(real, ref.name)] = warning
    else:
        _WARNINGS.pop((real, ref.name), None)
    return problem


def checked_source(path: Path) -> bytes | None:
    """The bytes the last check of ``path`` ran (None: not checked in this process)."""
    return _SOURCE.get(str(Path(path).expanduser().resolve()))


def reward_warnings(spec) -> list[tuple[str, str]]:
    """(field, message) for each reward file the last check could check only in part (a module the pod installs)."""
    out = []
    for i, text in enumerate(spec.environment.rewards):
        try:
            ref = parse_reward(text)
        except RewardRefError:
            continue
        if ref.kind == "file":
            warning = _WARNINGS.get((str(Path(ref.path).expanduser().resolve()), ref.name))
            if warning:
                out.append((f"environment.rewards.{i}", warning))
    return out


if __name__ == "__main__":  # the check's child (``reward_sandbox.check_in_child`` starts it)
    from autoslm.envs.reward_child import run_child

    run_child(Path(sys.argv[1]))
