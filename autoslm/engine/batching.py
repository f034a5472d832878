"""How a GRPO step is cut into generation and forward batches. Pure arithmetic: no torch, no TRL import.

The JobSpec speaks in prompts per optimizer step, completions per prompt (``group_size``) and processes;
TRL 1.16's ``GRPOTrainer`` speaks in ``per_device_train_batch_size`` (completions per forward pass per
process), ``gradient_accumulation_steps`` and ``steps_per_generation``. ``plan_grpo_batches`` maps one onto
the other so that every optimizer step optimizes exactly ``prompts_per_step x group_size`` completions:

    completions_per_step = prompts_per_step * group_size
                         = per_device_train_batch_size * num_processes * gradient_accumulation_steps
    steps_per_generation = gradient_accumulation_steps   (one generation batch per optimizer step)
    generation_batch_size = completions_per_step         (divisible by group_size: whole groups only)

TRL checks (grpo_config.py): generation_batch_size == per_device * processes * steps_per_generation and
generation_batch_size % num_generations == 0. Its sampler repeats each prompt ``num_generations`` times
in a row and hands every process a contiguous slice, so a group may straddle processes; rewards are
gathered across processes before advantages are computed, so that is fine. Keeping
steps_per_generation equal to gradient_accumulation_steps means the completions are always sampled by
the current policy (TRL then skips the extra old-logprob forward pass).

Anything that cannot be planned raises ``BatchingError`` naming the JobSpec field and a value that works.
This module must never import torch or trl: spec validation on a laptop imports it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

# Completions per forward pass per process when the spec leaves micro_batch_size unset. The first cap
# bounds the micro-batch outright; the second keeps tokens per forward pass (micro_batch * max_length)
# near 16k, which fits a LoRA forward/backward of the catalog's small models on a 24 GB card.
DEFAULT_MAX_MICRO_BATCH = 16
TOKENS_PER_MICRO_BATCH = 16384


class BatchingError(ValueError):
    """The requested GRPO batch shape cannot be built; ``field`` is the JobSpec path to change."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class GRPOBatchPlan:
    prompts_per_step: int
    group_size: int
    num_processes: int
    per_device_train_batch_size: int  # completions per forward pass per process
    gradient_accumulation_steps: int
    steps_per_generation: int
    generation_batch_size: int  # completions sampled per generation round, all processes together
    completions_per_step: int  # completions optimized per optimizer step, all processes together
    per_device_eval_batch_size: int  # TRL needs (this * num_processes) % group_size == 0 when it evaluates

    def grpo_config_kwargs(self) -> dict[str, Any]:
        """The GRPOConfig keyword arguments this plan fixes (never ``generation_batch_size``: TRL rejects
        it together with ``steps_per_generation``)."""
        return {
            "per_device_train_batch_size": self.per_device_train_batch_size,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "steps_per_generation": self.steps_per_generation,
            "num_generations": self.group_size,
            "num_generations_eval": self.group_size,
            "per_device_eval_batch_size": self.per_device_eval_batch_size,
        }

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def auto_micro_batch_cap(max_length: int) -> int:
    """The largest micro-batch chosen when the spec does not set one."""
    return max(1, min(DEFAULT_MAX_MICRO_BATCH, TOKENS_PER_MICRO_BATCH // max(1, max_length)))


def plan_grpo_batches(train: Any) -> GRPOBatchPlan:
    """Plan a GRPO step from the ``[train]`` section (a ``GRPOTrain``, or anything with the same fields)."""
    prompts = int(train.prompts_per_step)
    group = int(train.group_size)
    procs = int(getattr(train, "num_processes", 1) or 1)
    micro = getattr(train, "micro_batch_size", None)
    max_length = int(getattr(train, "max_length", 512) or 512)
    if prompts < 1:
        raise BatchingError("train.prompts_per_step", f"must be at least 1, got {prompts}")
    if group < 2:
        raise BatchingError("train.group_size", f"GRPO compares completions of one prompt: group_size must be at least 2, got {group}")
    if procs < 1:
        raise BatchingError("train.num_processes", f"must be at least 1, got {procs}")

    total = prompts * group
    if total % procs:
        step = procs // math.gcd(group, procs)  # prompts_per_step must be a multiple of this
        raise BatchingError(
            "train.prompts_per_step",
            f"{prompts} prompts x {group} completions = {total} completions per step cannot be split evenly over "
            f"{procs} processes: set prompts_per_step to {_nearby_multiples(prompts, step)} "
            f"(a multiple of {step}), or group_size to a multiple of {procs // math.gcd(prompts, procs)}",
        )
    per_process = total // procs

    if micro is None:
        cap = auto_micro_batch_cap(max_length)
        micro = _largest_divisor(per_process, cap)
    else:
        micro = int(micro)
        if micro < 1:
            raise BatchingError("train.micro_batch_size", f"must be at least 1, got {micro}")
        if per_process % micro:
            fits = _largest_divisor(per_process, micro)
            step = (micro * procs) // math.gcd(group, micro * procs)
            where = f" over {procs} processes" if procs > 1 else ""
            raise BatchingError(
                "train.micro_batch_size",
                f"micro_batch_size {micro} does not divide the {per_process} completions each process handles per step "
                f"({prompts} prompts x {group} completions{where}): use micro_batch_size = {fits}, "
                f"or keep {micro} and set prompts_per_step to {_nearby_multiples(prompts, step)}",
            )

    accum = per_process // micro
    plan = GRPOBatchPlan(
        prompts_per_step=prompts,
        group_size=group,
        num_processes=procs,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accum,
        steps_per_generation=accum,
        generation_batch_size=total,
        completions_per_step=total,
        per_device_eval_batch_size=_eval_batch(group, procs, micro),
    )
    check_plan(plan)
    return plan


def check_plan(plan: GRPOBatchPlan) -> None:
    """Assert the invariants TRL relies on (and the one the JobSpec promises)."""
    p = plan
    assert p.per_device_train_batch_size * p.num_processes * p.gradient_accumulation_steps == p.prompts_per_step * p.group_size
    assert p.generation_batch_size == p.per_device_train_batch_size * p.num_processes * p.steps_per_generation
    assert p.generation_batch_size % p.group_size == 0
    assert p.steps_per_generation == p.gradient_accumulation_steps
    assert (p.per_device_eval_batch_size * p.num_processes) % p.group_size == 0


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, min(n, max(1, at_most)) + 1) if n % d == 0)


def _eval_batch(group: int, procs: int, micro: int) -> int:
    # The smallest per-process eval batch whose global size holds whole groups, grown in whole units
    # towards the training micro-batch so eval is not needlessly slow.
    unit = group // math.gcd(group, procs)
    return unit * max(1, micro // unit)


def _nearby_multiples(value: int, step: int) -> str:
    below = (value // step) * step
    above = below + step
    if below >= 1 and below != value:
        return f"{below} or {above}"
    return str(above)
