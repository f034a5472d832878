"""SFT with TRL's SFTTrainer: prompt/completion rows, loss on the completion (assistant) tokens only.

Chats (examples with a ``conversation``) learn every assistant turn: see ``engine.train.conversations``.
"""

from __future__ import annotations

import dataclasses

from autoslm.catalog import model_info
from autoslm.engine.distributed import process_count, trainer_kwargs, uses_fsdp
from autoslm.engine.train.data import count_too_long, sft_rows
from autoslm.engine.train.training_args import common_args, total_steps
from autoslm.errors import FatalWorkerError
from autoslm.recipes.batching import plan_sft_batches


def sft_config_kwargs(spec, device, attn: str, *, seed: int, output_dir, max_steps: int, run_name: str | None = None) -> dict:
    """SFTConfig keywords: the shared arguments, the micro-batch sized from the GPU's memory, and the
    GPU recipe (padding-free batches when the attention kernel honours position ids, Liger kernels)."""
    from autoslm.engine.train.recipe import sft_micro_batch, use_checkpointing, use_liger, use_padding_free

    train = spec.train
    fsdp = uses_fsdp(spec, device.cuda)
    procs = process_count(spec)
    device = dataclasses.replace(device, world_size=procs)
    info = model_info(spec.model)
    micro = sft_micro_batch(train, info, device, strategy="fsdp" if fsdp else "ddp")
    ckpt = use_checkpointing(train, device, info, strategy="fsdp" if fsdp else "ddp")  # only where memory needs it
    # batch_size sequences per optimizer step on 1 or N processes, micro-batches sized from memory
    plan = plan_sft_batches(train.model_copy(update={"micro_batch_size": micro}), procs)
    padding_free = use_padding_free(train, attn) and not train.packing
    return dict(
        **common_args(
            train,
            seed=seed,
            output_dir=output_dir,
            max_steps=max_steps,
            device=device,
            fsdp=fsdp,
            checkpointing=ckpt,
            run_name=run_name,
        ),
        **plan.config_kwargs(),
        **trainer_kwargs(spec, cuda=device.cuda, checkpointing=ckpt),
        # Padding-free without packing: TRL 1.16 refuses max_length (it would not enforce it); the rows are
        # cut to train.max_length after TRL prepares them instead (``sft_trainer``).
        max_length=None if padding_free else train.max_length,
        # Packing fills each row up to max_length with whole examples (best-fit decreasing; a longer one is
        # cut), so batch_size then counts packed rows, not examples.
        packing=train.packing,
        packing_strategy="bfd",
        padding_free=padding_free,
        use_liger_kernel=use_liger(train, info, device),
        completion_only_loss=True,
        dataset_num_proc=None,
    )


def build_trainer(
    spec,
    *,
    model,
    tokenizer,
    env,
    seed: int,
    output_dir,
    callbacks,
    reporter,
    device=None,
    attn: str | None = None,
    adjust=None,
    run_name: str | None = None,
):
    """The SFTTrainer for this run. ``device`` and ``attn`` (the attention kernel; default: the loaded
    model's) decide the recipe; ``adjust`` (a test's hook) may rewrite the SFTConfig keywords, e.g. to
    train a GPU recipe on a CPU. ``run_name``: what the trackers call the run."""
    from trl import SFTConfig

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
    attn = attn or getattr(getattr(model, "config", None), "_attn_implementation", None) or "sdpa"
    kwargs = sft_config_kwargs(spec, device, attn, seed=seed, output_dir=output_dir, max_steps=steps, run_name=run_name)
    args = SFTConfig(**(adjust(kwargs) if adjust else kwargs))
    trainer = sft_trainer(
        model=model, args=args, rows=rows, tokenizer=tokenizer, callbacks=callbacks, max_length=train.max_length
    )
    if len(trainer.train_dataset) == 0:
        # TRL drops examples whose completion was cut away entirely: nothing is left to learn.
        raise FatalWorkerError(
            f"no example fits in train.max_length = {train.max_length} tokens with its answer",
            hint="raise train.max_length",
        )
    return trainer


def sft_trainer(*, model, args, rows: list[dict], tokenizer, callbacks, max_length: int, peft_config=None):
    """autoslm's SFTTrainer on ``rows``, every row at most ``max_length`` tokens: TRL cuts them itself unless
    the batches are padding-free without packing (``args.max_length`` None), where they are cut after TRL
    has tokenized them and built their labels (``truncate_prepared``)."""
    import functools

    from datasets import Dataset

    from autoslm.engine.train.sft_trainer import AutoslmSFTTrainer

    cut = functools.partial(truncate_prepared, max_length=max_length) if args.max_length is None and not args.packing else None
    return AutoslmSFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=callbacks,
        peft_config=peft_config,
        cut=cut,
    )


def truncate_prepared(dataset, max_length: int):
    """A prepared dataset (``input_ids``, ``labels``) cut to ``max_length`` tokens per row, as TRL cuts
    with ``truncation_mode="keep_start"``; rows left without a trained token are dropped."""

    def cut(row):
        return {"input_ids": row["input_ids"][:max_length], "labels": row["labels"][:max_length]}

    dataset = dataset.map(cut)
    return dataset.filter(lambda row: any(t != -100 for t in row["labels"]))


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
