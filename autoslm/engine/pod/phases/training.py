"""The worker's training phases (engine/pod/phases/): trainer (the TRL trainer with autoslm's
callbacks, and the held-out evaluation it generates with), before-eval (the evaluation of the model
training starts from, kept in train_meta.json) and train (to max_steps, stop_at or the run's limit,
from the checkpoint the attempt resumes)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from autoslm.engine.distributed import Ranks
from autoslm.engine.pod.phases.job import Job, Trained

# ---------------------------------------------------------------------------------------------------
# trainer


def build_trainer(job: Job) -> None:
    """The TRL trainer with autoslm's callbacks (progress and checkpoints, FSDP's whole adapter, the
    trackers), and the held-out evaluation it generates with."""
    from autoslm.engine.train.training_args import tracker_run_name

    ctx, spec, ranks = job.ctx, job.spec, job.ranks
    callbacks, fsdp_adapter = trainer_callbacks(job)
    # The trainer is built before the "before" evaluation: on a GPU pod its colocated vLLM is then up
    # and generates the evaluation's completions (the fresh LoRA adapter is a no-op, so this is the base).
    trainer = method_trainer(
        spec,
        model=job.model,
        tokenizer=job.tokenizer,
        env=job.env,
        named_rewards=job.task.rewards,
        seed=ctx.seed,
        output_dir=ctx.workdir / "trainer",
        callbacks=callbacks,
        reporter=job.reporter,
        device=job.device,
        run_name=tracker_run_name(ctx.run_id, ctx.seed),
    )
    if fsdp_adapter is not None:
        fsdp_adapter.trainer = trainer
    if ranks.distributed:
        from autoslm.engine.distributed import plain_cpu_device

        plain_cpu_device(trainer)
    job.trainer, job.run_eval, job.max_steps = trainer, held_out_eval(job, trainer), trainer.args.max_steps


def trainer_callbacks(job: Job) -> tuple[list, Any]:
    """(the trainer's callbacks, in order; FSDP's whole-adapter callback or None, which needs the
    trainer once built). It sets the job's limit stop, progress callback and [eval] validation."""
    from autoslm.engine.pod.best import StoreKeeper
    from autoslm.engine.pod.heartbeat import make_progress_callback
    from autoslm.engine.pod.limits import LimitStop, run_end
    from autoslm.engine.pod.lm_eval_phase import harness_seconds
    from autoslm.engine.pod.validation import Validation

    ctx, spec, reporter, ranks = job.ctx, job.spec, job.reporter, job.ranks
    job.limit_stop = LimitStop(
        run_end(ctx, spec, job.t_start),
        store=spec.artifacts.store,
        final_eval=spec.eval.at_end,
        harness_s=harness_seconds(spec, job.device),  # lm-eval after the hand-back, where its time can be told
    )
    job.progress = make_progress_callback(
        reporter, checkpoint_keep=spec.train.keep_checkpoints, limit_stop=job.limit_stop, ranks=ranks
    )
    callbacks = [job.progress]
    job.validation = Validation.from_spec(spec, ranks, keeper=StoreKeeper(job))
    if job.validation.every and job.eval_examples:  # before the uploading callback: it marks an early stop's checkpoint
        callbacks.insert(0, job.validation.callback(lambda m: job.run_eval(m), reporter))
    fsdp_adapter = None
    if job.strategy == "fsdp" and ranks.distributed:
        from autoslm.engine.distributed import fsdp_adapter_callback

        fsdp_adapter = fsdp_adapter_callback(ranks)
        callbacks.insert(0, fsdp_adapter)  # the whole adapter is in a checkpoint before it is uploaded
    if spec.train.report_to:
        from autoslm.engine.pod.trackers import make_tracker_callback

        callbacks.append(make_tracker_callback(reporter, spec.train.report_to))
    return callbacks, fsdp_adapter


def held_out_eval(job: Job, trainer) -> Callable[..., dict | None]:
    """``run_eval(model, when)``: the held-out evaluation, generating as ``trainer`` does (its colocated
    vLLM, else the model itself); it sets ``job.synced``. Several training processes split the held-out
    rows and gather the results: each evaluates 1/N."""
    from autoslm.engine.rollout.evaluate import Shard, episode_limits, eval_generator, eval_sampling, evaluate

    spec, reporter, ranks, limit_stop = job.spec, job.reporter, job.ranks, job.limit_stop
    generator = eval_generator(trainer)
    sampling = eval_sampling(trainer, spec, job.ctx.seed)
    # Several processes generating with the model itself (no colocated vLLM) evaluate the model the
    # Trainer prepared, every rank in step (engine/distributed.py: on_prepared_model); one process, or
    # vLLM, evaluates now.
    job.synced = ranks.distributed and generator is None
    env, tokenizer, examples, synced = job.env, job.tokenizer, job.eval_examples, job.synced
    episode = episode_limits(spec, env)
    shard = Shard(ranks.rank, ranks.world_size, ranks.gather)

    def run_eval(m, when="during"):
        if not examples:
            return None
        progress = reporter.evaluating(when, stage="saving" if when == "after" else "training")
        t0 = time.time()
        result = evaluate(
            m,
            tokenizer,
            env,
            examples,
            spec.thinking,
            job.max_new,
            generator=generator,
            sampling=sampling,
            synced=synced,
            episode=episode,
            progress=progress,
            shard=shard,
        )
        limit_stop.evaluated(time.time() - t0)  # what a final evaluation would take, should a limit come
        return result

    return run_eval


def method_trainer(spec, *, named_rewards=None, **kw):
    """The method's trainer; ``named_rewards``: the task's ``[environment] rewards`` (GRPO scores with them)."""
    if spec.train.method == "grpo":
        from autoslm.engine.train import grpo

        return grpo.build_trainer(spec, named_rewards=named_rewards, **kw)
    from autoslm.engine.train import sft

    return sft.build_trainer(spec, **kw)


# ---------------------------------------------------------------------------------------------------
# before-eval


def before_eval_source(meta_prev: dict | None, synced: bool, at_start: bool = True) -> str:
    """Where the "before" evaluation comes from: "previous" (a resumed attempt keeps the first attempt's,
    made on the model it started from), "none" ([eval] at_start = false), "prepared" (ranks in step,
    once the Trainer prepared the model) or "now"."""
    if meta_prev and "eval_before" in meta_prev:
        return "previous"
    if not at_start:
        return "none"
    return "prepared" if synced else "now"


def evaluate_before(job: Job) -> None:
    """The held-out evaluation of the model training starts from, kept in train_meta.json (so a resumed
    attempt reports the same "before"), and the first candidate for keep_best and stop_at; with keep_best,
    the best evaluation earlier attempts recorded is a candidate too (engine/pod/best.py)."""
    artifacts, ranks = job.artifacts, job.ranks
    start_step = job.resume[0] if job.resume else 0
    job.validation.recall_earlier()

    def keep(result) -> None:
        job.eval_before = result
        job.uploader.required(
            lambda: artifacts.put_train_meta(train_meta(job.ctx, job.spec, job.model_path, job.max_steps, result, ranks)),
            "train_meta",
            timeout=300,
        )

    def record(result) -> None:
        job.reporter.event("eval", when="before", **(result or {}))
        keep(result)
        job.validation.consider(start_step, "before", result, job.model)

    meta_prev = ranks.on_main(lambda: artifacts.get_json(artifacts.paths.train_meta)) if job.resume else None
    source = before_eval_source(meta_prev, job.synced, job.spec.eval.at_start)
    if source == "previous":
        keep(meta_prev["eval_before"])
        job.validation.consider(0, "before", meta_prev["eval_before"], candidate=False)
    elif source == "none":
        keep(None)
    elif source == "prepared":
        from autoslm.engine.distributed import on_prepared_model

        job.trainer.add_callback(on_prepared_model(lambda prepared: record(job.run_eval(prepared, "before"))))
    else:
        record(job.run_eval(job.model, "before"))
    job.setup_s = time.time() - job.t_start


def train_meta(ctx, spec, model_path, max_steps, eval_before, ranks: Ranks = Ranks()) -> dict:
    import peft
    import torch
    import transformers
    import trl

    return {
        "run_id": ctx.run_id,
        "seed": ctx.seed,
        "attempt": ctx.attempt,
        "model_path": model_path,
        "total_steps": max_steps,
        "eval_before": eval_before,
        "world_size": ranks.world_size,
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": trl.__version__,
            "peft": peft.__version__,
        },
        "spec": json.loads(spec.to_json()),
    }


# ---------------------------------------------------------------------------------------------------
# train


def train(job: Job) -> Trained:
    """Train to max_steps (from the checkpoint the attempt resumes, if any), or until [eval] stop_at is
    reached, or until the run's time or money limit is near: then it stops at a step boundary with a
    checkpoint saved, and the run goes on to hand back what it learned (``Trained.limit``)."""
    from autoslm.engine.pod.validation import stopped_at

    reporter, trainer, progress, resume = job.reporter, job.trainer, job.progress, job.resume
    resume_step = resume[0] if resume else 0
    if resume:
        reporter.event("resume", from_step=resume_step)
    reporter.beat("training", step=resume_step, total_steps=job.max_steps)
    t_train = time.time()
    if job.validation.stopped is not None:  # the adapter it starts from already reaches eval.stop_at
        reporter.event("early_stop", step=resume_step, reason=job.validation.stop_reason())
        return Trained(resume_step, None, 0.0)
    if resume and (finished_checkpoint(resume[1]) or stopped_at(resume[1])):
        # Resuming from the final checkpoint (or the one where stop_at ended training) would train on:
        # load its weights instead.
        job.validation.stopped = job.validation.stopped or stopped_at(resume[1])
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(trainer.model, load_file(str(resume[1] / "adapter_model.safetensors")))
        loss, final_step = last_loss(resume[1]), resume_step
    else:
        out = trainer.train(resume_from_checkpoint=str(resume[1]) if resume else None)
        loss = progress.last_loss if progress.last_loss is not None else out.training_loss
        final_step = trainer.state.global_step
    hit = getattr(progress, "limit_hit", None)
    return Trained(final_step, loss, time.time() - t_train, limit=hit if hit is not None and final_step < job.max_steps else None)


def finished_checkpoint(ckpt: Path) -> bool:
    try:
        state = json.loads((ckpt / "trainer_state.json").read_text())
        return state["global_step"] >= state["max_steps"]
    except (OSError, ValueError, KeyError):
        return False


def last_loss(ckpt: Path) -> float | None:
    try:
        history = json.loads((ckpt / "trainer_state.json").read_text())["log_history"]
        return next((h["loss"] for h in reversed(history) if "loss" in h), None)
    except (OSError, ValueError, KeyError):
        return None
