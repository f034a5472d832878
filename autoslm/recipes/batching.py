"""How an optimizer step is cut into processes, forward passes and (GRPO) generation batches. Pure
arithmetic: no torch, no TRL import.

The batch sizes in a JobSpec are what one optimizer step optimizes, on 1 process or on N
(``compute.gpu_count``): SFT's ``batch_size`` sequences, GRPO's ``prompts_per_step x group_size``
completions. ``plan_sft_batches`` and ``plan_grpo_batches`` split that over the processes, then into
forward passes (the rest is gradient accumulation); a spec whose numbers do not divide gets a
``BatchingError`` naming the field and a value that works (``autoslm validate`` reports it).

SFT: ``batch_size = per_device_train_batch_size x num_processes x gradient_accumulation_steps``.

GRPO: the JobSpec speaks in prompts per optimizer step, completions per prompt (``group_size``) and processes;
TRL 1.16's ``GRPOTrainer`` speaks in ``per_device_train_batch_size`` (completions per forward pass per
process), ``gradient_accumulation_steps`` and ``steps_per_generation``. ``plan_grpo_batches`` maps one onto
the other so that every optimizer step optimizes exactly ``prompts_per_step x group_size`` completions:

    completions_per_step = prompts_per_step * group_size
                         = per_device_train_batch_size * num_processes * gradient_accumulation_steps
    steps_per_generation = gradient_accumulation_steps   (one generation batch per optimizer step)
    generation_batch_size = completions_per_step         (divisible by group_size: whole groups only)

unless the generation batch must be split (``generation_rounds`` > 1: transformers' generate() holds the KV
cache of its whole batch, and a whole step's may not fit; ``catalog.fit_report`` decides): then
``steps_per_generation = gradient_accumulation_steps / generation_rounds``, each round whole groups per
process. Every round is sampled by the same policy (the optimizer steps only after the last), so the step
stays on-policy, and TRL still skips the old-logprob pass (steps_per_generation <= accumulation).

TRL checks (grpo_config.py): generation_batch_size == per_device * processes * steps_per_generation and
generation_batch_size % num_generations == 0. Its sampler repeats each prompt ``num_generations`` times
in a row and hands every process a contiguous slice. autoslm makes each slice whole groups
(``prompts_per_step`` a multiple of the processes), as TRL's colocate mode generates: each rank's
vLLM samples whole groups of its own prompts, and dynamic sampling can judge and replace a rank's
groups locally (rewards are still gathered across processes before advantages are computed). Keeping
steps_per_generation equal to gradient_accumulation_steps means the completions are always sampled by
the current policy. TRL then skips the extra old-logprob forward pass only with transformers
generation: with vLLM it runs it anyway (``vllm_importance_sampling_correction``, on by default, which
autoslm keeps), about +25% of a step's training compute; ``catalog.step_seconds`` counts it.

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
    # (generation_rounds = gradient_accumulation_steps / steps_per_generation rounds per optimizer step)
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


@dataclass(frozen=True)
class SFTBatchPlan:
    batch_size: int  # sequences per optimizer step, all processes together
    num_processes: int
    per_device_train_batch_size: int  # sequences per forward pass per process
    gradient_accumulation_steps: int

    def config_kwargs(self) -> dict[str, Any]:
        return {
            "per_device_train_batch_size": self.per_device_train_batch_size,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
        }

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def plan_sft_batches(train: Any, num_processes: int = 1, written: str | None = None) -> SFTBatchPlan:
    """Plan an SFT step: ``batch_size`` sequences over ``num_processes``, ``micro_batch_size`` per forward
    pass (default: a process's whole share at once). ``written``: how the spec sets the processes, for
    messages (``ComputeSpec.ranks_written``; default "compute.gpu_count = N")."""
    batch = int(train.batch_size)
    procs = int(num_processes or 1)
    micro = getattr(train, "micro_batch_size", None)
    if procs < 1:
        raise BatchingError("compute.gpu_count", f"must be at least 1, got {procs}")
    if batch % procs:
        raise BatchingError(
            "train.batch_size",
            f"batch_size {batch} cannot be split evenly over {procs} processes ({written or f'compute.gpu_count = {procs}'}): "
            f"set it to {_nearby_multiples(batch, procs)} (a multiple of {procs})",
        )
    per_process = batch // procs
    micro = per_process if micro is None else int(micro)
    if micro < 1 or per_process % micro:
        fits = _largest_divisor(per_process, max(1, micro))
        where = f" (batch_size {batch} over {procs} processes)" if procs > 1 else ""
        raise BatchingError(
            "train.micro_batch_size",
            f"micro_batch_size {micro} does not divide the {per_process} sequences each process handles per step{where}: "
            f"use micro_batch_size = {fits}, or set batch_size to {_nearby_multiples(batch, micro * procs)}",
        )
    return SFTBatchPlan(batch, procs, micro, per_process // micro)


def plan_grpo_batches(
    train: Any, num_processes: int | None = None, generation_rounds: int = 1, written: str | None = None
) -> GRPOBatchPlan:
    """Plan a GRPO step from the ``[train]`` section (a ``GRPOTrain``, or anything with the same fields)
    on ``num_processes`` processes (``compute.nodes x gpu_count``), generated in ``generation_rounds`` calls.
    ``written``: how the spec sets the processes, for messages (``ComputeSpec.ranks_written``)."""
    prompts = int(train.prompts_per_step)
    group = int(train.group_size)
    procs = int(num_processes or getattr(train, "num_processes", None) or 1)
    micro = getattr(train, "micro_batch_size", None)
    max_length = int(getattr(train, "max_length", 512) or 512)
    if prompts < 1:
        raise BatchingError("train.prompts_per_step", f"must be at least 1, got {prompts}")
    if group < 2:
        raise BatchingError(
            "train.group_size", f"GRPO compares completions of one prompt: group_size must be at least 2, got {group}"
        )
    if procs < 1:
        raise BatchingError("compute.gpu_count", f"must be at least 1, got {procs}")

    total = prompts * group
    if prompts % procs:
        # Each process generates and scores whole groups of its own prompts.
        raise BatchingError(
            "train.prompts_per_step",
            f"{prompts} prompts per step cannot be split into whole groups over {procs} processes "
            f"({written or f'compute.gpu_count = {procs}'}): set prompts_per_step to {_nearby_multiples(prompts, procs)} (a multiple of {procs})",
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
            # prompts_per_step must stay a multiple of procs, and (prompts/procs) * group a multiple of micro.
            step = procs * (micro // math.gcd(group, micro))
            where = f" over {procs} processes" if procs > 1 else ""
            raise BatchingError(
                "train.micro_batch_size",
                f"micro_batch_size {micro} does not divide the {per_process} completions each process handles per step "
                f"({prompts} prompts x {group} completions{where}): use micro_batch_size = {fits}, "
                f"or keep {micro} and set prompts_per_step to {_nearby_multiples(prompts, step)}",
            )

    accum = per_process // micro
    rounds = max(1, int(generation_rounds))
    if accum % rounds or (per_process // rounds) % group:
        raise BatchingError(
            "train.micro_batch_size",
            f"{per_process} completions per process cannot be generated in "
            f"{rounds} rounds of whole groups of {group} and whole micro-batches of {micro}",
        )
    plan = GRPOBatchPlan(
        prompts_per_step=prompts,
        group_size=group,
        num_processes=procs,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accum,
        steps_per_generation=accum // rounds,
        generation_batch_size=total // rounds,
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
    assert (p.completions_per_step // p.num_processes) % p.group_size == 0  # whole groups per process
    assert (p.generation_batch_size // p.num_processes) % p.group_size == 0  # each round too
    assert p.gradient_accumulation_steps % p.steps_per_generation == 0  # whole rounds per optimizer step
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
