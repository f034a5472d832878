"""The worker's training, phase by phase: begin -> data -> load -> trainer -> before-eval -> train ->
after-eval -> save -> report. ``runner._train`` calls them in that order; each reads and fills one
``Job``, the attempt's shared state. Training that stops before the run's time or money limit
(engine/pod/limits.py) goes through the same after-eval, save and report: the run hands back what it
learned, and metrics.json and the last heartbeat name the limit.

Each phase does one thing the worker's log and heartbeats name. What a phase decides (the distributed
strategy, how the "before" evaluation is had, whether training stopped short, what metrics.json says)
is a small pure function beside it, tested on its own (tests/unit/test_worker_phases.py). Nothing here
runs at import time; torch, transformers and TRL are imported inside the phases that use them.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from autoslm.engine.distributed import Ranks
from autoslm.engine.pod.context import WorkerContext
from autoslm.errors import FatalWorkerError, StoreUnavailable
from autoslm.layout import RunPaths
from autoslm.store import RunArtifacts


@dataclass
class Job:
    """One training attempt: what the runner hands in, and what each phase adds for the next."""

    ctx: WorkerContext
    spec: Any
    artifacts: RunArtifacts
    uploader: Any
    reporter: Any
    ranks: Ranks
    t_start: float = field(default_factory=time.time)
    prefetch: dict = field(default_factory=dict)
    dist_info: dict = field(default_factory=dict)
    strategy: str | None = None
    device: Any = None
    env: Any = None  # the environment (envs/)
    judge: Any = None
    eval_examples: list = field(default_factory=list)
    max_new: int = 16
    model_path: str | None = None
    tokenizer: Any = None
    model: Any = None
    resume: tuple[int, Path] | None = None  # (step, checkpoint dir) when the attempt resumes
    trainer: Any = None
    progress: Any = None
    run_eval: Callable[..., dict | None] = lambda model, when="during": None  # (model, "before" | "during" | "after")
    synced: bool = False
    max_steps: int = 0
    eval_before: dict | None = None
    validation: Any = None  # engine/pod/validation.py: [eval]'s evaluations, best adapter, early stop
    limit_stop: Any = None  # engine/pod/limits.py: the stop before the run's time or money limit
    setup_s: float = 0.0
    lm_eval: dict | None = None  # engine/pod/lm_eval_phase.py: metrics.json's lm_eval block


@dataclass(frozen=True)
class Trained:
    """What the train phase ends with."""

    final_step: int
    loss: float | None
    train_s: float
    limit: Any = None  # the limits.LimitEnd training stopped before, short of max_steps


@dataclass(frozen=True)
class HandedBack:
    """The adapter the run hands back: its evaluation and the step it is from (the last step, or with
    keep_best the best evaluation's), and what the run says about the choice."""

    result: dict | None
    step: int
    note: str | None = None
    last: dict | None = None  # with keep_best: the evaluation of the last state, which is not handed back


# ---------------------------------------------------------------------------------------------------
# begin


def distributed_info(spec, ranks: Ranks, cuda: bool, backend: str | None = None) -> tuple[dict, str | None]:
    """(what worker_start says about the processes, the strategy they train with): a sharded strategy
    needs CUDA, so CPU processes fall back to DDP and say so."""
    if not ranks.distributed:
        return {}, None
    from autoslm.engine.distributed import effective_strategy

    strategy = effective_strategy(spec, cuda)
    info = {"world_size": ranks.world_size, "backend": backend, "strategy": strategy}
    if strategy != spec.compute.strategy:
        info["note"] = f'compute.strategy = "{spec.compute.strategy}" needs CUDA: these CPU processes train with DDP'
    return info, strategy


def begin(job: Job) -> bool:
    """The setup heartbeat and the worker_start event; False when DONE is already there (nothing to do)."""
    ctx, reporter, ranks = job.ctx, job.reporter, job.ranks
    job.prefetch = {"model_prefetch_s": ctx.prefetch_s} if ctx.prefetch_s is not None else {}
    reporter.beat("setup", metrics=job.prefetch)
    if ranks.distributed:
        from autoslm.engine.train.training_args import has_cuda

        cuda = has_cuda()
        job.dist_info, job.strategy = distributed_info(job.spec, ranks, cuda, backend=ranks.join(cuda))
    if ranks.on_main(lambda: is_done(job.artifacts)):
        reporter.event("already_done")
        reporter.beat("done", message="DONE was already there: nothing to do")
        return False
    reporter.event(
        "worker_start", attempt=ctx.attempt, host=platform.node(), python=sys.version.split()[0], **job.prefetch, **job.dist_info
    )
    return True


def is_done(artifacts: RunArtifacts, tries: int = 5, sleep=time.sleep) -> bool:
    """DONE there? A store that cannot tell is retried, then fails the attempt: never "not done"."""
    delay = 1.0
    for i in range(tries):
        try:
            return artifacts.is_done()
        except StoreUnavailable:
            if i == tries - 1:
                raise
            sleep(delay)
            delay *= 2
    return False


# ---------------------------------------------------------------------------------------------------
# data


def generation_budget(spec) -> int:
    """Tokens generated per held-out answer: the rollout length for GRPO, a short answer for SFT."""
    from autoslm.recipes.evaluation import answer_tokens

    return answer_tokens(spec.train)


def load_data(job: Job) -> None:
    """Wait for the GPU, then the environment (rank 0 first: it fetches the shipped data files), its
    judge checked, and the held-out examples."""
    from autoslm.engine.train.recipe import Device
    from autoslm.envs.registry import load_environment
    from autoslm.store.shipping import DataFiles

    spec, ranks = job.spec, job.ranks
    job.device = Device.detect()
    if job.device.cuda:
        from autoslm.engine.train.gpu import wait_for_gpu

        if ranks.distributed:
            from autoslm.engine.distributed import probe_device

            wait_for_gpu(timeout_s=300, probe=lambda: probe_device(ranks.local_rank))
        else:
            wait_for_gpu(timeout_s=300)
    # Data files shipped with the run come from the store's copy, never from a path on the laptop.
    # Rank 0 fetches them first; the other ranks then find them on the disk they share.
    data_files = DataFiles(job.artifacts.store, job.ctx.workdir / "data")
    env = load_environment(spec, files=data_files) if ranks.is_main else None
    ranks.barrier()
    job.env = env if env is not None else load_environment(spec, files=data_files)
    job.judge = getattr(job.env, "judge", None)
    if job.judge is not None:
        job.judge.client.preflight()  # a bad judge URL or key fails now, not after an hour of rollouts
    job.eval_examples = job.env.eval_examples()[: spec.train.eval_samples]
    job.max_new = generation_budget(spec)


# ---------------------------------------------------------------------------------------------------
# load


def load_model(job: Job) -> None:
    """The tokenizer and model, then the adapter: a fresh LoRA, or the one an SFT run left (GRPO's
    init_from_adapter); the checkpoint to resume from is found here too."""
    from autoslm.catalog import model_info
    from autoslm.engine.train import models
    from autoslm.engine.train.recipe import cpu_threads

    ctx, spec, reporter, ranks, artifacts = job.ctx, job.spec, job.reporter, job.ranks, job.artifacts
    reporter.beat("loading")
    t_load = time.time()
    # Rank 0 builds a built-in model (transformers writes files from global rank 0 only).
    job.model_path = ranks.on_main(lambda: models.resolve_model_path(spec.model, ctx.home))
    job.tokenizer = models.load_tokenizer(job.model_path, spec.trust_remote_code)
    info = model_info(spec.model)
    threads = cpu_threads(info, job.device)
    if threads:  # before any torch work: the built-in model's CPU runs then repeat step for step
        import torch

        torch.set_num_threads(threads)
    # Under a distributed launcher each process loads onto its own GPU (LOCAL_RANK is the launcher's).
    load = models.load_kwargs(spec, info, job.device, local_rank=int(os.environ.get("LOCAL_RANK", "0")))
    model = models.load_model(
        job.model_path,
        load,
        on_fallback=lambda wanted, reason: reporter.event(
            "attention_fallback",
            wanted=wanted,
            got="sdpa",
            reason=reason,
            note="padding-free SFT is off on sdpa" if spec.train.method == "sft" else "",
        ),
    )
    reporter.event(
        "model_loaded",
        seconds=round(time.time() - t_load, 2),
        model=spec.model,
        quantization="4bit" if "quantization_config" in load else None,
        device=job.device.to_dict(),
        attn_implementation=getattr(model.config, "_attn_implementation", None),
        dtype=load["dtype"],
        cpu_threads=None if job.device.cuda else _torch_threads(),
    )

    # Read on rank 0, into the directory the ranks share: every rank resumes from the same checkpoint.
    job.resume = ranks.on_main(lambda: artifacts.fetch_latest_checkpoint(ctx.workdir / "resume"))
    init_adapter = None
    if continues_adapter(spec, job.resume):
        init_adapter = ranks.on_main(lambda: fetch_init_adapter(artifacts, spec, ctx))
    from transformers import set_seed

    set_seed(ctx.seed)  # the LoRA init draws from the global RNG: same seed, same run
    job.model = models.attach_adapter(model, spec, info, adapter_dir=init_adapter)
    reporter.event(
        "adapter", **models.adapter_summary(job.model, init_from=spec.train.init_from_adapter if init_adapter else None)
    )


def continues_adapter(spec, resume) -> bool:
    """Start from an earlier SFT run's adapter? Only a GRPO run that names one and has no checkpoint of
    its own (a resumed run's checkpoint already holds the continued adapter)."""
    return spec.train.method == "grpo" and bool(spec.train.init_from_adapter) and resume is None


def fetch_init_adapter(artifacts: RunArtifacts, spec, ctx: WorkerContext) -> Path:
    """The adapter of the earlier SFT run this GRPO run continues (same store, same seed if it has one)."""
    src_run = spec.train.init_from_adapter
    candidates = [RunPaths("sft", src_run, ctx.seed)] + [RunPaths("sft", src_run, s) for s in range(0, 8) if s != ctx.seed]
    for paths in candidates:
        src = RunArtifacts(artifacts.store, paths)
        if src.has_adapter():
            return src.fetch_adapter(ctx.workdir / "init_adapter")
    raise FatalWorkerError(
        f"train.init_from_adapter: run {src_run!r} has no adapter in {artifacts.store.uri}",
        hint="name a succeeded SFT run that used the same artifact store",
    )


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


# ---------------------------------------------------------------------------------------------------
# trainer


def build_trainer(job: Job) -> None:
    """The TRL trainer with autoslm's callbacks (progress and checkpoints, FSDP's whole adapter, the
    trackers), and the held-out evaluation it generates with."""
    from autoslm.engine.pod.best import StoreKeeper
    from autoslm.engine.pod.heartbeat import make_progress_callback
    from autoslm.engine.pod.validation import Validation
    from autoslm.engine.rollout.evaluate import Shard, episode_limits, eval_generator, eval_sampling, evaluate
    from autoslm.engine.train.training_args import tracker_run_name

    from autoslm.engine.pod.limits import LimitStop, run_end

    ctx, spec, reporter, ranks = job.ctx, job.spec, job.reporter, job.ranks
    job.limit_stop = limit_stop = LimitStop(
        run_end(ctx, spec, job.t_start), store=spec.artifacts.store, final_eval=spec.eval.at_end
    )
    job.progress = make_progress_callback(
        reporter, checkpoint_keep=spec.train.keep_checkpoints, limit_stop=limit_stop, ranks=ranks
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
    # The trainer is built before the "before" evaluation: on a GPU pod its colocated vLLM is then up
    # and generates the evaluation's completions (the fresh LoRA adapter is a no-op, so this is the base).
    trainer = method_trainer(
        spec,
        model=job.model,
        tokenizer=job.tokenizer,
        env=job.env,
        seed=ctx.seed,
        output_dir=ctx.workdir / "trainer",
        callbacks=callbacks,
        reporter=reporter,
        device=job.device,
        run_name=tracker_run_name(ctx.run_id, ctx.seed),
    )
    if fsdp_adapter is not None:
        fsdp_adapter.trainer = trainer
    if ranks.distributed:
        from autoslm.engine.distributed import plain_cpu_device

        plain_cpu_device(trainer)
    generator = eval_generator(trainer)
    sampling = eval_sampling(trainer, spec, ctx.seed)
    # Several processes generating with the model itself (no colocated vLLM) evaluate the model the
    # Trainer prepared, every rank in step (engine/distributed.py: on_prepared_model); one process, or
    # vLLM, evaluates now.
    job.synced = ranks.distributed and generator is None
    env, tokenizer, examples, synced = job.env, job.tokenizer, job.eval_examples, job.synced
    episode = episode_limits(spec, env)
    # Several training processes split the held-out rows and gather the results: each evaluates 1/N.
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

    job.trainer, job.run_eval, job.max_steps = trainer, run_eval, trainer.args.max_steps


def method_trainer(spec, **kw):
    if spec.train.method == "grpo":
        from autoslm.engine.train import grpo

        return grpo.build_trainer(spec, **kw)
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


def limit_words(limit, final_step: int, max_steps: int) -> str:
    """What the run says when a limit stopped its training short (status, metrics.json, the report)."""
    return f"{limit.words}: training stopped at step {final_step}/{max_steps} to save and hand back the adapter in time"


def final_eval_wanted(spec, trained: Trained, limit_stop, now: float) -> tuple[bool, str | None]:
    """(evaluate the last adapter?, why not in words): [eval] at_end, and at a limit stop only when the
    last evaluation's time fits before the limit with the save."""
    if not spec.eval.at_end:
        return False, None
    if trained.limit is None or limit_stop is None or limit_stop.eval_fits(now):
        return True, None
    return False, f"the final evaluation was skipped: no time left before {trained.limit.words}"


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


# ---------------------------------------------------------------------------------------------------
# after-eval, save, report


def evaluate_after(job: Job, trained: Trained) -> HandedBack:
    """The held-out evaluation of the last adapter, then the adapter to hand back: the last, or with
    keep_best the best evaluation's (its weights put back into the model, so save() writes them)."""
    from autoslm.engine.pod.validation import earlier_attempt

    step, validation, reporter = trained.final_step, job.validation, job.reporter
    reporter.beat("saving", step=step)
    result = None
    # Rank 0 decides for every rank (a split evaluation needs them all in it).
    wanted, skipped = job.ranks.on_main(lambda: final_eval_wanted(job.spec, trained, job.limit_stop, time.time()))
    if wanted:
        result = job.run_eval(job.trainer.model, "after")
        reporter.event("eval", when="after", **(result or {}))
        validation.consider(step, "after", result, job.trainer.model)
    elif skipped:
        reporter.event("eval_skipped", when="after", reason=skipped)
    chosen = validation.chosen(step)
    note = "; ".join(n for n in (validation.choice_note(chosen, step), skipped) if n) or None
    if chosen is None:
        return HandedBack(result, step, note)
    chosen.weights.put_into(job.trainer.model)  # this attempt's snapshot, or an earlier attempt's stored adapter
    reporter.event(
        "adapter_kept",
        step=chosen.step,
        when=chosen.when,
        metric=validation.metric,
        value=chosen.value,
        last_step=step,
        note=note,
        **earlier_attempt(chosen),
    )
    return HandedBack(chosen.result, chosen.step, note, last=result)


def save(job: Job) -> Path:
    """The trained adapter, written into the work directory (rank 0; every rank under FSDP)."""
    from autoslm.engine.distributed import save_adapter

    adapter_dir = job.ctx.workdir / "adapter"
    save_adapter(job.trainer, adapter_dir, job.ranks, job.strategy or "ddp")
    return adapter_dir


def run_metrics(job: Job, trained: Trained, after: HandedBack, tokens: int, now: float) -> dict:
    """metrics.json: what the run did, how long each part took, and the held-out scores: ``eval.before``
    of the adapter the run started from, ``eval.after`` of the one it hands back (``after_step``: the
    step it is from; ``eval.last`` the last state's when keep_best handed back another), and with
    [eval] the evaluations, the best and why training stopped."""
    ctx, spec, resume = job.ctx, job.spec, job.resume
    train_s = trained.train_s
    generated = getattr(job.progress, "generated", 0.0)  # GRPO: completion tokens written (heartbeat.py)
    # A resumed attempt's rate: the tokens it trained itself over the time it trained (``tokens`` counts
    # every attempt's, ``train_s`` this attempt's only).
    trained_here = tokens - getattr(job.progress, "tokens_at_start", 0)
    out = {
        "run_id": ctx.run_id,
        "seed": ctx.seed,
        "phase": spec.phase,
        "model": spec.model,
        "steps": trained.final_step,
        "total_steps": job.max_steps,
        "wall_time_s": round(now - job.t_start, 2),
        "setup_time_s": round(job.setup_s, 2),
        "train_time_s": round(train_s, 2),
        "tokens": tokens,
        "tokens_per_s": round(trained_here / train_s, 1) if train_s > 0 and trained_here > 0 else None,  # trained tokens
        **({"generated_tokens_per_s": round(generated / train_s, 1)} if generated and train_s > 0 else {}),
        "final_loss": None if trained.loss is None else round(float(trained.loss), 4),
        "eval": {"before": job.eval_before, "after": after.result, "after_step": after.step},
        "attempt": ctx.attempt,
        "resumed_from_step": (resume[0] if resume else 0) or None,
        "world_size": job.ranks.world_size,
        **({"strategy": job.strategy} if job.strategy else {}),
    }
    validation = job.validation
    if validation is not None and (validation.history or validation.keep_best):
        out["validation"] = validation.summary(validation.chosen(trained.final_step), trained.final_step)
        if after.note:
            out["eval"]["note"] = after.note
        if after.step != trained.final_step:  # what training itself ended with, for checks of learning
            out["eval"].update(last=after.last, last_step=trained.final_step)
    if validation is not None and validation.stopped is not None:
        out["stop_reason"] = validation.stop_reason()
    if trained.limit is not None:  # the run ends naming the limit, with this adapter
        out["limit"] = {"name": trained.limit.limit, "step": trained.final_step, "total_steps": job.max_steps, "by": "worker"}
        out["stop_reason"] = limit_words(trained.limit, trained.final_step, job.max_steps)
    return out


def report(job: Job, trained: Trained, after: HandedBack, adapter_dir: Path) -> None:
    """Adapter and metrics into the store, the last event and heartbeat, then DONE."""
    trainer, uploader, reporter, artifacts = job.trainer, job.uploader, job.reporter, job.artifacts
    metrics = run_metrics(job, trained, after, int(trainer.state.num_input_tokens_seen or 0), time.time())
    metrics.update(extra_metrics(trainer))
    if job.lm_eval is not None:
        metrics["lm_eval"], metrics["lm_eval_time_s"] = job.lm_eval, job.lm_eval.get("seconds")
    if job.judge is not None:
        metrics["judge"] = job.judge.client.stats.to_dict()
        job.judge.client.close()
    uploader.required(lambda: artifacts.put_adapter(adapter_dir), "adapter", timeout=600)
    uploader.required(lambda: artifacts.put_metrics(metrics), "metrics", timeout=300)
    # The last event and heartbeat go before DONE (a required write flushes progress first): once DONE
    # is seen the controller may terminate this pod at any moment.
    said = {k: v for k, v in (("stop_reason", metrics.get("stop_reason")), ("note", after.note)) if v}
    reporter.event(
        "done",
        steps=trained.final_step,
        final_loss=metrics["final_loss"],
        eval_after=after.result,
        adapter_step=after.step,
        **said,
    )
    reporter.beat(
        "done",
        step=trained.final_step,
        total_steps=job.max_steps,
        loss=metrics["final_loss"],
        **({"message": "; ".join(said.values())} if said else {}),
    )
    uploader.required(artifacts.mark_done, "DONE", timeout=300)


def extra_metrics(trainer) -> dict:
    """Method-specific summary (e.g. GRPO's reward curve), if the trainer keeps one."""
    fn = getattr(trainer, "autoslm_metrics", None)
    return fn() if callable(fn) else {}
