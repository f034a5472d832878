"""What runs in the reward check's child process (``python -m autoslm.envs.reward_check <folder>``):
the file imported from the bytes the parent read, its function called once on a row (``check_call``),
each stage stopped by faulthandler past its limit, memory bounded, and the answer written to the folder.
A module the file imports that is not installed here, while ``[environment] packages`` lists packages
for the pod, is a warning, not a problem (``_missing_module``).
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import pickle
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, NoReturn

from autoslm.envs.reward_refs import (
    RewardRef,
    RewardRefError,
    _said,
    call_kwargs,
    load_reward_function,
    run_reward,
    signature_problem,
    values_problem,
)


def run_child(box: Path) -> NoReturn:
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
