"""SFT with TRL's SFTTrainer: prompt/completion rows, loss on the completion (assistant) tokens only.

Chats (examples with a ``conversation``) learn every assistant turn: see ``engine.train.conversations``.
"""

from __future__ import annotations

import dataclasses

from autoslm.catalog import model_info
from autoslm.recipes.batching import plan_sft_batches
from autoslm.engine.train.data import count_too_long, sft_rows
from autoslm.engine.distributed import process_count, trainer_kwargs
from autoslm.engine.train.training_args import common_args, total_steps
from autoslm.errors import FatalWorkerError


def sft_config_kwargs(spec, device, attn: str, *, seed: int, output_dir, max_steps: int) -> dict:
    """SFTConfig keywords: the shared arguments, the micro-batch sized from the GPU's memory, and the
    GPU recipe (padding-free batches when the attention kernel honours position ids, Liger kernels)."""
    from autoslm.engine.train.recipe import sft_micro_batch, use_liger, use_padding_free

    train = spec.train
    procs = process_count(spec)
    device = dataclasses.replace(device, world_size=procs)
    info = model_info(spec.model)
    micro = sft_micro_batch(train, info, device)
    # batch_size sequences per optimizer step on 1 or N processes, micro-batches sized from memory
    plan = plan_sft_batches(train.model_copy(update={"micro_batch_size": micro}), procs)
    padding_free = use_padding_free(train, attn) and not train.packing
    return dict(
        **common_args(train, seed=seed, output_dir=output_dir, max_steps=max_steps, device=device),
        **plan.config_kwargs(),
        **trainer_kwargs(spec, cuda=device.cuda),
        max_length=train.max_length,
        packing=train.packing,
        padding_free=padding_free,
        use_liger_kernel=use_liger(train, info, device),
        completion_only_loss=True,
        dataset_num_proc=None,
    )


def build_trainer(spec, *, model, tokenizer, env, seed: int, output_dir, callbacks, reporter, device=None):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from autoslm.engine.train.recipe import Device

    train = spec.train
    device = device or Device.detect()
    examples = [e for e in env.train_examples() if e.target is not None]
    if not examples:
        raise FatalWorkerError(f"environment {spec.environment.id}: no examples with an SFT target")
    if any(e.conversation is not None for e in examples):
        rows, too_long = _chat_rows(examples, tokenizer, spec, reporter)
    else:
        rows = sft_rows(examples, tokenizer, spec.thinking, env.tools())
        too_long = count_too_long(rows[:512], tokenizer, train.max_length)
    if too_long:
        reporter.event("truncated", sample=min(len(rows), 512), too_long=too_long, max_length=train.max_length)
    steps = total_steps(train, len(rows), train.batch_size)
    attn = getattr(getattr(model, "config", None), "_attn_implementation", None) or "sdpa"
    args = SFTConfig(**sft_config_kwargs(spec, device, attn, seed=seed, output_dir=output_dir, max_steps=steps))
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


def _chat_rows(examples, tokenizer, spec, reporter) -> tuple[list[dict], int]:
    from autoslm.engine.train import conversations

    pairs = conversations.chats(examples)
    template = conversations.training_template(tokenizer)
    if template is not None:
        rows, too_long = conversations.tokenized_rows(pairs, tokenizer, template, spec.thinking, spec.train.max_length)
        reporter.event("sft_chats", chats=len(pairs), rows=len(rows), loss_mask="assistant tokens (chat template)")
        return rows, too_long
    rows = conversations.per_turn_rows(pairs, tokenizer, spec.thinking)
    reporter.event("sft_chats", chats=len(pairs), rows=len(rows), loss_mask="one row per assistant turn")
    return rows, count_too_long(rows[:512], tokenizer, spec.train.max_length)
