"""TrainingArguments shared by every method, from the JobSpec (never from environment variables)."""

from __future__ import annotations

import math
from pathlib import Path


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def total_steps(train, n_examples: int, examples_per_step: int) -> int:
    """Optimizer steps for the run: max_steps, else epochs over the data. Fixed at start, so a resumed
    run ends at the same step as an uninterrupted one."""
    if train.max_steps:
        return train.max_steps
    return max(1, math.ceil(train.epochs * math.ceil(n_examples / examples_per_step)))


def tracker_run_name(run_id: str, seed: int) -> str:
    """A seed's run as W&B, MLflow and trackio show it: the autoslm run id, then the seed."""
    return f"{run_id}-seed{seed}"


def scheduler_type(train) -> str:
    """The Trainer's scheduler name. transformers' "constant" has no warm-up at all, so a constant
    schedule with ``warmup_ratio > 0`` is its "constant_with_warmup" (the JobSpec's warm-up is honoured)."""
    if train.lr_scheduler == "constant" and train.warmup_ratio > 0:
        return "constant_with_warmup"
    return train.lr_scheduler


def common_args(
    train,
    *,
    seed: int,
    output_dir: Path,
    max_steps: int,
    device=None,
    fsdp: bool = False,
    checkpointing: bool | None = None,
    run_name: str | None = None,
) -> dict:
    """TrainingArguments keywords every method shares. ``device`` (an ``engine.train.recipe.Device``, detected
    when None) decides precision and checkpointing: the GPU recipe on CUDA, fp32 without recompute on CPU.
    ``fsdp``: FSDP does the activation checkpointing (``engine.distributed.trainer_kwargs``). ``run_name``:
    what the trackers in ``report_to`` call the run (``tracker_run_name``), not the output directory."""
    from autoslm.engine.train.recipe import Device, checkpointing_kwargs, precision_kwargs

    device = device or Device.detect()
    return dict(
        output_dir=str(output_dir),
        max_steps=max_steps,
        learning_rate=train.learning_rate,
        lr_scheduler_type=scheduler_type(train),
        warmup_steps=train.warmup_ratio,
        weight_decay=train.weight_decay,
        logging_steps=train.log_every,
        save_strategy="steps",
        save_steps=train.save_every,
        save_total_limit=2,  # local copies only: the uploader snapshots each checkpoint when it is saved
        report_to=list(train.report_to) or "none",
        run_name=run_name,
        seed=seed,
        data_seed=seed,
        **precision_kwargs(train, device),
        **checkpointing_kwargs(train, device, fsdp=fsdp, on=checkpointing),
        include_num_input_tokens_seen="non_padding",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
