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
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import math
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, NoReturn

from autoslm.envs.reward_refs import (
    ENV_REWARD,
    MAX_REWARD_FILE_BYTES,
    ROW_ENV_PREFIXES,
    RewardRef,
    RewardRefError,
    _said,
    call_kwargs,
    load_reward_function,
    parse_reward,
    placeholder_row,
    run_reward,
    signature_problem,
    trl_factory_args,
    values_problem,
)

# The import may take this long, and then the one call on a row. A reward function scores a whole
# batch at every training step, so one row is far below this.
CHECK_LIMIT_S = 10
# Besides those two limits, how long the child may take to start (an interpreter and this module)
# before it is killed; it never needs this unless the machine is swamped.
CHECK_START_S = 10
# The child's memory (RLIMIT_DATA: heap and private mappings): a reward scoring one row needs far less.
MEMORY_LIMIT_BYTES = 2 * 1024**3
# Of the child's stderr only the end is kept (the last line names what went wrong).
STDERR_KEEP_BYTES = 64 * 1024
# The environment variable every process the child starts inherits: how the check finds them at the end.
MARK = "AUTOSLM_REWARD_CHECK"

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
        _CHECKED[key] = _check_in_child(Path(path), ref, payload, limit_s)
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


class _Tail:
    """The last ``keep`` bytes of a stream, read by a thread of its own until the stream closes."""

    def __init__(self, stream, keep: int = STDERR_KEEP_BYTES):
        self.keep, self.data = keep, bytearray()
        self._thread = threading.Thread(target=self._drain, args=(stream,), daemon=True)
        self._thread.start()

    def _drain(self, stream) -> None:
        with stream:
            while chunk := stream.read1(65536):
                self.data += chunk
                if len(self.data) > 2 * self.keep:
                    del self.data[: -self.keep]

    def text(self, wait_s: float = 5.0) -> str:
        self._thread.join(wait_s)  # the stream closes when the child and all it started are gone
        return bytes(self.data[-self.keep :]).decode(errors="replace")


def _check_in_child(path: Path, ref: RewardRef, payload: bytes, limit_s: float) -> tuple[str | None, str | None]:
    """(problem, warning) of one check, run in a child process that is ended, with all it started, here."""
    with tempfile.TemporaryDirectory(prefix="autoslm-reward-check-") as tmp:
        box = Path(tmp)
        (box / "in.pickle").write_bytes(payload)
        mark = uuid.uuid4().hex
        env = dict(os.environ, **{MARK: mark})
        # This checkout, last: the child imports autoslm the way this process did, whatever its sys.path was.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(Path(__file__).resolve().parents[2])) if p)
        child = subprocess.Popen(
            [sys.executable, "-m", "autoslm.envs.reward_check", str(box)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )  # its own group: whatever the file starts goes with it
        tail = _Tail(child.stderr)
        expired = False
        try:
            child.wait(timeout=2 * limit_s + CHECK_START_S)
        except subprocess.TimeoutExpired:
            expired = True
        finally:
            end_all(child, mark)
        said = tail.text()
        if (box / "out.json").exists():
            out = json.loads((box / "out.json").read_text())
            return out["problem"], out.get("warning")
        return _no_answer(path, ref, box, limit_s, expired, said, child.returncode), None


def end_all(child: subprocess.Popen, mark: str) -> None:
    """Kill ``child``'s process group and every process carrying ``mark`` in its environment (one that
    left the group with ``setsid``, or was orphaned), until none is left; then reap ``child``."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (OSError, AttributeError):
        child.kill()
    needle = f"{MARK}={mark}".encode() + b"\0"
    for _ in range(100):  # a process killed cannot fork again: each pass only finds what the last one missed
        found = [pid for pid in _marked(needle) if pid != os.getpid()]
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    child.wait()


def _marked(needle: bytes) -> list[int]:
    """The live processes whose environment holds ``needle`` (none where there is no /proc)."""
    out = []
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return out
    for pid in pids:
        try:
            data = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue  # gone, or another user's
        if (b"\0" + data).find(b"\0" + needle) >= 0:
            out.append(pid)
    return out


def _no_answer(path: Path, ref: RewardRef, box: Path, limit_s: float, expired: bool, said: str, code: int) -> str:
    """The line for a child that ended without an answer: past its limit, or its process ended."""
    importing = not (box / "imported").exists()
    stack = (box / "stack.txt").read_text(errors="replace") if (box / "stack.txt").exists() else ""
    if expired or stack.strip():  # faulthandler writes only when a stage ran past its limit
        line = _stuck_at(stack, path)
        at = f" (it was at line {line})" if line else ""
        if importing:
            return (
                f"{ref.shown}: importing the file did not finish within {limit_s:g} s{at}: fix the loop in the "
                "file's top-level code, or make its import faster"
            )
        return (
            f"{ref.shown} did not return within {limit_s:g} s when called on the first row of the data{at}: "
            "fix the loop, or make it faster (it scores a whole batch at every training step)"
        )
    lines = said.strip().splitlines()
    last = f": {' '.join(lines[-1].split())[:300]}" if lines else ""
    stage = "importing the file" if importing else "calling it on the first row of the data"
    how = f"killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() else f"exit code {code}"
    return f"{ref.shown}: {stage} ended the process ({how}){last}; a reward file must return its scores, never end its process"


def _stuck_at(stack: str, path: Path) -> int | None:
    """The line of ``path`` the innermost frame of the user's file was at, from faulthandler's dump."""
    for m in re.finditer(r'File "(.*)", line (\d+)', stack):  # most recent call first
        if Path(m.group(1)) == Path(path):
            return int(m.group(2))
    return None


# ---------------------------------------------------------------------------------------------------
# The child


def _child(box: Path) -> NoReturn:
    """Import the file (the bytes the parent read) and call the function, then write the answer.
    faulthandler's own thread stops a stage that runs past its limit, even inside C code or a loop
    that never gives the interpreter back, and writes where each thread was."""
    import faulthandler

    path, ref, row, limit_s, source, packages, memory_bytes = pickle.loads((box / "in.pickle").read_bytes())
    stack = open(box / "stack.txt", "w")  # noqa: SIM115 - faulthandler writes to it until the process ends
    gib = f"{memory_bytes / 1024**3:g} GiB"

    def answer(problem: str | None, warning: str | None = None) -> NoReturn:
        (box / "out.tmp").write_text(json.dumps({"problem": problem, "warning": warning}))
        os.replace(box / "out.tmp", box / "out.json")
        os._exit(0)  # the file's own threads or atexit hooks must not keep the check waiting

    _bound_memory(memory_bytes)
    faulthandler.dump_traceback_later(limit_s, exit=True, file=stack)
    try:
        fn = load_reward_function(Path(path), ref, source=source)
    except RewardRefError as e:
        cause = e.__cause__
        if isinstance(cause, MemoryError):
            answer(f"{ref.shown}: importing the file needed more than the {gib} of memory the check allows")
        if isinstance(cause, ModuleNotFoundError):
            answer(*_missing_module(ref, cause, source, packages, str(e)))
        answer(str(e))
    except BaseException as e:  # noqa: BLE001 - sys.exit() or Ctrl-C in the file's top level
        answer(f"{ref.shown}: importing the file raised {_said(e, path)}")
    faulthandler.cancel_dump_traceback_later()
    (box / "imported").touch()
    faulthandler.dump_traceback_later(limit_s, exit=True, file=stack)
    try:
        problem = check_call(fn, row)
    except MemoryError:
        problem = f"calling it on the first row of the data needed more than the {gib} of memory the check allows"
    except ModuleNotFoundError as e:
        if packages:
            answer(None, _pod_only(ref, e, packages, "its name, its parameters and its import"))
        problem = (
            f"calling it on the first row of the data raised {_said(e, path)}; install it here, or list its "
            "package in environment.packages (name==version) so the pod installs it"
        )
    except BaseException as e:  # noqa: BLE001 - check_call catches what a reward raises, but not sys.exit()
        problem = f"calling it on the first row of the data raised {_said(e, path)}"
    faulthandler.cancel_dump_traceback_later()
    answer(f"{ref.shown}: {problem}" if problem else None)


def _bound_memory(limit: int) -> None:
    try:
        import resource
    except ImportError:  # not on this system: the time limit still holds
        return
    for which in ("RLIMIT_DATA", "RLIMIT_AS"):
        if which == "RLIMIT_AS" and sys.platform == "darwin":
            continue  # macOS cannot lower it
        try:
            resource.setrlimit(getattr(resource, which), (limit, limit))
            return
        except (AttributeError, ValueError, OSError):
            continue


def _missing_module(ref: RewardRef, e: ModuleNotFoundError, source: bytes, packages, said: str) -> tuple[str | None, str | None]:
    """(problem, warning) for a file importing a module not installed here. With ``[environment]
    packages`` listed, the pod may have it: what can be checked here is, and the rest is a warning."""
    if not packages:
        return (
            f"{said}; install it here, or list its package in environment.packages (name==version) so the pod installs it"
        ), None
    if not _defines(source, ref.name):
        return f"{ref.shown}: the file has no {ref.name!r}", None
    return None, _pod_only(ref, e, packages, f"its syntax and the name {ref.name!r}")


def _pod_only(ref: RewardRef, e: ModuleNotFoundError, packages, checked: str) -> str:
    return (
        f"{ref.shown}: the file imports {e.name!r}, not installed here; environment.packages "
        f"({', '.join(packages)}) installs on the pod, so only the pod can import it and call "
        f"{ref.name} (here only {checked} were checked)"
    )


def _defines(source: bytes, name: str) -> bool:
    """Whether the module's top level binds ``name`` (a def, a class, an assignment or an import)."""
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name.split(".")[0]) == name for a in node.names):
            return True
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, (ast.AnnAssign, ast.AugAssign))
            else []
        )
        if any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t)):
            return True
    return False


def check_call(fn: Callable, row) -> str | None:
    """None when ``fn`` takes TRL's call for one row and returns one float or None; else what is wrong.
    With a real row (``row[2]``) the function is called on it with a dummy completion (the row's answer)."""
    prompt, columns, real = row
    completion = [{"role": "assistant", "content": str(columns.get("answer") or "42")}]
    extras = {
        "completion_ids": [[0]],
        "trainer_state": SimpleNamespace(global_step=0, max_steps=1, epoch=0.0),
        "log_extra": lambda *a, **k: None,
        "log_metric": lambda *a, **k: None,
    }
    kwargs = call_kwargs([prompt], [completion], [columns], extras)
    problem = signature_problem(fn, list(kwargs))
    if problem or not real:
        return problem
    try:
        values = run_reward(fn, kwargs)
    except (MemoryError, ModuleNotFoundError):
        raise  # the child says these in its own words
    except Exception as e:  # noqa: BLE001 - the user's function may raise anything
        return f"calling it on the first row of the data raised {_said(e, inspect.getsourcefile(fn) or '')}"
    problem = values_problem(values, 1)
    return f"on the first row of the data it {problem}" if problem else None


if __name__ == "__main__":
    _child(Path(sys.argv[1]))
