"""The worker's first phases (engine/pod/phases/): begin (the setup heartbeat, worker_start, DONE
already there?), data (the GPU ready, the environment, its judge checked, the held-out examples) and
load (the tokenizer, the model, its adapter, the checkpoint the attempt resumes from)."""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

from autoslm.engine.distributed import Ranks
from autoslm.engine.pod.context import WorkerContext
from autoslm.engine.pod.phases.job import Job
from autoslm.errors import FatalWorkerError, StoreUnavailable
from autoslm.layout import RunPaths
from autoslm.store import RunArtifacts

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
    from autoslm.envs.task_table import load_task
    from autoslm.store.shipping import DataFiles

    spec, ranks = job.spec, job.ranks
    job.device = Device.detect()
    from autoslm.engine.train.gpu import rented_gpu, wait_for_gpu

    if job.device.cuda and ranks.distributed:
        from autoslm.engine.distributed import probe_device

        wait_for_gpu(timeout_s=300, probe=lambda: probe_device(ranks.local_rank))
    else:  # without CUDA: at once, and on a rented pod that asked for a GPU, a host fault
        wait_for_gpu(timeout_s=300, asked=rented_gpu(spec, os.environ))
    # Data files shipped with the run come from the store's copy, never from a path on the laptop.
    # Each pod's first rank fetches them first; its other ranks then find them on the disk they share.
    data_files = DataFiles(job.artifacts.store, job.ctx.workdir / "data")
    task = load_task(spec, files=data_files) if ranks.is_local_main else None  # each pod's own disk
    ranks.barrier()
    job.task = task if task is not None else load_task(spec, files=data_files)
    job.env, job.judge = job.task.env, job.task.judge
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
    # Each pod's first rank builds a built-in model (rank 0 first, then the other pods'), then every rank
    # finds it in its own pod's cache.
    resolve = lambda *_: models.resolve_model_path(spec.model, ctx.home)  # noqa: E731
    path = ranks.on_each_node(resolve, resolve)
    job.model_path = resolve() if ranks.several_nodes else path
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

    job.resume = fetch_resume(job)
    init_adapter = None
    if continues_adapter(spec, job.resume):
        init_adapter = fetch_init_adapter(artifacts, spec, ctx, ranks)
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


def fetch_resume(job: Job) -> tuple[int, Path] | None:
    """The checkpoint the attempt resumes from, decided on rank 0 (the newest whole one in the store) and
    fetched into each pod's working directory: every rank resumes from the same step."""
    ranks, artifacts, dest = job.ranks, job.artifacts, job.ctx.workdir / "resume"

    def fetch(step: int) -> None:
        if artifacts.fetch_checkpoint(step, dest) is None:
            raise StoreUnavailable(f"checkpoint-{step}, which rank 0 resumes from, could not be read whole from the store")

    def newest() -> int | None:
        found = artifacts.fetch_latest_checkpoint(dest)
        return found[0] if found else None

    step = ranks.on_each_node(newest, fetch)
    return (step, dest / f"checkpoint-{step}") if step is not None else None


def fetch_init_adapter(artifacts: RunArtifacts, spec, ctx: WorkerContext, ranks: Ranks = Ranks()) -> Path:
    """The adapter of the earlier SFT run this GRPO run continues (same store, same seed if it has one),
    found on rank 0 and fetched into each pod's working directory."""
    dest = ctx.workdir / "init_adapter"

    def fetch(src: RunPaths) -> RunPaths:
        RunArtifacts(artifacts.store, src).fetch_adapter(dest)
        return src

    ranks.on_each_node(lambda: fetch(init_adapter_source(artifacts, spec, ctx.seed)), fetch)
    return dest


def init_adapter_source(artifacts: RunArtifacts, spec, seed: int) -> RunPaths:
    """Where that adapter is: the earlier run's seed ``seed`` if it has one, else its first seed that does."""
    src_run = spec.train.init_from_adapter
    candidates = [RunPaths("sft", src_run, seed)] + [RunPaths("sft", src_run, s) for s in range(0, 8) if s != seed]
    for paths in candidates:
        if RunArtifacts(artifacts.store, paths).has_adapter():
            return paths
    raise FatalWorkerError(
        f"train.init_from_adapter: run {src_run!r} has no adapter in {artifacts.store.uri}",
        hint="name a succeeded SFT run that used the same artifact store",
    )


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()
