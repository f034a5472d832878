"""GRPO with TRL's GRPOTrainer: a LoRA policy learns from environment rewards.

Single-turn tasks sample ``group_size`` completions per prompt and score each; tool tasks hand TRL
the environment's tools (TRL runs the calls); multi-turn tasks play whole episodes through a
``rollout_func`` that trains only on the model's own tokens. On a GPU with vllm installed, rollouts
use vLLM colocated with the trainer (and on a CPU too with ``train.vllm.enabled = true`` and vLLM's
CPU build); otherwise transformers generation.

Every knob comes from ``[train]``; the batch shape from ``recipes.batching``, the generation path from
``engine.train.gpu``, rewards from ``engine.rollout.rewards``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

from autoslm.catalog import model_info
from autoslm.recipes.batching import plan_grpo_batches
from autoslm.engine.distributed import process_count, trainer_kwargs, uses_fsdp
from autoslm.engine.rollout.rewards import rows_from_examples
from autoslm.engine.train.training_args import common_args, total_steps
from autoslm.errors import FatalWorkerError

# Reward-curve summary: the mean reward of the first and of the last tenth of the logged steps.
CURVE_FRACTION = 10
# Completions dumped per step as "rollout" events (the whole batch would swamp the event log).
ROLLOUTS_PER_STEP = 2


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
    from autoslm.recipes.generation import sleep_allowed
    from autoslm.engine.train.recipe import memory_fit, use_checkpointing

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
):
    """The GRPOTrainer for this run, its recipe decided for ``device``; ``adjust`` (a test's hook) may
    rewrite the GRPOConfig keywords, e.g. to train a GPU recipe on a CPU. ``run_name``: the trackers'."""
    from datasets import Dataset
    from trl import GRPOConfig

    from autoslm.engine.train.gpu import vision_engine_args
    from autoslm.engine.train.recipe import Device
    from autoslm.engine.train.trainer import AutoslmGRPOTrainer
    from autoslm.engine.train.vllm_cpu import CPU_ENGINE_ARGS
    from autoslm.engine.rollout.named_rewards import prepare as prepare_named
    from autoslm.engine.rollout.rewards import build_reward_set

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
    if use_vllm:
        from autoslm.engine.train.vllm_sync import refuse_tied_lora

        refuse_tied_lora(model, spec)  # before vLLM starts: it would never get a tied layer's update
    if use_vllm and not device.cuda:
        # vLLM's CPU backend reserves its KV cache up front from this variable (GiB); the JobSpec sets it.
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(train.vllm.cpu_kv_cache_gib)
    engine = generation_engine(use_vllm, vllm_version or _vllm_version(), device)
    reporter.event("generation", engine=engine, use_vllm=use_vllm, notes=notes, batching=plan.to_dict())
    rewards = build_reward_set(
        env,
        thinking=spec.thinking,
        thinking_length_penalty=train.thinking_length_penalty,
        count_tokens=lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]),
        stop=() if use_vllm else tuple(train.stop),
        named=prepare_named(
            getattr(env, "named_rewards", None),
            answer_format=spec.environment.answer_format,
            on_error=spec.environment.on_reward_error,
        ),
    )
    args = GRPOConfig(**config, **rewards.grpo_config_kwargs())
    extra, rollout = _rollout(env, spec, tools, args.max_completion_length)
    progress = make_grpo_callback(reporter, rewards, rollout=rollout)
    info = model_info(spec.model)
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
    llm_kwargs = {
        **vision_engine_args(use_vllm and info is not None and info.vision),
        **(CPU_ENGINE_ARGS if use_vllm and not device.cuda else {}),
    }
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


def generation_steps(spec, device, plan, engine: str, reporter, *, rollout, drop_over_length: bool, pad_id: int = 0):
    """The steps around each generation batch (``engine.train.trainer.GenerationSteps``) for this run.
    ``drop_over_length``: the trainer's own switch, not the spec's: it is off with stop strings (gpu.py),
    and the single-turn masking and the multi-turn dropping must agree."""
    import functools

    from autoslm.engine.rollout.turns import TurnShaping
    from autoslm.engine.train.trainer import GenerationSteps

    from autoslm.engine.rollout.halving import halving_generation

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


def reward_summary(log_history: list[dict]) -> dict:
    """The reward curve from the trainer's log (which a resumed run restores from its checkpoint).
    A step where no completion could be scored (every reward None, ``on_reward_error = "none"``) logs
    its reward as None (TRL) or NaN: it has no point on the curve, and when no step has one, the first
    and last rewards are None."""
    logged = [h for h in log_history if "reward" in h and "step" in h]
    if not logged:
        return {}
    curve = [
        (h["step"], float(h["reward"])) for h in logged if isinstance(h["reward"], (int, float)) and math.isfinite(h["reward"])
    ]
    if not curve:
        return {"reward_first": None, "reward_last": None, "reward_curve": []}
    rewards = [r for _, r in curve]
    k = max(1, len(rewards) // CURVE_FRACTION)
    return {
        "reward_first": round(sum(rewards[:k]) / k, 4),
        "reward_last": round(sum(rewards[-k:]) / k, 4),
        "reward_curve": [[s, round(r, 4)] for s, r in curve],
    }


def make_grpo_callback(reporter, rewards, *, rollout=None):
    """Streams GRPO's per-step numbers (TRL already logs reward, reward_std, frac_reward_zero_std,
    KL, entropy, clip ratio, completion length, learning rate), each reward function's mean and a few
    rollouts per step. (Held-out evaluation during training is [eval]'s: engine/pod/validation.py.)"""
    from transformers import TrainerCallback

    class GRPOProgress(TrainerCallback):
        def __init__(self):
            self.trainer = None

        def on_log(self, args, state, control, logs=None, **kw):
            per_fn = rewards.log.drain()
            errors = rewards.log.drain_errors()
            if per_fn or errors:
                reporter.event(
                    "rewards",
                    step=state.global_step,
                    **{f"reward/{k}": round(v, 4) for k, v in per_fn.items()},
                    **{f"reward_errors/{k}": n for k, n in errors.items()},
                )
            if rollout is not None:  # multi-turn: whole episodes, the environment's turns included
                episodes = sorted(rollout.last_episodes, key=lambda e: e.turns, reverse=True)[:ROLLOUTS_PER_STEP]
                dump = [_jsonable(e.to_json()) for e in episodes]
            else:
                dump = _recent_rollouts(self.trainer, ROLLOUTS_PER_STEP)
            if dump:
                reporter.event("rollout", step=state.global_step, samples=dump)

    return GRPOProgress()


def _recent_rollouts(trainer, n: int) -> list[dict]:
    """The last ``n`` completions TRL kept for its completion log (with transcripts for multi-turn)."""
    logs = trainer.recent_completions(64) if trainer is not None else {}  # the latest steps only
    if not logs:
        return []
    rewards = logs["rewards"]
    extra = {k: v for k, v in logs["extra"].items() if k in ("transcript", "turns")}
    items = []
    for i, c in enumerate(logs["completion"]):
        item = {"completion": _jsonable(c), "rewards": {k: v[i] for k, v in rewards.items() if i < len(v)}}
        for k, v in extra.items():
            if i < len(v):
                item[k] = _jsonable(v[i])
        items.append(item)
    # Prefer rollouts where a tool ran or the episode had several turns: they show the most.
    return sorted(items, key=_richness, reverse=True)[:n]


def _richness(item: dict) -> int:
    messages = item["completion"] if isinstance(item["completion"], list) else []
    messages = messages + (item.get("transcript") or [])
    return sum(1 for m in messages if isinstance(m, dict) and m.get("role") in ("tool", "user", "assistant"))


def _jsonable(x):
    try:
        json.dumps(x)
        return x
    except TypeError:
        return str(x)


class DynamicSampling:
    """Drop groups whose rewards are all equal (zero advantage: they teach nothing) and fill the step
    with informative groups drawn from fresh prompts, as in DAPO / NeMo RL dynamic sampling.

    A step of the trainer's generation batch (``engine.train.trainer``): after the batch is scored, its
    all-equal groups are replaced by informative groups of up to ``max_draws`` extra batches of fresh
    prompts (the step keeps exactly the same number of groups; if draws run out, the leftover all-equal
    groups stay, contributing no gradient).

    On several processes each rank holds whole groups of its own prompts (recipes/batching.py) and
    replaces its own all-equal groups. TRL gathers rewards across ranks inside every generation call,
    so all ranks must draw equally often: they draw while any rank still lacks groups (a sum over
    torch.distributed), each taking its own share of one shared stream of fresh prompts.
    """

    def __init__(self, group_size: int, reporter, max_draws: int = 4):
        self.group_size, self.reporter, self.max_draws = group_size, reporter, max_draws
        self._rows = None  # the stream of fresh prompts, from the trainer's dataset at the first call

    def __call__(self, trainer, inputs, generate):
        """The generation batch for ``inputs``, made by ``generate`` (TRL's, scored), its all-equal groups
        replaced. ``trainer``: its dataset, seed, tokenizer and accelerator (public attributes)."""
        import random

        if self._rows is None:
            self._rows = _cycle_rows(trainer.train_dataset, random.Random(trainer.args.seed))
        group_size = self.group_size
        tok = trainer.processing_class
        pad_id = tok.pad_token_id if hasattr(tok, "pad_token_id") else 0
        acc = trainer.accelerator
        world, rank = acc.num_processes, acc.process_index

        def total(n: int) -> int:  # summed over every rank
            if world == 1:
                return n
            import torch

            return int(acc.reduce(torch.tensor([n], device=acc.device), reduction="sum").item())

        out = generate(inputs)
        n_groups = len(inputs) // group_size
        keep = informative_groups(out["advantages"], group_size)
        draws = 0
        parts = [(out, keep)]
        have = len(keep)
        while draws < self.max_draws and total(n_groups - have) > 0:
            draws += 1
            shared = [next(self._rows) for _ in range(n_groups * world)]
            mine = shared[rank * n_groups : (rank + 1) * n_groups]
            fresh = generate([r for r in mine for _ in range(group_size)])
            good = informative_groups(fresh["advantages"], group_size)[: n_groups - have]
            parts.append((fresh, good))
            have += len(good)
        if draws == 0:
            return out
        leftover = [g for g in range(n_groups) if g not in keep][: n_groups - have]
        parts[0] = (out, keep + leftover)
        dropped, filled = total(n_groups - len(keep)), total(have - len(keep))
        self.reporter.event("dynamic_sampling", dropped_groups=dropped, draws=draws, filled=filled, processes=world)
        return merge_groups(parts, group_size, pad_id)


def advantage_metrics(out: dict) -> dict[str, float]:
    """What TRL does not log about a generation batch: the mean |advantage| of the completions trained on,
    and the share of their tokens that carry a non-zero advantage (a flat reward with these near zero means
    no signal reached the loss; with them healthy, the signal is there and the recipe is too weak)."""
    adv, mask = out.get("advantages"), out.get("completion_mask")
    if adv is None or not adv.numel():
        return {}
    metrics = {"advantage/abs_mean": adv.abs().mean().item()}
    if mask is not None and adv.dim() == 1:
        tokens = mask.sum().clamp(min=1)
        metrics["advantage/token_share"] = ((adv != 0).unsqueeze(1) * mask).sum().item() / tokens.item()
    return metrics


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


def informative_groups(advantages, group_size: int, tol: float = 1e-8) -> list[int]:
    """Indices of the groups whose advantages are not all zero."""
    values = advantages.tolist()
    return [
        g for g in range(len(values) // group_size) if any(abs(v) > tol for v in values[g * group_size : (g + 1) * group_size])
    ]


def merge_groups(parts, group_size: int, pad_id: int) -> dict:
    """One generation batch from the chosen groups of several: prompts stay left-padded, completions
    right-padded, everything per completion is selected row by row."""
    import torch

    base = parts[0][0]
    n = base["advantages"].shape[0]
    merged = {}
    for key, value in base.items():
        if not (torch.is_tensor(value) and value.dim() >= 1 and value.shape[0] == n):
            merged[key] = value
            continue
        pieces = []
        for out, groups in parts:
            idx = torch.tensor([g * group_size + j for g in groups for j in range(group_size)], dtype=torch.long)
            if len(idx):
                pieces.append(out[key].index_select(0, idx.to(out[key].device)))
        if value.dim() == 1:
            merged[key] = torch.cat(pieces)
            continue
        width = max(p.shape[1] for p in pieces)
        fill = pad_id if key.endswith("_ids") else 0
        left = key.startswith("prompt")
        padded = []
        for p in pieces:
            extra = width - p.shape[1]
            if extra:
                pad = torch.full((p.shape[0], extra, *p.shape[2:]), fill, dtype=p.dtype, device=p.device)
                p = torch.cat([pad, p] if left else [p, pad], dim=1)
            padded.append(p)
        merged[key] = torch.cat(padded)
    if "num_items_in_batch" in base and torch.is_tensor(merged.get("completion_mask")):
        total = merged["completion_mask"]
        if torch.is_tensor(merged.get("tool_mask")):
            total = total * merged["tool_mask"]
        merged["num_items_in_batch"] = (
            total.sum().to(base["num_items_in_batch"].dtype) if torch.is_tensor(base["num_items_in_batch"]) else int(total.sum())
        )
    return merged


def _cycle_rows(dataset, rng):
    order = list(range(len(dataset)))
    while True:
        rng.shuffle(order)
        for i in order:
            yield dataset[i]


__all__ = [
    "DynamicSampling",
    "advantage_metrics",
    "build_trainer",
    "generation_oom_error",
    "fit_prompts",
    "informative_groups",
    "merge_groups",
    "reward_summary",
]
