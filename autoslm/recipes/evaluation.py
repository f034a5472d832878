"""``[eval]``: held-out validation during training, and the rules that read its results.

When it runs (at the start, every N steps, at the end), how it scores (the greedy score, the mean of
``samples`` answers drawn per prompt at the training temperature, pass@k over those answers, the loss),
when it ends training early (``stop_at``) and which adapter the run hands back (``keep_best``). The
engine evaluates (engine/rollout/evaluate.py) and keeps the best adapter (engine/pod/validation.py);
the rules here are pure functions, shared with ``validate``, so both read a metric the same way.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# GRPO's sampled evaluation draws this many answers per held-out prompt unless [eval] samples says.
GRPO_SAMPLES = 4
# An SFT run's held-out answer: a few tokens, enough for the short answers its tasks score.
SFT_ANSWER_TOKENS = 16
# How the engine generates held-out answers (engine/rollout/evaluate.py), which plan's time counts too:
# transformers' generate() answers this many prompts per call (and multi-turn plays this many episodes
# together); a GenerateFn (colocated vLLM) gets up to GENERATOR_CHUNK prompts per call, its usual
# concurrency (max_num_seqs), each call followed by a heartbeat.
EVAL_BATCH = 32
GENERATOR_CHUNK = 256
_PASS = re.compile(r"^pass@([1-9][0-9]*)$")
METRICS_HELP = '"score" (greedy answers), "score_sampled" (the mean reward of the sampled answers), "pass@K" (K <= samples) or "loss" (lower is better)'


class EvalSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    every: Annotated[
        int,
        Field(ge=0, description="evaluate on the held-out examples every N optimizer steps (0 = at the start and the end only)"),
    ] = 0
    samples: Annotated[
        int | None,
        Field(
            ge=0,
            le=256,
            description="answers sampled per held-out prompt at the training temperature, for score_sampled and pass@k (default: 4 for GRPO, 0 for SFT)",
        ),
    ] = None
    temperature: Annotated[
        float | None,
        Field(gt=0, le=5, description="sampling temperature of those answers (default: train.temperature for GRPO, 1.0 for SFT)"),
    ] = None
    at_start: Annotated[
        bool, Field(description="evaluate the adapter training starts from (metrics.json eval.before; a candidate for keep_best)")
    ] = True
    at_end: Annotated[bool, Field(description="evaluate the adapter the run hands back (metrics.json eval.after)")] = True
    metric: Annotated[str, Field(description=f"what stop_at and keep_best read: {METRICS_HELP}")] = "score"
    stop_at: Annotated[
        float | None,
        Field(description="end training (successfully) once the metric reaches this: at or above it, or at or below it for loss"),
    ] = None
    keep_best: Annotated[
        bool | Literal["auto"],
        Field(
            description="keep the adapter of the best evaluation by the metric; auto = on for a GRPO run that continues an adapter (init_from_adapter), where RL can end worse than it started"
        ),
    ] = "auto"
    adapter: Annotated[
        Literal["best", "last"],
        Field(
            description="what the run hands back when keep_best is on: the best evaluation's adapter, or the last one (the best is then only reported)"
        ),
    ] = "best"
    pass_threshold: Annotated[
        float, Field(description="a sampled answer passes (for pass@k) when its reward is at least this")
    ] = 1.0
    lm_eval: Annotated[
        list[str],
        Field(
            description="lm-evaluation-harness tasks run on the base model and on the final adapter, after training: "
            'task names of lm-eval (e.g. "gsm8k") or task YAML files in the spec\'s folder'
        ),
    ] = []
    lm_eval_shots: Annotated[
        int | None,
        Field(ge=0, le=64, description="few-shot examples for every lm_eval task (default: each task's own, 5 for gsm8k)"),
    ] = None
    lm_eval_limit: Annotated[
        int | None, Field(ge=1, description="score only the first N samples of each lm_eval task (default: all)")
    ] = None

    @field_validator("metric")
    @classmethod
    def _metric(cls, v: str) -> str:
        if v not in ("score", "score_sampled", "loss") and not _PASS.match(v):
            raise ValueError(f"must be {METRICS_HELP}, got {v!r}")
        return v


def pass_k(metric: str) -> int | None:
    """K of a "pass@K" metric, else None."""
    m = _PASS.match(metric)
    return int(m.group(1)) if m else None


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k from ``n`` samples of which ``c`` passed (Chen et al. 2021, the
    Codex paper): 1 - C(n-c, k) / C(n, k), the chance that k of the n drawn without replacement hold at
    least one pass. Computed as a product so that large n cannot overflow."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n and 0 <= c <= n (n = {n}, c = {c})")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def lower_is_better(metric: str) -> bool:
    return metric == "loss"


def reached(metric: str, value: float | None, target: float | None) -> bool:
    """Has an evaluation's metric reached ``stop_at``?"""
    if target is None or value is None:
        return False
    return value <= target if lower_is_better(metric) else value >= target


def at_least_as_good(metric: str, value: float | None, best: float | None) -> bool:
    """Does ``value`` take the best's place? Ties go to the later evaluation (the adapter trained on
    longer, equally good by the metric); a missing value never does."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    if best is None:
        return True
    return value <= best if lower_is_better(metric) else value >= best


def sample_count(ev: EvalSpec, method: str) -> int:
    return ev.samples if ev.samples is not None else (GRPO_SAMPLES if method == "grpo" else 0)


def answer_tokens(train) -> int:
    """Tokens generated per held-out answer: the rollout length for GRPO, a short answer for SFT."""
    return train.max_completion_tokens if train.method == "grpo" else SFT_ANSWER_TOKENS


def evaluation_count(ev: EvalSpec, train, steps: int) -> int:
    """Held-out evaluations a run of ``steps`` optimizer steps makes: at the start, every ``ev.every``
    steps before the last, and at the end; none with ``train.eval_samples = 0``."""
    if not train.eval_samples:
        return 0
    during = (steps - 1) // ev.every if ev.every and steps > 0 else 0
    return int(ev.at_start) + during + int(ev.at_end)


def evaluations_left(ev: EvalSpec, train, steps: int, resume_step: int) -> int:
    """Held-out evaluations an attempt that resumes at optimizer step ``resume_step`` of ``steps`` still
    makes: the "before" one again only when it starts from no checkpoint (a resumed attempt keeps the
    first attempt's, engine/pod/phases/training.py ``before_eval_source``), those at the ``ev.every`` steps past
    ``resume_step``, and the one at the end."""
    if resume_step <= 0:
        return evaluation_count(ev, train, steps)
    if not train.eval_samples:
        return 0
    during = max(0, (steps - 1) // ev.every - resume_step // ev.every) if ev.every and steps > 0 else 0
    return during + int(ev.at_end)


def keeps_best(ev: EvalSpec, train) -> bool:
    if ev.keep_best != "auto":
        return ev.keep_best
    return train.method == "grpo" and bool(getattr(train, "init_from_adapter", None))


def hands_back_best(ev: EvalSpec, train) -> bool:
    """Does the run hand back keep_best's choice rather than its last adapter? (``eval.adapter = "best"``
    under keep_best.) The worker's own hand-back and the controller's at a limit both ask."""
    return keeps_best(ev, train) and ev.adapter == "best"


def eval_spec_issues(ev: EvalSpec, train, compute) -> list[tuple[str, str]]:
    """(field, message) for what no single field can check."""
    out = []
    k, n = pass_k(ev.metric), sample_count(ev, train.method)
    if k is not None and k > n:
        out.append(
            (
                "eval.metric",
                f"{ev.metric} needs at least {k} sampled answers per prompt, and eval.samples is {n}: "
                f"set eval.samples = {max(k, GRPO_SAMPLES)}",
            )
        )
    if ev.metric == "score_sampled" and n == 0:
        out.append(("eval.metric", "score_sampled needs sampled answers: set eval.samples (e.g. 4)"))
    if train.eval_samples == 0 and (ev.stop_at is not None or ev.keep_best is True or ev.every):
        out.append(
            (
                "train.eval_samples",
                "is 0, so nothing is evaluated, but [eval] asks for evaluations (every, stop_at or keep_best): "
                "set train.eval_samples (e.g. 64)",
            )
        )
    if keeps_best(ev, train) and compute.gpu_count > 1 and compute.strategy == "fsdp":
        out.append(
            (
                "eval.keep_best",
                'is not supported with compute.strategy = "fsdp" (the adapter is sharded over the GPUs): '
                'set keep_best = false, or use strategy = "ddp"',
            )
        )
    return out
