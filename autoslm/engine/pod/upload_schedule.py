"""What the worker's uploader (engine/pod/uploader.py) writes next: one decision over its queue, its
commit budget and the progress waiting, made under the uploader's lock and tested on its own.

Scheduling, in priority order, one store operation at a time on one daemon thread:
1. Work in the ordered queue (checkpoints, the best evaluation's adapter under keep_best, and
   ``required`` jobs, first in first out). A required job runs at once, outside the budget, after
   flushing pending heartbeat and events so the store shows them first (DONE must not land before the
   last events). The final checkpoint also skips the budget. Other checkpoints wait for a budget token;
   a newer checkpoint replaces an older one still waiting (and a newer best adapter an older one).
2. The newest heartbeat and every pending event, together in one commit (events.jsonl is rewritten
   whole from the uploader's copy, seeded from the store so a resumed run appends), when a budget
   token is free. Meanwhile heartbeats coalesce (newest wins) and events batch.

The budget is a token bucket (``commit_budget.CommitBudget``); progress commits leave one token in
reserve (when the burst is at least 3) so a new checkpoint need not wait, and a heartbeat that has
waited ``heartbeat_due_s`` takes the next token before any checkpoint (its own share of the budget:
checkpoints every few seconds never keep the store's heartbeat older than the timeout allows). After a
failure nothing but required work is tried until the backoff has passed.
"""

from __future__ import annotations

from collections.abc import Sequence

from autoslm.engine.pod.commit_budget import CommitBudget
from autoslm.engine.pod.upload_jobs import CheckpointJob, RequiredJob

REQUIRED = "required"  # the queue's head, a required write
CHECKPOINT = "checkpoint"  # the queue's head, a checkpoint or the best adapter
PROGRESS = "progress"  # the newest heartbeat and the pending events, in one commit


def next_upload(
    queue: Sequence[CheckpointJob | RequiredJob],
    budget: CommitBudget,
    now: float,
    *,
    progress: bool,
    progress_since: float | None,
    heartbeat_due_s: float,
    closing: bool,
) -> tuple[str | None, float | None]:
    """(REQUIRED, CHECKPOINT or PROGRESS, None) to act now; (None, seconds) to wait; (None, None) when
    there is nothing to do. ``progress``: a heartbeat or events wait, the oldest since ``progress_since``;
    ``closing``: the uploader flushes everything, ignoring the budget."""
    waits: list[float] = []
    head = queue[0] if queue else None
    if isinstance(head, RequiredJob):
        if now >= head.next_attempt:
            return REQUIRED, None
        waits.append(head.next_attempt - now)
    in_backoff = budget.in_backoff(now)
    if in_backoff:
        waits.append(budget.backoff_until - now)
    due = progress and progress_since is not None and now - progress_since >= heartbeat_due_s
    if isinstance(head, CheckpointJob) and not in_backoff:
        # Outside the budget: the final checkpoint, the flush at close, and a checkpoint that
        # required work (adapter, DONE, error) is queued behind.
        exempt = head.final or closing or any(isinstance(j, RequiredJob) for j in queue)
        # A heartbeat that has waited ``heartbeat_due_s`` owns the next token: a checkpoint never
        # takes the commit it needs to reach the store within the heartbeat timeout.
        if (exempt or budget.has()) and not (due and not exempt):
            return CHECKPOINT, None
        if not exempt and not due:
            waits.append(budget.until())
    if progress and not in_backoff and not isinstance(head, RequiredJob):
        # Progress leaves a token in reserve, so a checkpoint saved right after a run of setup
        # heartbeats goes up at once instead of a budget interval later; a due one takes the last.
        need = 1 if due else 1 + budget.reserve
        if closing or budget.has(need):
            return PROGRESS, None
        waits.append(budget.until(need))
    if waits:
        return None, max(min(waits), 0.0)
    return None, None
