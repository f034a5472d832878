"""The worker's lm-eval phase (``[eval] lm_eval``): after the adapter is saved, lm-evaluation-harness
scores the base model and the adapter (engine/harness.py, as a process of its own), and the result
goes into metrics.json's ``lm_eval`` block beside the run's own held-out scores.

On a pod with CUDA and vLLM the harness uses lm-eval's ``vllm`` model, in a fresh process once this
one has given back the GPU memory its trainer held (the colocated vLLM engine and the model's
weights); elsewhere its ``hf`` model. Heartbeats go on while it runs. A failure of the harness does not
fail the run: the adapter is trained and saved, and metrics.json says what went wrong.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from autoslm.recipes.harness import gen_tokens

BEAT_EVERY_S = 20.0


def harness_request(job, adapter_dir: Path, backend: str) -> dict:
    """What engine/harness.py runs: the spec's tasks (shipped task files fetched), on ``backend``."""
    from autoslm.store.shipping import DataFiles

    files = DataFiles(job.artifacts.store, job.ctx.workdir / "data")
    tasks = [str(files.local_path(t)[0]) for t in job.spec.eval.lm_eval]
    return build_request(
        job.spec, job.model_path, str(adapter_dir), tasks, backend, seed=job.ctx.seed, device="cuda" if _cuda() else "cpu"
    )


def build_request(
    spec, model_path: str, adapter: str | None, tasks: list[str], backend: str, *, seed: int = 0, device: str = "cpu"
) -> dict:
    """The harness's request for ``spec``: its shots and sample limit, thinking as the spec says, LoRA
    rank and answer length from its [train] (recipes/harness.py turns them into lm-eval's arguments)."""
    t = spec.train
    return {
        "model": model_path,
        "adapter": adapter,
        "tasks": tasks,
        "backend": backend,
        "shots": spec.eval.lm_eval_shots,
        "limit": spec.eval.lm_eval_limit,
        "thinking": bool(spec.thinking),
        "lora_rank": int(t.lora_rank),
        "max_gen_toks": gen_tokens(t),
        "max_model_len": max(int(getattr(t, "max_length", 0) or 0), gen_tokens(t) + 2048),
        "seed": seed,
        "device": device,
    }


def check_tasks(spec) -> None:
    """Before training: every task name is one of the installed lm-eval's (the laptop checks where it
    has lm-eval; this checks where it had not), and lm-eval is there at all."""
    import importlib.util

    from autoslm.envs.lm_tasks import task_issues
    from autoslm.errors import FatalWorkerError

    if not spec.eval.lm_eval:
        return
    if importlib.util.find_spec("lm_eval") is None:
        raise FatalWorkerError(
            "[eval] lm_eval is set, but lm-eval is not installed on the worker",
            hint="install autoslm[worker] (it pins lm-eval) or remove eval.lm_eval",
        )
    for field, message in task_issues([t for t in spec.eval.lm_eval if not t.startswith("store:")]):
        raise FatalWorkerError(f"{field}: {message}")


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def backend() -> str:
    import importlib.util

    return "vllm" if _cuda() and importlib.util.find_spec("vllm") is not None else "hf"


def release_gpu(trainer) -> float:
    """Give back what the trainer holds on the GPU (its colocated vLLM engine, the model's weights), for
    the harness's own engine; returns the share of the GPU's memory that is free after."""
    import torch

    gen = getattr(trainer, "vllm_generation", None)  # TRL's colocated engine (trl/generation/vllm_generation.py)
    for owner in (gen, trainer):
        if owner is not None and getattr(owner, "llm", None) is not None:
            try:
                owner.llm = None
            except AttributeError:
                pass
    try:
        trainer.model.to("cpu")
    except Exception:  # a sharded or quantized model stays where it is; vLLM then gets what is free
        pass
    gc.collect()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    return free / total


def vllm_share(free_share: float) -> float:
    """vLLM's gpu_memory_utilization for the harness: most of what is free, never more than lm-eval's usual 0.9."""
    return round(max(0.05, min(0.9, free_share - 0.05)), 3)


def run_lm_eval(job, adapter_dir: Path) -> dict | None:
    """The ``lm_eval`` block for metrics.json (rank 0), or None without ``[eval] lm_eval``."""
    spec = job.spec
    if not spec.eval.lm_eval or not job.ranks.is_main:
        return None
    which = backend()
    req = harness_request(job, adapter_dir, which)
    if _cuda():  # the harness's model (and vLLM's engine) load beside nothing of the trainer's
        free = release_gpu(job.trainer)
        if which == "vllm":
            req["gpu_memory_utilization"] = vllm_share(free)
    work = job.ctx.workdir / "lm_eval"
    work.mkdir(parents=True, exist_ok=True)
    (work / "request.json").write_text(json.dumps(req))
    out = work / "result.json"
    job.reporter.event("lm_eval_started", tasks=spec.eval.lm_eval, backend=which)
    t0 = time.time()
    log = open(work / "harness.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "autoslm.engine.harness", str(work / "request.json"), str(out)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=dict(os.environ),
    )
    while True:
        try:
            rc = proc.wait(timeout=BEAT_EVERY_S)
            break
        except subprocess.TimeoutExpired:
            job.reporter.beat("saving", message=f"lm-eval on {', '.join(spec.eval.lm_eval)} ({time.time() - t0:.0f}s)")
    log.close()
    seconds = round(time.time() - t0, 2)
    if rc != 0 or not out.is_file():
        tail = (work / "harness.log").read_text(errors="replace").strip().splitlines()[-3:]
        block = {"error": f"lm-eval exited with {rc}: {' | '.join(tail)[-500:]}", "seconds": seconds, "backend": which}
    else:
        block = json.loads(out.read_text())
        block["seconds"] = seconds
    job.reporter.event("lm_eval", **{k: block.get(k) for k in ("version", "backend", "seconds", "error") if k in block})
    return block
