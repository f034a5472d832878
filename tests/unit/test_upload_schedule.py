"""What the uploader writes next (engine/pod/upload_schedule.py), decided on its own: no thread, no store."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoslm.engine.pod.commit_budget import CommitBudget
from autoslm.engine.pod.upload_jobs import CheckpointJob, RequiredJob
from autoslm.engine.pod.upload_schedule import CHECKPOINT, PROGRESS, REQUIRED, next_upload

pytestmark = pytest.mark.worker  # also runs on the worker image's pins (make test-image)

NOW = 1000.0


def budget(tokens: float, burst: int = 4) -> CommitBudget:
    b = CommitBudget(360, clock=lambda: NOW, burst=burst)  # one token every 10 s
    b.tokens = tokens
    return b


def ckpt(step: int = 5, final: bool = False) -> CheckpointJob:
    return CheckpointJob(step, Path("staged"), 2, final)


def decide(queue, b, *, progress=False, since=None, due_s=300.0, closing=False):
    return next_upload(queue, b, NOW, progress=progress, progress_since=since, heartbeat_due_s=due_s, closing=closing)


def test_nothing_to_do_waits_for_work():
    assert decide([], budget(4)) == (None, None)


def test_a_required_write_goes_first_outside_the_budget_and_waits_only_for_its_retry():
    required = RequiredJob(lambda: None, "DONE", deadline=NOW + 60)
    assert decide([required, ckpt()], budget(0), progress=True, since=NOW) == (REQUIRED, None)
    required.next_attempt = NOW + 8
    assert decide([required], budget(0), progress=True, since=NOW) == (None, 8.0)


def test_a_checkpoint_waits_for_a_token_unless_it_is_final_or_work_must_follow():
    assert decide([ckpt()], budget(1)) == (CHECKPOINT, None)
    assert decide([ckpt()], budget(0.5)) == (None, pytest.approx(5.0))
    assert decide([ckpt(final=True)], budget(0)) == (CHECKPOINT, None)
    assert decide([ckpt(), RequiredJob(lambda: None, "adapter", NOW + 60)], budget(0)) == (CHECKPOINT, None)
    assert decide([ckpt()], budget(0), closing=True) == (CHECKPOINT, None)


def test_progress_leaves_a_token_to_checkpoints_until_the_heartbeat_is_due():
    assert decide([], budget(1), progress=True, since=NOW) == (None, pytest.approx(10.0))  # one kept in reserve
    assert decide([], budget(2), progress=True, since=NOW) == (PROGRESS, None)
    assert decide([], budget(1), progress=True, since=NOW - 300) == (PROGRESS, None)  # due: takes the last one


def test_a_due_heartbeat_takes_the_token_before_a_waiting_checkpoint():
    assert decide([ckpt()], budget(1), progress=True, since=NOW - 10) == (CHECKPOINT, None)
    assert decide([ckpt()], budget(1), progress=True, since=NOW - 300) == (PROGRESS, None)


def test_after_a_failure_only_required_work_goes_until_the_backoff_ends():
    b = budget(4)
    b.backoff_until = NOW + 30
    assert decide([ckpt()], b, progress=True, since=NOW) == (None, 30.0)
    assert decide([RequiredJob(lambda: None, "DONE", NOW + 60)], b) == (REQUIRED, None)
