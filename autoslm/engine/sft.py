"""SFT with TRL's SFTTrainer: prompt/completion rows, loss on the completion (assistant) tokens only."""

from __future__ import annotations

from autoslm.engine.batching import plan_sft_batches
from autoslm.engine.data import count_too_long, sft_rows
from autoslm.engine.distributed import process_count, trainer_kwargs
from autoslm.engine.training_args import common_args, total_steps
from autoslm.errors import FatalWorkerError


def build_trainer(spec, *, model, tokenizer, env, seed: int, output_dir, callbacks, reporter):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    train = spec.train
    examples = [e for e in env.train_examples() if e.target is not None]
    if not examples:
        raise FatalWorkerError(f"environment {spec.environment.id}: no examples with an SFT target")
    rows = sft_rows(examples, tokenizer, spec.thinking, env.tools())
    too_long = count_too_long(rows[:512], tokenizer, train.max_length)
    if too_long:
        reporter.event("truncated", sample=min(len(rows), 512), too_long=too_long, max_length=train.max_length)
    plan = plan_sft_batches(train, process_count(spec))  # batch_size sequences per step on 1 or N processes
    steps = total_steps(train, len(rows), train.batch_size)
    args = SFTConfig(
        **common_args(train, seed=seed, output_dir=output_dir, max_steps=steps),
        **plan.config_kwargs(),
        **trainer_kwargs(spec),
        max_length=train.max_length,
        packing=train.packing,
        completion_only_loss=True,
        dataset_num_proc=None,
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    if len(trainer.train_dataset) == 0:
        # TRL drops examples whose completion was cut away entirely: nothing is left to learn.
        raise FatalWorkerError(
            f"no example fits in train.max_length = {train.max_length} tokens with its answer",
            hint="raise train.max_length",
        )
    return trainer
