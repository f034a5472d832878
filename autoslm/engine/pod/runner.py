"""The worker, top to bottom: setup -> resume -> train -> save -> report -> clean up.

Started as ``python -m autoslm.engine`` by a provider. Everything it needs comes from its environment
(see ``context.py``) and the JobSpec; nothing happens at import time and nothing is global.

Exit codes: 0 done (or already done), 1 a retryable error (the controller may relaunch), 2 an error a
restart cannot fix (bad spec, missing data, time limit), 143 stopped by SIGTERM (preempted).
Every error is written to ``error_<phase>.txt`` and an error heartbeat before the worker exits.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path

from autoslm.engine.pod.context import WorkerContext
from autoslm.engine.distributed import NullUploader, Ranks, should_launch
from autoslm.errors import AutoslmError, FatalWorkerError, StoreUnavailable
from autoslm.layout import WORKER_EXIT_DONE, WORKER_EXIT_FATAL, WORKER_EXIT_RETRYABLE, WORKER_EXIT_SIGTERM, RunPaths
from autoslm.secrets import redact
from autoslm.store import RunArtifacts, open_store
from autoslm.store.artifacts import ErrorRecord

EXIT_DONE, EXIT_RETRYABLE, EXIT_FATAL, EXIT_SIGTERM = WORKER_EXIT_DONE, WORKER_EXIT_RETRYABLE, WORKER_EXIT_FATAL, WORKER_EXIT_SIGTERM


class Preempted(BaseException):
    """SIGTERM arrived: the pod is being taken away. BaseException so training code cannot swallow it."""


def log(msg: str) -> None:
    print(redact(msg), flush=True)


def run_worker(environ: dict[str, str] | None = None) -> int:
    env = dict(os.environ if environ is None else environ)
    try:
        ctx = WorkerContext.from_env(env)
        ranks = Ranks.from_env(env)  # one of several training processes? (see engine/distributed.py)
    except FatalWorkerError as e:
        log(f"[autoslm] error: {e}")  # no store known: the log is all there is
        return EXIT_FATAL
    phase, spec, spec_error = _parse_spec(ctx.spec_json)
    store = open_store(ctx.store_uri)
    artifacts = RunArtifacts(store, ctx.paths(phase))
    from autoslm.engine.pod import uploader as uploads
    from autoslm.engine.pod.heartbeat import Reporter

    if ranks.is_main:  # only rank 0 talks to the store
        uploader = uploads.for_run(artifacts, spec, staging_dir=ctx.workdir / "staging", log=log)
    else:
        uploader = NullUploader()
    if ranks.distributed:
        from autoslm.engine.distributed import die_with_launcher

        die_with_launcher()
    reporter = Reporter(uploader, run_id=ctx.run_id, seed=ctx.seed, phase=phase, attempt=ctx.attempt,
                        log=log if ranks.is_main else (lambda msg: None))
    previous = signal.signal(signal.SIGTERM, _raise_preempted)
    from autoslm.engine.pod import watchdog

    watchdog.start(env, spec, artifacts, log)  # deadline, max_usd and a crash loop end the pod even if training hangs
    code, end_pod = EXIT_RETRYABLE, False
    try:
        if spec_error is not None:
            raise spec_error
        watchdog.require_price(env, spec)  # a max_usd with no price to count it by: refuse, never train unguarded
        if should_launch(spec, ranks):
            _launch_ranks(ctx, spec, artifacts, uploader, reporter)
        else:
            _train(ctx, spec, artifacts, uploader, reporter, ranks)
        code, end_pod = EXIT_DONE, True
    except Preempted:
        log("[autoslm] SIGTERM: stopping (the run can resume from its last checkpoint)")
        reporter.beat("error", error="stopped by SIGTERM (preempted or cancelled)", retryable=True)
        code = EXIT_SIGTERM
    except BaseException as e:  # noqa: BLE001 - every failure must reach the store before we exit
        from autoslm.engine.pod.failures import is_retryable

        retryable = is_retryable(e)  # missing data, an unknown model, bad credentials: not retryable
        message = redact(f"{type(e).__name__}: {e}") if not isinstance(e, AutoslmError) else redact(str(e))
        detail = redact(traceback.format_exc())
        log(f"[autoslm] error ({'retryable' if retryable else 'not retryable'}){' on ' + str(ranks) if ranks.distributed else ''}: {message}")
        if ranks.distributed:  # the launcher names the first rank that failed, with this message
            from autoslm.engine.distributed import is_follower, record_failure

            record_failure(env, message, retryable, follower=is_follower(e))
        reporter.beat("error", error=message, retryable=retryable, gpu=_gpu_diagnostics())
        reporter.event("error", message=message, retryable=retryable)
        try:
            uploader.required(lambda: artifacts.put_error(ErrorRecord(message, retryable, detail)), "error", timeout=120)
        except Exception as write_err:  # noqa: BLE001
            log(f"[autoslm] could not write the error to the store: {redact(str(write_err))}")
        code = EXIT_RETRYABLE if retryable else EXIT_FATAL
        end_pod = not retryable
    finally:
        signal.signal(signal.SIGTERM, previous)
        if not uploader.close(timeout=120):
            log("[autoslm] warning: some heartbeats/events were not uploaded before exit")
        if not ranks.distributed:  # the ranks share their directory; their launcher removes it
            shutil.rmtree(ctx.workdir, ignore_errors=True)
        ranks.leave()
    if end_pod and not ranks.distributed:
        _end_own_pod(env)
    return code


def _raise_preempted(signum, frame):
    raise Preempted()


def _parse_spec(spec_json: str):
    """(phase, spec or None, error or None): a bad spec must still be reported under the right phase."""
    from pydantic import ValidationError

    from autoslm.spec import JobSpec

    try:
        spec = JobSpec.from_json(spec_json)
        return spec.phase, spec, None
    except ValidationError as e:
        try:
            phase = json.loads(spec_json).get("train", {}).get("method", "sft")
        except (ValueError, AttributeError):
            phase = "sft"
        first = e.errors()[0]
        where = ".".join(map(str, first["loc"]))
        return str(phase), None, FatalWorkerError(f"invalid JobSpec: {where}: {first['msg']}")


def _launch_ranks(ctx: WorkerContext, spec, artifacts: RunArtifacts, uploader, reporter) -> None:
    """compute.gpu_count > 1: start that many ranks of this worker and wait for them (engine/distributed.py)."""
    from autoslm.engine.distributed import cuda_device_count, describe, launch_ranks, world_size

    reporter.beat("setup", message=f"starting {describe(world_size(spec), cuda_device_count())}")
    if _is_done(artifacts):
        reporter.event("already_done")
        reporter.beat("done", message="DONE was already there: nothing to do")
        return
    # Only a heartbeat goes before the ranks start: this uploader reads events.jsonl when it first writes
    # an event, and that must come after rank 0's events (an error, at the end).
    uploader.required(lambda: None, "launch heartbeat", timeout=60)
    try:
        launch_ranks(ctx, spec, log, Preempted)
    except BaseException:
        try:  # the error heartbeat keeps the step rank 0 reached
            hb = artifacts.get_heartbeat()
            if hb is not None:
                reporter.step, reporter.total_steps = hb.step, hb.total_steps
        except Exception:  # noqa: BLE001 - the error itself matters more
            pass
        raise


def _train(ctx: WorkerContext, spec, artifacts: RunArtifacts, uploader, reporter, ranks: Ranks = Ranks()) -> None:
    t_start = time.time()
    prefetch = {"model_prefetch_s": ctx.prefetch_s} if ctx.prefetch_s is not None else {}
    reporter.beat("setup", metrics=prefetch)
    dist_info, strategy = {}, None
    if ranks.distributed:
        from autoslm.engine.distributed import effective_strategy
        from autoslm.engine.train.training_args import has_cuda as cuda_here

        strategy = effective_strategy(spec, cuda_here())
        dist_info = {"world_size": ranks.world_size, "backend": ranks.join(cuda_here()), "strategy": strategy}
        if strategy != spec.compute.strategy:
            dist_info["note"] = f'compute.strategy = "{spec.compute.strategy}" needs CUDA: these CPU processes train with DDP'

    if ranks.on_main(lambda: _is_done(artifacts)):
        reporter.event("already_done")
        reporter.beat("done", message="DONE was already there: nothing to do")
        return
    reporter.event("worker_start", attempt=ctx.attempt, host=platform.node(), python=sys.version.split()[0], **prefetch, **dist_info)

    from autoslm.engine.train import models
    from autoslm.engine.rollout.evaluate import eval_generator, evaluate, grpo_sampling
    from autoslm.engine.pod.heartbeat import make_progress_callback
    from autoslm.engine.train.recipe import Device
    from autoslm.envs.registry import load_environment

    device = Device.detect()
    if device.cuda:
        from autoslm.engine.train.gpu import wait_for_gpu

        if ranks.distributed:
            from autoslm.engine.distributed import probe_device

            wait_for_gpu(timeout_s=300, probe=lambda: probe_device(ranks.local_rank))
        else:
            wait_for_gpu(timeout_s=300)
    from autoslm.store.shipping import DataFiles

    # Data files shipped with the run come from the store's copy, never from a path on the laptop.
    # Rank 0 fetches them first; the other ranks then find them on the disk they share.
    data_files = DataFiles(artifacts.store, ctx.workdir / "data")
    env = load_environment(spec, files=data_files) if ranks.is_main else None
    ranks.barrier()
    if env is None:
        env = load_environment(spec, files=data_files)
    judge = getattr(env, "judge", None)
    if judge is not None:
        judge.client.preflight()  # a bad judge URL or key fails now, not after an hour of rollouts
    eval_examples = env.eval_examples()[: spec.train.eval_samples]
    max_new = spec.train.max_completion_tokens if spec.train.method == "grpo" else 16

    reporter.beat("loading")
    t_load = time.time()
    # Rank 0 builds a built-in model (transformers writes files from global rank 0 only).
    model_path = ranks.on_main(lambda: models.resolve_model_path(spec.model, ctx.home))
    tokenizer = models.load_tokenizer(model_path, spec.trust_remote_code)
    from autoslm.catalog import model_info

    info = model_info(spec.model)
    from autoslm.engine.train.recipe import cpu_threads

    threads = cpu_threads(info, device)
    if threads:  # before any torch work: the built-in model's CPU runs then repeat step for step
        import torch

        torch.set_num_threads(threads)
    # Under a distributed launcher each process loads onto its own GPU (LOCAL_RANK is the launcher's).
    load = models.load_kwargs(spec, info, device, local_rank=int(os.environ.get("LOCAL_RANK", "0")))
    model = models.load_model(model_path, load, on_fallback=lambda wanted, reason: reporter.event(
        "attention_fallback", wanted=wanted, got="sdpa", reason=reason,
        note="padding-free SFT is off on sdpa" if spec.train.method == "sft" else ""))
    reporter.event("model_loaded", seconds=round(time.time() - t_load, 2), model=spec.model,
                   quantization="4bit" if "quantization_config" in load else None, device=device.to_dict(),
                   attn_implementation=getattr(model.config, "_attn_implementation", None), dtype=load["dtype"],
                   cpu_threads=None if device.cuda else _torch_threads())

    # Read on rank 0, into the directory the ranks share: every rank resumes from the same checkpoint.
    resume = ranks.on_main(lambda: artifacts.fetch_latest_checkpoint(ctx.workdir / "resume"))
    init_adapter = None
    if spec.train.method == "grpo" and spec.train.init_from_adapter and resume is None:
        init_adapter = ranks.on_main(lambda: _fetch_init_adapter(artifacts, spec, ctx))
    from transformers import set_seed

    set_seed(ctx.seed)  # the LoRA init draws from the global RNG: same seed, same run
    model = models.attach_adapter(model, spec, info, adapter_dir=init_adapter)
    reporter.event("adapter", **models.adapter_summary(model, init_from=spec.train.init_from_adapter if init_adapter else None))

    output_dir = ctx.workdir / "trainer"
    progress = make_progress_callback(reporter, checkpoint_keep=spec.train.keep_checkpoints, deadline=ctx.deadline, ranks=ranks)
    callbacks = [progress]
    fsdp_adapter = None
    if strategy == "fsdp" and ranks.distributed:
        from autoslm.engine.distributed import fsdp_adapter_callback

        fsdp_adapter = fsdp_adapter_callback(ranks)
        callbacks.insert(0, fsdp_adapter)  # the whole adapter is in a checkpoint before it is uploaded
    if spec.train.report_to:
        from autoslm.engine.pod.trackers import make_tracker_callback

        callbacks.append(make_tracker_callback(reporter, spec.train.report_to))
    # The trainer is built before the "before" evaluation: on a GPU pod its colocated vLLM is then up
    # and generates the evaluation's completions (the fresh LoRA adapter is a no-op, so this is the base).
    trainer = _build_trainer(spec, model=model, tokenizer=tokenizer, env=env, seed=ctx.seed,
                             output_dir=output_dir, callbacks=callbacks, reporter=reporter, device=device)
    if fsdp_adapter is not None:
        fsdp_adapter.trainer = trainer
    if ranks.distributed:
        from autoslm.engine.distributed import plain_cpu_device

        plain_cpu_device(trainer)
    generator = eval_generator(trainer)
    sampling = grpo_sampling(trainer, spec, ctx.seed)
    # Several processes generating with the model itself (no colocated vLLM) evaluate the model the
    # Trainer prepared, every rank in step (engine/distributed.py: on_prepared_model); one process, or
    # vLLM, evaluates now.
    synced = ranks.distributed and generator is None

    def run_eval(m):
        return evaluate(m, tokenizer, env, eval_examples, spec.thinking, max_new, generator=generator,
                        sampling=sampling, synced=synced) if eval_examples else None

    max_steps = trainer.args.max_steps
    before: dict = {}

    def keep_before(result) -> None:
        before["eval"] = result
        uploader.required(lambda: artifacts.put_train_meta(_train_meta(ctx, spec, model_path, max_steps, result, ranks)),
                          "train_meta", timeout=300)

    def record_before(result) -> None:
        reporter.event("eval", when="before", **(result or {}))
        keep_before(result)

    meta_prev = ranks.on_main(lambda: artifacts.get_json(artifacts.paths.train_meta)) if resume else None
    if meta_prev and "eval_before" in meta_prev:
        keep_before(meta_prev["eval_before"])
    elif synced:
        from autoslm.engine.distributed import on_prepared_model

        trainer.add_callback(on_prepared_model(lambda prepared: record_before(run_eval(prepared))))
    else:
        record_before(run_eval(model))
    setup_s = time.time() - t_start

    resume_dir, resume_step = (str(resume[1]), resume[0]) if resume else (None, 0)
    if resume:
        reporter.event("resume", from_step=resume_step)
    reporter.beat("training", step=resume_step, total_steps=max_steps)
    t_train = time.time()
    if resume and _finished_checkpoint(resume[1]):
        # Resuming from the final checkpoint would run one extra step: load its weights instead.
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(trainer.model, load_file(str(resume[1] / "adapter_model.safetensors")))
        result_loss = _last_loss(resume[1])
        final_step = resume_step
    else:
        out = trainer.train(resume_from_checkpoint=resume_dir)
        result_loss = progress.last_loss if progress.last_loss is not None else out.training_loss
        final_step = trainer.state.global_step
    train_s = time.time() - t_train
    if progress.deadline_hit and final_step < max_steps:
        raise FatalWorkerError(
            f"time limit (limits.max_hours = {spec.limits.max_hours}) reached at step {final_step}/{max_steps}",
            hint="the last checkpoint is in the store; raise max_hours and relaunch to continue",
        )

    reporter.beat("saving", step=final_step)
    eval_before = before.get("eval")
    eval_after = run_eval(trainer.model)
    reporter.event("eval", when="after", **(eval_after or {}))
    adapter_dir = ctx.workdir / "adapter"
    from autoslm.engine.distributed import save_adapter

    save_adapter(trainer, adapter_dir, ranks, strategy or "ddp")
    tokens = int(trainer.state.num_input_tokens_seen or 0)
    metrics = {
        "run_id": ctx.run_id, "seed": ctx.seed, "phase": spec.phase, "model": spec.model,
        "steps": final_step, "total_steps": max_steps,
        "wall_time_s": round(time.time() - t_start, 2), "setup_time_s": round(setup_s, 2),
        "train_time_s": round(train_s, 2), "tokens": tokens,
        "tokens_per_s": round(tokens / train_s, 1) if train_s > 0 and tokens else None,
        "final_loss": None if result_loss is None else round(float(result_loss), 4),
        "eval": {"before": eval_before, "after": eval_after},
        "attempt": ctx.attempt, "resumed_from_step": resume_step or None,
        "world_size": ranks.world_size, **({"strategy": strategy} if strategy else {}),
    }
    metrics.update(_extra_metrics(trainer))
    if judge is not None:
        metrics["judge"] = judge.client.stats.to_dict()
        judge.client.close()
    uploader.required(lambda: artifacts.put_adapter(adapter_dir), "adapter", timeout=600)
    uploader.required(lambda: artifacts.put_metrics(metrics), "metrics", timeout=300)
    # The last event and heartbeat go before DONE (a required write flushes progress first): once DONE
    # is seen the controller may terminate this pod at any moment.
    reporter.event("done", steps=final_step, final_loss=metrics["final_loss"], eval_after=eval_after)
    reporter.beat("done", step=final_step, total_steps=max_steps, loss=metrics["final_loss"])
    uploader.required(artifacts.mark_done, "DONE", timeout=300)


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _build_trainer(spec, **kw):
    if spec.train.method == "grpo":
        from autoslm.engine.train import grpo

        return grpo.build_trainer(spec, **kw)
    from autoslm.engine.train import sft

    return sft.build_trainer(spec, **kw)


def _extra_metrics(trainer) -> dict:
    """Method-specific summary (e.g. GRPO's reward curve), if the trainer keeps one."""
    fn = getattr(trainer, "autoslm_metrics", None)
    return fn() if callable(fn) else {}


def _is_done(artifacts: RunArtifacts, tries: int = 5) -> bool:
    """DONE there? A store that cannot tell is retried, then fails the attempt: never "not done"."""
    delay = 1.0
    for i in range(tries):
        try:
            return artifacts.is_done()
        except StoreUnavailable:
            if i == tries - 1:
                raise
            time.sleep(delay)
            delay *= 2
    return False


def _finished_checkpoint(ckpt: Path) -> bool:
    try:
        state = json.loads((ckpt / "trainer_state.json").read_text())
        return state["global_step"] >= state["max_steps"]
    except (OSError, ValueError, KeyError):
        return False


def _last_loss(ckpt: Path) -> float | None:
    try:
        history = json.loads((ckpt / "trainer_state.json").read_text())["log_history"]
        return next((h["loss"] for h in reversed(history) if "loss" in h), None)
    except (OSError, ValueError, KeyError):
        return None


def _fetch_init_adapter(artifacts: RunArtifacts, spec, ctx: WorkerContext) -> Path:
    """The adapter of the earlier SFT run this GRPO run continues (same store, same seed if it has one)."""
    src_run = spec.train.init_from_adapter
    candidates = [RunPaths("sft", src_run, ctx.seed)] + [RunPaths("sft", src_run, s) for s in range(0, 8) if s != ctx.seed]
    for paths in candidates:
        src = RunArtifacts(artifacts.store, paths)
        if src.has_adapter():
            dest = src.fetch_adapter(ctx.workdir / "init_adapter")
            return dest
    raise FatalWorkerError(
        f"train.init_from_adapter: run {src_run!r} has no adapter in {artifacts.store.uri}",
        hint="name a succeeded SFT run that used the same artifact store",
    )


def _train_meta(ctx, spec, model_path, max_steps, eval_before, ranks: Ranks = Ranks()) -> dict:
    import peft
    import torch
    import transformers
    import trl

    return {
        "run_id": ctx.run_id, "seed": ctx.seed, "attempt": ctx.attempt, "model_path": model_path,
        "total_steps": max_steps, "eval_before": eval_before, "world_size": ranks.world_size,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__, "peft": peft.__version__},
        "spec": json.loads(spec.to_json()),
    }


def _gpu_diagnostics() -> dict | None:
    try:
        from autoslm.engine.train.gpu import gpu_diagnostics

        return gpu_diagnostics()
    except Exception:  # noqa: BLE001 - diagnostics must never mask the real error
        return None


def _end_own_pod(env: dict[str, str]) -> None:
    """On a rented pod, terminate it with the pod-scoped ids the provider injected (never the user's key)."""
    from autoslm.engine.pod.selfterm import end_own_pod

    end_own_pod(env, log)
