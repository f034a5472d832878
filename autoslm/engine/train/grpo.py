"""GRPO with TRL's GRPOTrainer: a LoRA policy learns from environment rewards.

Single-turn tasks sample ``group_size`` completions per prompt and score each; tool tasks hand TRL
the environment's tools (TRL runs the calls); multi-turn tasks play whole episodes through a
``rollout_func`` that trains only on the model's own tokens. On a GPU with vllm installed, rollouts
use vLLM colocated with the trainer (and on a CPU too with ``train.vllm.enabled = true`` and vLLM's
CPU build); otherwise transformers generation.

Every knob comes from ``[train]``; the batch shape from ``recipes.batching``, the generation path from
``engine.train.gpu``, rewards from ``engine.rollout.rewards``. Beside it: ``dynamic_sampling`` (a step
of each generation batch) and ``grpo_progress`` (what the run reports: per-step rewards and rollouts,
the advantage numbers, the reward curve).
"""

from __future__ import annotations

import dataclasses
import os

from autoslm.catalog import model_info
from autoslm.engine.distributed import process_count, trainer_kwargs, uses_fsdp
from autoslm.engine.rollout.rewards import rows_from_examples
from autoslm.engine.train.dynamic_sampling import DynamicSampling, merge_groups
from autoslm.engine.train.grpo_progress import advantage_metrics, make_grpo_callback, reward_summary
from autoslm.engine.train.training_args import common_args, total_steps
from autoslm.errors import FatalWorkerError
from autoslm.recipes.batching import plan_grpo_batches


def fit_prompts(examples, tokenizer, spec, tools=None):
    """Keep the prompts that leave room for a full completion; returns (rows, dropped, budget)."""
    train = spec.train
    budget = train.max_length - train.max_completion_tokens
    kept, dropped = [], 0
    for ex in examples:
        ids = tokenizer.apply_chat_template(
            ex.prompt,
            add_generation_prompt=True,
            tokenize=True,
            enable_thinking=spec.thinking,
            **({"tools": tools} if tools else {}),
        )
        if hasattr(ids, "keys"):  # some tokenizers return a BatchEncoding
            ids = ids["input_ids"]
        if len(ids) > budget:
            dropped += 1
        else:
            kept.append(ex)
    return rows_from_examples(kept), dropped, budget


def grpo_config_kwargs(
    spec,
    device,
    *,
    seed: int,
    output_dir,
    max_steps: int,
    multi_turn: bool = False,
    notes: list[str] | None = None,
    run_name: str | None = None,
) -> tuple[dict, object]:
    """(GRPOConfig keywords, batch plan): the shared arguments, the batch shape (micro-batches sized from
    the GPU's memory), generation (colocated vLLM or transformers) and the GPU recipe."""
    from autoslm.engine.distributed import effective_strategy
    from autoslm.engine.train.gpu import grpo_generation_config
    from autoslm.engine.train.recipe import memory_fit, use_checkpointing
    from autoslm.recipes.generation import sleep_allowed

    train = spec.train
    procs = process_count(spec)
    device = dataclasses.replace(device, world_size=procs)
    info = model_info(spec.model)
    strategy = effective_strategy(spec, device.cuda) if procs > 1 else "ddp"
    fsdp = uses_fsdp(spec, device.cuda)
    allow = sleep_allowed(spec, multi_turn)
    # One answer from the planner (catalog.fit_report), the same plan and --print-config show: the
    # micro-batch, the generation batch, vLLM's share and sleep mode, for the packages this device has.
    fit = memory_fit(train, info, device, strategy=strategy, allow_sleep=allow)
    micro = fit.micro if fit is not None and not train.micro_batch_size else None
    sized = train.model_copy(update={"micro_batch_size": micro}) if micro else train
    plan = plan_grpo_batches(sized, procs, fit.generation_rounds if fit is not None else 1)
    gen = grpo_generation_config(
        spec,
        info,
        device.cuda,
        device.has("vllm"),
        multi_turn=multi_turn,
        notes=notes,
        gpu_mem_gib=device.mem_gib,
        processes=procs,
        micro=plan.per_device_train_batch_size,
        strategy=strategy,
        fit=fit,
    )
    # TRL's GRPO counts the prompt and completion tokens of every generation batch into
    # state.num_input_tokens_seen itself; the Trainer's own count looks for input_ids, which GRPO's
    # batches lack, and would warn at every micro-step.
    ckpt = (
        fit.checkpointing
        if fit is not None and fit.checkpointing is not None
        else use_checkpointing(train, device, info, strategy=strategy)
    )
    common = {
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
        "include_num_input_tokens_seen": "no",
    }
    kwargs = dict(
        **common,
        **plan.grpo_config_kwargs(),
        **gen,
        **trainer_kwargs(spec, cuda=device.cuda, checkpointing=ckpt),
        max_tool_calling_iterations=4,
        log_completions=False,
    )
    return kwargs, plan


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
    adjust=None,
    run_name: str | None = None,
    named_rewards=None,
):
    """The GRPOTrainer for this run, its recipe decided for ``device``; ``adjust`` (a test's hook) may
    rewrite the GRPOConfig keywords, e.g. to train a GPU recipe on a CPU. ``run_name``: the trackers'.
    ``named_rewards``: ``[environment] rewards`` as ``envs.task_table.load_task`` loaded them (None: the
    task's own rewards)."""
    from datasets import Dataset
    from trl import GRPOConfig

    from autoslm.engine.train.recipe import Device
    from autoslm.engine.train.trainer import AutoslmGRPOTrainer

    train = spec.train
    device = device or Device.detect()
    tools = env.tools()
    rows = _prompt_rows(env, tokenizer, spec, tools, reporter)

    vllm_version = check_vllm(spec, device)
    notes: list[str] = []
    steps = total_steps(train, len(rows), train.prompts_per_step)
    config, plan = grpo_config_kwargs(
        spec, device, seed=seed, output_dir=output_dir, max_steps=steps, multi_turn=env.multi_turn, notes=notes, run_name=run_name
    )
    if adjust:
        config = adjust(config)
    use_vllm = config.get("use_vllm", False)
    llm_kwargs = _vllm_engine_args(model, spec, device) if use_vllm else {}
    engine = generation_engine(use_vllm, vllm_version or _vllm_version(), device)
    reporter.event("generation", engine=engine, use_vllm=use_vllm, notes=notes, batching=plan.to_dict())
    rewards = _reward_set(env, named_rewards, spec, tokenizer, use_vllm)
    args = GRPOConfig(**config, **rewards.grpo_config_kwargs())
    extra, rollout = _rollout(env, spec, tools, args.max_completion_length)
    progress = make_grpo_callback(reporter, rewards, rollout=rollout)
    gen_steps = generation_steps(
        spec,
        device,
        plan,
        engine,
        reporter,
        rollout=rollout,
        drop_over_length=args.mask_truncated_completions,
        pad_id=tokenizer.pad_token_id or 0,
    )
    trainer = AutoslmGRPOTrainer(
        model=model,
        reward_funcs=rewards.funcs,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[*callbacks, progress],
        steps=gen_steps,
        cuda=device.cuda,
        llm_kwargs=llm_kwargs,
        summary=reward_summary,
        **extra,
    )
    progress.trainer = trainer
    return trainer


def _vllm_engine_args(model, spec, device) -> dict:
    """Before colocated vLLM starts: the LoRA checked against tied layers (vLLM would never get a tied
    layer's update), on a CPU host its KV cache's size set, and the engine's extra keywords (a
    vision-language checkpoint served language-only, the CPU's engine arguments)."""
    from autoslm.engine.train.gpu import vision_engine_args
    from autoslm.engine.train.vllm_cpu import CPU_ENGINE_ARGS
    from autoslm.engine.train.vllm_sync import refuse_tied_lora

    refuse_tied_lora(model, spec)
    if not device.cuda:
        # vLLM's CPU backend reserves its KV cache up front from this variable (GiB); the JobSpec sets it.
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(spec.train.vllm.cpu_kv_cache_gib)
    info = model_info(spec.model)
    return {
        **vision_engine_args(info is not None and info.vision),
        **(CPU_ENGINE_ARGS if not device.cuda else {}),
    }


def _reward_set(env, named_rewards, spec, tokenizer, use_vllm: bool):
    """The run's TRL reward functions (``engine.rollout.rewards.build_reward_set``): the task's own or
    its named ones, thinking measured with the tokenizer; completions cut at the stop strings here
    unless vLLM stops on them itself."""
    from autoslm.engine.rollout.named_rewards import prepare as prepare_named
    from autoslm.engine.rollout.rewards import build_reward_set

    train = spec.train
    return build_reward_set(
        env,
        thinking=spec.thinking,
        thinking_length_penalty=train.thinking_length_penalty,
        count_tokens=lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]),
        stop=() if use_vllm else tuple(train.stop),
        named=prepare_named(
            list(named_rewards) if named_rewards is not None else None,
            answer_format=spec.environment.answer_format,
            on_error=spec.environment.on_reward_error,
        ),
    )


def generation_steps(spec, device, plan, engine: str, reporter, *, rollout, drop_over_length: bool, pad_id: int = 0):
    """The steps around each generation batch (``engine.train.trainer.GenerationSteps``) for this run.
    ``drop_over_length``: the trainer's own switch, not the spec's: it is off with stop strings (gpu.py),
    and the single-turn masking and the multi-turn dropping must agree."""
    import functools

    from autoslm.engine.rollout.halving import halving_generation
    from autoslm.engine.rollout.turns import TurnShaping
    from autoslm.engine.train.trainer import GenerationSteps

    train = spec.train
    shaping = None
    if rollout is not None:
        shaping = TurnShaping(rollout, plan.group_size, train.turn_loss_weights, drop_over_length, train.scale_rewards)

    def halving(generate):  # an out-of-memory batch generated again in halves, whole groups each (one process)
        return halving_generation(generate, plan, engine, reporter, lambda parts: merge_groups(parts, plan.group_size, pad_id))

    return GenerationSteps(
        shaping=shaping,
        sampling=DynamicSampling(plan.group_size, reporter) if train.dynamic_sampling else None,
        halving=halving,
        oom=functools.partial(generation_oom_error, spec, device, plan, engine),
        advantages=advantage_metrics,
    )


def _prompt_rows(env, tokenizer, spec, tools, reporter) -> list[dict]:
    """The training prompts that leave room for a completion; the others dropped and counted."""
    rows, dropped, budget = fit_prompts(env.train_examples(), tokenizer, spec, tools)
    if dropped:
        reporter.event("prompts_dropped", dropped=dropped, kept=len(rows), budget_tokens=budget)
    if not rows:
        raise FatalWorkerError(
            f"every prompt is longer than train.max_length - train.max_completion_tokens = {budget} tokens",
            hint="raise train.max_length or lower train.max_completion_tokens",
        )
    return rows


def _rollout(env, spec, tools, max_completion_tokens: int):
    """(the trainer's extra keywords, the multi-turn rollout or None) for this environment.
    ``max_completion_tokens``: the trainer's own budget (``GRPOConfig.max_completion_length``), which
    the rollout plays each episode against, so the per-turn share is taken from it too."""
    if not env.multi_turn:
        return ({"tools": tools} if tools else {}), None
    from autoslm.engine.rollout.multiturn import MultiTurnRollout
    from autoslm.recipes.grpo import turn_tokens

    # Each turn gets an equal share of the completion budget left after the environment's turns,
    # so one rambling turn cannot use up the whole episode.
    budget = spec.train.model_copy(update={"max_completion_tokens": max_completion_tokens})
    per_turn = turn_tokens(budget, env.max_turns, getattr(env, "env_turn_tokens", 0) or 0)
    rollout = MultiTurnRollout(env, thinking=spec.thinking, tools=tools, max_turn_tokens=per_turn)
    return {"rollout_func": rollout}, rollout


def check_vllm(spec, device) -> str | None:
    """With ``train.vllm.enabled = true``, import vllm now (before the model is handed to a trainer) and
    return its version; a failed import ends the run with one line. None otherwise."""
    if spec.train.vllm.enabled is not True:
        return None
    try:
        import vllm
    except Exception as e:  # noqa: BLE001 - any import failure (missing, a CUDA-only build, a broken torchvision)
        raise FatalWorkerError(
            f"train.vllm.enabled = true, but vllm does not import here ({type(e).__name__}: {str(e).splitlines()[0][:200]})",
            hint='install vLLM for this device (make setup-vllm builds .venv-vllm with its CPU build), or set train.vllm.enabled = "auto"',
        ) from None
    if "vllm" not in device.packages:
        raise FatalWorkerError("train.vllm.enabled = true, but vllm is not installed here")
    if not device.cuda and spec.train.vllm.sleep_mode is True:
        from vllm.platforms import current_platform

        if not current_platform.is_sleep_mode_available():
            raise FatalWorkerError(
                f"train.vllm.sleep_mode = true, but vLLM has no sleep mode on this {device.kind} host",
                hint='set train.vllm.sleep_mode = "auto"',
            )
    return str(getattr(vllm, "__version__", "?"))


def _vllm_version() -> str:
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "?"


def generation_engine(use_vllm: bool, version: str, device) -> str:
    """What generates the rollouts, for the worker's log: "colocated vLLM 0.31.0 (cpu)" or "transformers"."""
    if not use_vllm:
        return "transformers"
    return f"colocated vLLM {version.split('+')[0]} ({device.kind})"


def generation_oom_error(spec, device, plan, engine: str, batch: int) -> FatalWorkerError:
    """What a CUDA out-of-memory error while a step generates ``batch`` completions ends the run with. It is
    not a bad host: a new pod of the same GPU would generate the same batch and fail the same way
    (failures.py would retry it on up to limits.max_restarts pods)."""
    return FatalWorkerError(
        generation_oom_message(spec, device, plan, engine, batch),
        hint="lower train.prompts_per_step, group_size or max_length, or pick a GPU with more memory "
        "(`autoslm plan` shows the generation batch and peak per GPU)",
    )


def generation_oom_message(spec, device, plan, engine: str, batch: int) -> str:
    """One line with the numbers of a generation that ran out of GPU memory, and the planner's estimate."""
    from autoslm.catalog import fit_report

    t = spec.train
    where = f"{device.name} ({device.mem_gib or '?'} GiB)"
    planned = ""
    if device.mem_gib:
        fit = fit_report(
            spec.model,
            device.mem_gib,
            t.model_copy(update={"micro_batch_size": plan.per_device_train_batch_size}),
            processes=plan.num_processes,
            has_vllm=engine != "transformers",
        )
        if fit.need_gb is not None:
            planned = f"; the planner estimated a peak of {fit.need_gb:.1f} GiB"
    return (
        f"CUDA out of memory while generating {batch} completions of up to {t.max_length} tokens with {engine} on {where} "
        f"(generation batch {plan.generation_batch_size // max(1, plan.num_processes)} per process, micro-batch "
        f"{plan.per_device_train_batch_size}{planned}): a new pod would fail the same way"
    )


__all__ = [
    "build_trainer",
    "check_vllm",
    "fit_prompts",
    "generation_engine",
    "generation_oom_error",
    "generation_steps",
    "grpo_config_kwargs",
]
