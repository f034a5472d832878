"""The run's limits seen from inside the pod, and the worker's own stop before them.

The controller and the in-pod watchdog end a run when ``limits.max_hours`` or ``limits.max_usd``
passes; what training learned since its last checkpoint would then be lost and no adapter written.
So the worker stops first: after each optimizer step ``LimitStop.check`` asks whether one more step,
then saving and uploading (the final checkpoint, the adapter, metrics and DONE), the final held-out
evaluation (when it is affordable: ``EVAL_SHARE``) and lm-evaluation-harness after the hand-back (with
``[eval] lm_eval``, when its estimate is known and affordable: ``HARNESS_SHARE``) would still end before
the nearer limit. When not, training stops at that step, and the run hands back the adapter it has,
its end naming the limit. The harness runs after the hand-back, so a limit can only cut it, never the
adapter: it ends by ``harness_cut_at``, with time left to write what it finished.

The money limit is a time too: this replica's share of what is left of ``max_usd`` (``pod_budget_usd``),
at its price (its ``compute.nodes`` pods': ``replica_price``), counted from when the controller began billing the pod (``AUTOSLM_BILLED_FROM``, else
the worker's first start here). The watchdog (``watchdog.py``) counts the same way, so the two agree.

Nothing here does I/O: the clock is given. It must never raise into training.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from autoslm.layout import LIMIT_HOURS, LIMIT_USD

# What a store write costs at the end, beyond its bytes (request, commit), and its bytes a second:
# a local directory is near free; a Hub commit takes seconds and an upload goes at about 10 MB/s.
_COMMIT_S = {"local": 1.0, "hf": 15.0}
_BYTES_PER_S = {"local": 200e6, "hf": 10e6}
_END_COMMITS = 4  # the final checkpoint, the adapter, metrics.json, DONE
# The final checkpoint holds the adapter and its optimizer state (two more copies, fp32 moments), and
# the adapter goes up once more on its own.
_BYTES_PER_ADAPTER = 4
SAVE_MARGIN_S = 5.0  # writing the files, the last heartbeat, the process's own end
# The final evaluation is kept in the plan only while it takes at most this share of the time left
# when training began: a longer one would eat the steps the limit leaves. Skipped, keep_best still
# chooses among the evaluations made, and the adapter handed back is said to be unevaluated.
EVAL_SHARE = 0.25
_STEPS_SEEN = 3  # the next step is estimated as the slowest of the last few
# lm-eval after the hand-back is kept in the plan only while its estimate takes at most this share of the
# time left when training began; beyond it, training keeps its steps and the limit may cut the harness
# (what it finished is kept: the base's scores alone are worth having).
HARNESS_SHARE = 0.25
HARNESS_KILL_S = 10.0  # a cut harness is asked to stop, then killed after this long


@dataclass(frozen=True)
class LimitEnd:
    """When a limit passes (unix time) and which (``layout.LIMIT_HOURS`` or ``LIMIT_USD``)."""

    at: float
    limit: str

    @property
    def words(self) -> str:
        return "the time limit (limits.max_hours)" if self.limit == LIMIT_HOURS else "the money limit (limits.max_usd)"


def pod_budget_usd(max_usd: float | None, spent_usd: float, seeds: int) -> float | None:
    """This pod's share of what is left of max_usd: several seeds' pods run side by side."""
    if max_usd is None:
        return None
    return max(0.0, max_usd - spent_usd) / max(1, seeds)


def nearest_end(
    deadline: float | None, budget_usd: float | None, price_per_hour: float | None, billed_from: float | None
) -> LimitEnd | None:
    """The nearer of the time limit and the moment this pod's budget is spent at its price; None without limits."""
    ends = [LimitEnd(deadline, LIMIT_HOURS)] if deadline is not None else []
    if budget_usd is not None and price_per_hour and billed_from is not None:
        ends.append(LimitEnd(billed_from + budget_usd / price_per_hour * 3600.0, LIMIT_USD))
    return min(ends, key=lambda e: e.at, default=None)


def replica_price(price_per_hour: float | None, spec) -> float | None:
    """What one replica costs an hour: AUTOSLM_PRICE_PER_HOUR is one pod's price, and a replica of
    ``compute.nodes`` pods bills them all."""
    if price_per_hour is None:
        return None
    return price_per_hour * (1 if spec is None else spec.compute.nodes)  # None: the spec could not be read


def run_end(ctx, spec, started_at: float) -> LimitEnd | None:
    """The limit this worker must stop before, from what it was told (``WorkerContext``) and its JobSpec."""
    budget = pod_budget_usd(spec.limits.max_usd, ctx.spent_usd, len(spec.seeds or [0]))
    billed_from = min(started_at, ctx.billed_from) if ctx.billed_from is not None else started_at
    return nearest_end(ctx.deadline, budget, replica_price(ctx.price_per_hour, spec), billed_from)


def save_seconds(adapter_bytes: int, store: str) -> float:
    """Seconds to save and upload everything at the end, for an adapter of ``adapter_bytes`` in a
    ``local`` or ``hf`` store (unknown kinds are counted as the Hub)."""
    commit, rate = _COMMIT_S.get(store, _COMMIT_S["hf"]), _BYTES_PER_S.get(store, _BYTES_PER_S["hf"])
    return SAVE_MARGIN_S + _END_COMMITS * commit + _BYTES_PER_ADAPTER * max(0, adapter_bytes) / rate


def harness_end_s(store: str) -> float:
    """Seconds the end of a cut harness needs: stopping it, then metrics.json and the last heartbeat."""
    return HARNESS_KILL_S + SAVE_MARGIN_S + 2 * _COMMIT_S.get(store, _COMMIT_S["hf"])


def harness_cut_at(end: LimitEnd | None, store: str) -> float | None:
    """When lm-eval after the hand-back must be stopped so that what it finished is written before the
    limit (None without a limit)."""
    return None if end is None else end.at - harness_end_s(store)


def trainable_bytes(model) -> int:
    """Bytes of the trainable weights (the adapter a save writes); 0 when the model cannot tell."""
    try:
        return int(sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad))
    except Exception:  # noqa: BLE001 - an estimate: never a reason to fail training
        return 0


class LimitStop:
    """The stop decision of one attempt. ``begin`` when training begins, ``evaluated`` after each
    held-out evaluation, ``check`` after each optimizer step: the limit to stop before now, or None."""

    def __init__(
        self,
        end: LimitEnd | None,
        *,
        store: str = "local",
        final_eval: bool = True,
        harness_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.end, self.store, self.final_eval, self.clock = end, store, final_eval, clock
        self.harness_s = harness_s  # [eval] lm_eval after the hand-back: its estimate, None when unknown or unplanned
        self.save_s = save_seconds(0, store)
        self.eval_s: float | None = None  # the latest held-out evaluation's duration, this attempt
        self.train_start: float | None = None
        self._last: float | None = None
        self._steps: deque[float] = deque(maxlen=_STEPS_SEEN)

    def begin(self, now: float, adapter_bytes: int = 0) -> None:
        self.train_start = self._last = now
        self.save_s = save_seconds(adapter_bytes, self.store)

    def evaluated(self, seconds: float) -> None:
        self.eval_s = seconds

    def eval_planned(self) -> bool:
        """Is the final evaluation's time kept in the plan (known, wanted, and affordable)?"""
        if not self.final_eval or self.eval_s is None or self.end is None:
            return False
        start = self.train_start if self.train_start is not None else self.clock()
        return self.eval_s <= EVAL_SHARE * max(0.0, self.end.at - start)

    def harness_planned(self) -> bool:
        """Is lm-eval's time after the hand-back kept in the plan (estimated, and affordable)?"""
        if not self.harness_s or self.end is None:
            return False
        start = self.train_start if self.train_start is not None else self.clock()
        return self.harness_s <= HARNESS_SHARE * max(0.0, self.end.at - start)

    def reserve_s(self) -> float:
        """What the end needs after the last step: saving and uploading, the final evaluation if planned,
        and lm-eval after the hand-back if planned (with the time to write what it finished)."""
        harness = self.harness_s + harness_end_s(self.store) if self.harness_planned() else 0.0
        return self.save_s + (self.eval_s if self.eval_planned() else 0.0) + harness

    def next_step_s(self) -> float:
        """The next step's estimate: the slowest of the last few."""
        return max(self._steps, default=0.0)

    def check(self, now: float) -> LimitEnd | None:
        """After a step: stop now, or would one more step leave too little time for the end?"""
        if self._last is not None:
            self._steps.append(max(0.0, now - self._last))
        self._last = now
        if self.end is None:
            return None
        return self.end if now + self.next_step_s() + self.reserve_s() >= self.end.at else None

    def eval_fits(self, now: float) -> bool:
        """At a limit stop: is there time for the final evaluation before saving? A planned one may also
        use the step the stop gave up (the stop leaves between none and one step beyond the reserve)."""
        if self.end is None:
            return True
        slack = self.next_step_s() if self.eval_planned() else 0.0
        return self.eval_s is not None and now + self.eval_s + self.save_s <= self.end.at + slack
