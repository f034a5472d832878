"""What the worker reads from its environment, and what it refuses."""

from __future__ import annotations

import shutil

import pytest

from autoslm.engine.pod.context import WorkerContext
from autoslm.errors import FatalWorkerError

pytestmark = pytest.mark.worker  # also runs on the worker image's pins (make test-image)


def test_context_from_env(tmp_path):
    ctx = WorkerContext.from_env(
        {
            "AUTOSLM_JOBSPEC": "{}",
            "AUTOSLM_RUN_ID": "r-1",
            "AUTOSLM_STORE": "file:///x",
            "AUTOSLM_SEED": "3",
            "AUTOSLM_ATTEMPT": "2",
            "AUTOSLM_DEADLINE": "123.5",
            "AUTOSLM_HOME": str(tmp_path),
            "AUTOSLM_WORKDIR": str(tmp_path / "w"),
            "AUTOSLM_PREFETCH_S": "41",
        }
    )
    assert (ctx.run_id, ctx.seed, ctx.attempt, ctx.deadline, ctx.prefetch_s) == ("r-1", 3, 2, 123.5, 41.0)
    assert ctx.paths("sft").prefix == "sft/r-1/seed3" and ctx.workdir == tmp_path / "w"


def test_each_worker_gets_its_own_scratch_dir():
    env = {"AUTOSLM_JOBSPEC": "{}", "AUTOSLM_RUN_ID": "r", "AUTOSLM_STORE": "file:///x"}
    a, b = WorkerContext.from_env(env), WorkerContext.from_env(env)
    try:
        assert a.workdir != b.workdir and a.prefetch_s is None
    finally:
        shutil.rmtree(a.workdir, ignore_errors=True)
        shutil.rmtree(b.workdir, ignore_errors=True)


def test_missing_variables_are_fatal_and_named():
    with pytest.raises(FatalWorkerError) as e:
        WorkerContext.from_env({"AUTOSLM_RUN_ID": "r"})
    assert "AUTOSLM_JOBSPEC" in str(e.value) and "AUTOSLM_STORE" in str(e.value)
    with pytest.raises(FatalWorkerError):
        WorkerContext.from_env({"AUTOSLM_JOBSPEC": "{}", "AUTOSLM_RUN_ID": "r", "AUTOSLM_STORE": "s", "AUTOSLM_SEED": "x"})
