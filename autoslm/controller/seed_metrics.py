"""A seed's results as `status` and the report read them: its metrics.json (written by the worker,
engine/pod/phases.py) as small typed parts. Pure: no I/O.

``SeedMetrics.of(document)`` reads the parts the views show (the loss, the held-out evaluations before
and after training, the reward, what ``[eval]`` decided, lm-evaluation-harness's block, why training
stopped); ``to_json()`` gives the document back exactly as written, for ``status --json``.
``MemberMetrics.of(seed)`` is the few figures a sweep ranks its members by.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from autoslm.recipes.harness import LmEvalBlock


def _number(v) -> float | None:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class Evaluation:
    """One held-out evaluation: its loss, its score at the evaluation's own temperature (greedy) and, for
    GRPO, at the training temperature (``score_sampled``); ``n`` prompts. ``figures``: every figure it
    wrote but ``n``, by name as written (``pass@K`` beside those), for the report's table."""

    loss: float | None = None
    score: float | None = None
    score_sampled: float | None = None
    n: int | None = None
    figures: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, d) -> Evaluation | None:
        if not isinstance(d, dict):
            return None
        figures = {k: v for k, v in d.items() if k != "n"}
        return cls(_number(d.get("loss")), _number(d.get("score")), _number(d.get("score_sampled")), d.get("n"), figures)


@dataclass(frozen=True)
class Validation:
    """What ``[eval]`` decided: whether the best evaluation's adapter is kept, by which metric, that
    best's step, and whether an earlier best could not be used or a better one was out of reach."""

    keep_best: bool = False
    metric: str | None = None
    best_step: Any = None
    earlier_best_unusable: bool = False
    better_out_of_reach: bool = False

    @classmethod
    def of(cls, d) -> Validation | None:
        if not isinstance(d, dict):
            return None
        best = d.get("best") if isinstance(d.get("best"), dict) else {}
        return cls(
            keep_best=bool(d.get("keep_best")),
            metric=d.get("metric"),
            best_step=best.get("step"),
            earlier_best_unusable=bool(d.get("earlier_best_unusable")),
            better_out_of_reach=bool(d.get("better_out_of_reach")),
        )


@dataclass(frozen=True)
class SeedMetrics:
    """A seed's metrics.json, typed where the views read it. ``after_step``: the step whose adapter is
    handed back (where ``[eval]`` chose one); ``note``: what the evaluation says of that choice;
    ``lm_eval``: lm-evaluation-harness's block (``recipes.harness.LmEvalBlock``)."""

    document: dict
    raw: Any = None  # the file as written, for ``status --json``
    final_loss: float | None = None
    steps: int | None = None
    tokens_per_s: float | None = None
    train_time_s: float | None = None
    lm_eval_time_s: float | None = None
    reward_first: float | None = None
    reward_last: float | None = None
    stop_reason: str | None = None
    before: Evaluation | None = None
    after: Evaluation | None = None
    after_step: int | None = None
    note: str | None = None
    validation: Validation | None = None
    lm_eval: LmEvalBlock | None = None

    @classmethod
    def of(cls, document) -> SeedMetrics:
        d = document if isinstance(document, dict) else {}  # anything else shows nothing (``raw`` keeps it)
        ev = d.get("eval") if isinstance(d.get("eval"), dict) else {}
        return cls(
            document=d,
            raw=document,
            final_loss=d.get("final_loss"),
            steps=d.get("steps"),
            tokens_per_s=d.get("tokens_per_s"),
            train_time_s=d.get("train_time_s"),
            lm_eval_time_s=d.get("lm_eval_time_s"),
            reward_first=_number(d.get("reward_first")),
            reward_last=_number(d.get("reward_last")),
            stop_reason=d.get("stop_reason"),
            before=Evaluation.of(ev.get("before")),
            after=Evaluation.of(ev.get("after")),
            after_step=ev.get("after_step"),
            note=ev.get("note"),
            validation=Validation.of(d.get("validation")),
            lm_eval=LmEvalBlock.of(d.get("lm_eval")),
        )

    def to_json(self):
        return self.raw


def seeds_metrics(found: dict | None) -> dict[str, SeedMetrics] | None:
    """Each seed's metrics (``seed0``: its metrics.json), typed."""
    return None if found is None else {k: SeedMetrics.of(m) for k, m in found.items()}


@dataclass(frozen=True)
class MemberMetrics:
    """A sweep member's figures, as ``status SWEEP`` ranks and lists them: the held-out score and loss
    after training, the last logged reward, the final training loss; None where its run has none.
    ``to_json()`` names those it has, in ``NAMES``' order (``status SWEEP --json``'s ``metrics``)."""

    eval_score: float | None = None
    reward: float | None = None
    eval_loss: float | None = None
    final_loss: float | None = None

    NAMES: ClassVar[tuple[str, ...]] = ("eval_score", "reward", "eval_loss", "final_loss")

    @classmethod
    def of(cls, m: SeedMetrics | None) -> MemberMetrics:
        if m is None:
            return cls()
        after = m.after or Evaluation()
        return cls(_figure(after.score), _figure(m.reward_last), _figure(after.loss), _figure(m.final_loss))

    def get(self, name: str) -> float | None:
        return getattr(self, name) if name in self.NAMES else None

    def to_json(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.NAMES if getattr(self, k) is not None}


def _figure(v) -> float | None:
    return None if _number(v) is None else float(v)
