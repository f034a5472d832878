"""What the worker's phases share (engine/pod/phases/): the attempt's ``Job``, which each phase reads
and fills for the next, and what the train and after-eval phases end with."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from autoslm.engine.distributed import Ranks
from autoslm.engine.pod.context import WorkerContext
from autoslm.store import RunArtifacts


@dataclass
class Job:
    """One training attempt: what the runner hands in, and what each phase adds for the next."""

    ctx: WorkerContext
    spec: Any
    artifacts: RunArtifacts
    uploader: Any
    reporter: Any
    ranks: Ranks
    t_start: float = field(default_factory=time.time)
    prefetch: dict = field(default_factory=dict)
    dist_info: dict = field(default_factory=dict)
    strategy: str | None = None
    device: Any = None
    task: Any = None  # the loaded task (envs/task_table.LoadedTask): its environment, named rewards, judge
    env: Any = None  # the task's environment (envs/)
    judge: Any = None
    eval_examples: list = field(default_factory=list)
    max_new: int = 16
    model_path: str | None = None
    tokenizer: Any = None
    model: Any = None
    resume: tuple[int, Path] | None = None  # (step, checkpoint dir) when the attempt resumes
    trainer: Any = None
    progress: Any = None
    run_eval: Callable[..., dict | None] = lambda model, when="during": None  # (model, "before" | "during" | "after")
    synced: bool = False
    max_steps: int = 0
    eval_before: dict | None = None
    validation: Any = None  # engine/pod/validation.py: [eval]'s evaluations, best adapter, early stop
    limit_stop: Any = None  # engine/pod/limits.py: the stop before the run's time or money limit
    setup_s: float = 0.0


@dataclass(frozen=True)
class Trained:
    """What the train phase ends with."""

    final_step: int
    loss: float | None
    train_s: float
    limit: Any = None  # the limits.LimitEnd training stopped before, short of max_steps


@dataclass(frozen=True)
class HandedBack:
    """The adapter the run hands back: its evaluation and the step it is from (the last step, or with
    keep_best the best evaluation's), and what the run says about the choice."""

    result: dict | None
    step: int
    note: str | None = None
    last: dict | None = None  # with keep_best: the evaluation of the last state, which is not handed back
