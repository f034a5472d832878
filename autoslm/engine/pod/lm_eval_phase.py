"""The worker's lm-eval phase (``[eval] lm_eval``): lm-evaluation-harness scores the base model and the
adapter AFTER the run is handed back, and its block joins metrics.json as a later write.

The order, and why: what the user paid for is in the store before anything optional runs. So the report
phase writes the adapter, metrics.json (its ``lm_eval`` block says the harness follows: ``state``
"running") and DONE, with a "done" heartbeat whose ``activity`` is ``layout.HARNESS_ACTIVITY``; the
controller then marks the run succeeded and leaves its pod to the harness until the worker exits or the
run's limit passes (controller/reconcile.py). Then, here (rank 0 only):

1. the trainer gives back the GPU memory it held (its colocated vLLM engine, the model's weights);
2. the base model, then the adapter, each in a harness process of its own (engine/harness.py), one
   after the other: each engine has the GPU to itself, and a failure of one keeps the other's scores.
   After each, its scores are written locally (the process's OUT.json) and into the store's
   metrics.json before the next one starts;
3. at the run's limit (time: its deadline; money: when this pod's share of ``max_usd`` is spent,
   engine/pod/limits.py) the running harness is stopped in time to write what finished
   (``limits.harness_cut_at``), and the block says what the limit cut (``cut``), as it does for a pod
   stopped by SIGTERM. The run stays succeeded with its adapter either way.

On a pod with CUDA and vLLM the harness uses lm-eval's ``vllm`` model, elsewhere its ``hf`` model. Its
process gets a clean environment (``harness_env``): none of the training ranks' distributed variables,
with which lm-eval's ``hf`` model would wait for ranks that never come. Heartbeats go on while it runs.
The early stop before a limit reserves the harness's estimated time where it is known and affordable
(``harness_seconds``, ``limits.LimitStop``).
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from autoslm.procs import Starting
from autoslm.recipes.harness import RUNNING, cut_words, gen_tokens, task_label, with_failure, with_scores

BEAT_EVERY_S = 20.0
# What a training process's environment holds that must not reach the harness: the ranks' own
# variables (torch's elastic agent, accelerate, transformers' FSDP switches), the vendors' cluster
# variables, and what TRL's colocated vLLM engine set for itself in this process.
_DISTRIBUTED_VARS = frozenset(
    {
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_NAME",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "NODE_RANK",
        "NUM_NODES",
        "NUM_TRAINERS",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "NCCL_ASYNC_ERROR_HANDLING",
        "VLLM_ENABLE_V1_MULTIPROCESSING",
        "VLLM_DP_RANK",
        "VLLM_DP_RANK_LOCAL",
        "VLLM_DP_SIZE",
        "VLLM_DP_MASTER_IP",
        "VLLM_DP_MASTER_PORT",
    }
)
_DISTRIBUTED_PREFIXES = ("TORCHELASTIC_", "TORCH_ELASTIC_", "PET_", "ACCELERATE_", "FSDP_")


def harness_env(environ: dict[str, str]) -> dict[str, str]:
    """The harness process's environment: this one's, less every distributed variable."""
    return {k: v for k, v in environ.items() if k not in _DISTRIBUTED_VARS and not k.startswith(_DISTRIBUTED_PREFIXES)}


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


def harness_seconds(spec, device) -> float | None:
    """The harness's estimate on this pod's GPU (both models, their engines' start included:
    ``catalog.lm_eval_seconds``), for the early stop's reserve; None without ``lm_eval`` or where it
    cannot be told (a CPU, a GPU the catalog does not know)."""
    if not spec.eval.lm_eval or device is None or not device.cuda:
        return None
    from autoslm.catalog import gpu_info
    from autoslm.catalog.cost import lm_eval_seconds

    gpu = gpu_info(device.name, device.mem_gib)
    if gpu is None:
        return None
    return lm_eval_seconds(spec.model, gpu, spec.train, spec.eval, has_vllm=device.has("vllm")) or None


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

    release = getattr(trainer, "release_generation", None)  # engine/train/trainer.py, the one seam into TRL
    if callable(release):
        release()
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


def follows(job) -> bool:
    """Does lm-eval run after this process hands the run back (``[eval] lm_eval``, rank 0)?"""
    return bool(job.spec.eval.lm_eval) and job.ranks.is_main


def running_block(spec) -> dict:
    """metrics.json's ``lm_eval`` block as the hand-back writes it: the harness follows."""
    return {"state": RUNNING, "tasks": list(spec.eval.lm_eval)}


def run_after_hand_back(job, adapter_dir: Path, metrics: dict, *, stopped: type[BaseException], clock=time.time) -> dict:
    """lm-eval after the hand-back (see the module docstring): base, then adapter, each in its own
    process, metrics.json written after each; at the run's limit or on ``stopped`` (SIGTERM) the running
    harness is ended and the block says so. Never raises into the finished run; returns the block."""
    spec, reporter = job.spec, job.reporter
    end = getattr(job.limit_stop, "end", None)
    from autoslm.engine.pod.limits import harness_cut_at

    cut_at = harness_cut_at(end, spec.artifacts.store)
    block: dict = {**running_block(spec)}
    t0 = clock()
    work = job.ctx.workdir / "lm_eval"
    work.mkdir(parents=True, exist_ok=True)
    left = ["base", "adapter"]
    try:
        which = backend()
        block["backend"] = which
        req = harness_request(job, adapter_dir, which)
        if _cuda():  # the harness's model (and vLLM's engine) load beside nothing of the trainer's
            free = release_gpu(job.trainer)
            if which == "vllm":
                req["gpu_memory_utilization"] = vllm_share(free)
        reporter.event("lm_eval_started", tasks=spec.eval.lm_eval, backend=which)
        while left:
            name = left[0]
            got = (
                None if cut_at is not None and clock() >= cut_at else _score(job, {**req, "models": [name]}, work, cut_at, clock)
            )
            if got is None:  # the limit came first
                block["cut"] = {"by": end.limit, "models": list(left), "words": cut_words(end.words, left)}
                break
            left.pop(0)
            part, failure = got
            block = with_scores(block, name, part) if part is not None else with_failure(block, name, failure)
            _write(job, metrics, block, clock() - t0)  # this model's scores are kept before the next one starts
    except stopped:
        block["cut"] = {"by": "SIGTERM", "models": list(left), "words": cut_words("the pod's stop (SIGTERM)", left)}
    except Exception as e:  # noqa: BLE001 - the run is handed back: a harness that fails is recorded, not raised
        block = with_failure(block, left[0] if left else "harness", f"{type(e).__name__}: {e}")
    block.pop("state", None)
    block["seconds"] = round(clock() - t0, 2)
    reporter.event("lm_eval", **{k: block.get(k) for k in ("version", "backend", "seconds", "error", "cut") if k in block})
    _write(job, metrics, block, block["seconds"])  # after the event (a required write sends what is queued first)
    # The last heartbeat goes after the scores: once it no longer names the harness, the pod may be ended.
    said = (block.get("cut") or {}).get("words") or block.get("error") or f"lm-eval done in {block['seconds']:.0f}s"
    reporter.beat("done", message=said)
    return block


def _write(job, metrics: dict, block: dict, seconds: float) -> None:
    """metrics.json with ``block`` as its ``lm_eval`` (and its seconds), into the store; a store that
    fails is said, never raised: the run is handed back already."""
    from autoslm.secrets import redact

    block["seconds"] = round(seconds, 2)
    metrics["lm_eval"], metrics["lm_eval_time_s"] = block, block["seconds"]
    try:
        job.uploader.required(lambda: job.artifacts.put_metrics(metrics), "metrics (lm-eval)", timeout=120)
    except Exception as e:  # noqa: BLE001
        job.reporter.log(f"[autoslm] could not write lm-eval's scores to the store: {redact(str(e))}")


def _score(job, req: dict, work: Path, cut_at: float | None, clock) -> tuple[dict | None, str | None] | None:
    """``req``'s one model in a harness process of its own: (its block, None) when it finished, (None,
    why) when it failed, None when the limit came first and it was stopped."""
    name = req["models"][0]
    request, out, log_path = work / f"{name}.request.json", work / f"{name}.json", work / f"{name}.log"
    request.write_text(json.dumps(req))
    out.unlink(missing_ok=True)
    t = clock()
    with open(log_path, "w") as log:
        starting = Starting(  # held before it starts: a SIGTERM mid-start still leaves us its pid (procs.Starting)
            [sys.executable, "-m", "autoslm.engine.harness", str(request), str(out)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=harness_env(dict(os.environ)),
            start_new_session=True,  # its engine's own processes end with it (_stop)
        )
        try:
            rc = _wait(job, starting.begin().started(), name, cut_at, clock, t)
        except BaseException:
            proc = starting.process()
            if proc is not None:
                _stop(proc)  # SIGTERM (or anything else): no harness is left holding the GPU
            raise
    if rc is None:
        return None
    if rc == 0 and out.is_file():
        return json.loads(out.read_text()), None
    tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
    return None, f"lm-eval exited with {rc}: {' | '.join(tail)[-500:]}"


def _wait(job, proc: subprocess.Popen, name: str, cut_at: float | None, clock, t: float) -> int | None:
    """The harness's exit code, beating meanwhile; None when it was stopped at ``cut_at``."""
    from autoslm.layout import HARNESS_ACTIVITY

    tasks = ", ".join(map(task_label, job.spec.eval.lm_eval))
    while True:
        wait_s = BEAT_EVERY_S if cut_at is None else max(0.0, min(BEAT_EVERY_S, cut_at - clock()))
        try:
            return proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            pass
        if cut_at is not None and clock() >= cut_at:
            _stop(proc)
            return None
        job.reporter.beat("done", activity=HARNESS_ACTIVITY, message=f"lm-eval ({name}) on {tasks}: {clock() - t:.0f}s")


def _stop(proc: subprocess.Popen) -> None:
    """End a harness and its engine's processes: asked, then killed, and waited for until every process of
    its group is gone, not only the harness itself (a killed process holding a model can take many seconds
    to give back its memory on a busy machine)."""
    from autoslm.engine.pod.limits import HARNESS_KILL_S
    from autoslm.procs import group_alive

    for sig, wait_s in ((signal.SIGTERM, HARNESS_KILL_S), (signal.SIGKILL, 120.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        until = time.monotonic() + wait_s
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        while group_alive(proc.pid) and time.monotonic() < until:
            time.sleep(0.05)
        if not group_alive(proc.pid):
            return
