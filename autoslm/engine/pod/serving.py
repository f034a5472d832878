"""A serve's pod: vLLM's own OpenAI server for a run's adapter, kept within the run's limits.

A serve is a run whose JobSpec is a ``ServeSpec`` (``kind = "serve"``, written by `autoslm serve`): the
provider starts the worker as for training (``python -m autoslm.engine``), the runner sees its kind and
comes here instead of training. So every guard of a run applies unchanged: the in-pod watchdog and the
supervisor end the pod at its deadline (``limits.ttl_s`` after its launch) and at ``limits.max_usd``,
a lost pod is replaced within ``limits.max_restarts``, `autoslm cancel` and `autoslm gc` end it.

The server is stock vLLM, started as its own process in the worker's process group:
``vllm serve BASE --enable-lora --lora-modules NAME=ADAPTER --max-lora-rank R`` (where the ``vllm``
distribution is installed; vLLM's CPU build ships as ``vllm-cpu``, whose ``vllm`` command cannot look
its own version up, so there the same server starts as ``python -m vllm.entrypoints.openai.api_server``).

What the worker does: fetch the adapter from the store it was trained into, put a copy in this run's
own ``adapter/`` (what the serve hands back, as any run does), start the server, wait until it
answers, then beat a "training" heartbeat (activity "serving", the endpoint in its message) every
``BEAT_S`` so the supervisor sees it alive. At the nearer of the time and money limits (the money
one early by the time its end takes to write, as training stops: the watchdog gives money no grace)
it stops the server, writes metrics and DONE and ends its own pod (the runner's end). A server that exits by
itself is a retryable error: the controller starts a new pod within ``limits.max_restarts``.
"""

from __future__ import annotations

import importlib.util
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from importlib import metadata
from pathlib import Path

from autoslm.errors import FatalWorkerError
from autoslm.layout import LIMIT_USD, SERVING_PREFIX
from autoslm.procs import Starting
from autoslm.recipes.generation import vllm_lora_rank

BEAT_S = 30.0  # heartbeat interval while serving (the supervisor's heartbeat timeout is minutes)
POLL_S = 0.5
STOP_WAIT_S = 15.0
# Where a test runs a stand-in for vLLM (a real process answering the same HTTP API, started with the
# same arguments): the stack the test runs in has no vLLM. Unset everywhere else.
ENV_SERVER = "AUTOSLM_SERVE_SERVER"


def max_lora_rank(rank: int) -> int:
    """--max-lora-rank for the adapter (``recipes.generation.vllm_lora_rank``); a rank vLLM cannot load is fatal."""
    try:
        return vllm_lora_rank(rank)
    except ValueError as e:
        raise FatalWorkerError(f"the adapter's {e}") from None


def _has_dist(name: str) -> bool:
    try:
        metadata.version(name)
        return True
    except metadata.PackageNotFoundError:
        return False


def has_cuda() -> bool:
    return Path("/proc/driver/nvidia/gpus").is_dir() and any(Path("/proc/driver/nvidia/gpus").iterdir())


def server_command(spec, model_path: str, adapter: Path, environ, *, host: str, cuda: bool) -> list[str]:
    """The stock vLLM server's command line for this serve (a ``ServeSpec``)."""
    served = spec.adapter
    args = [
        "--enable-lora",
        "--lora-modules",
        f"{served.lora_name}={adapter}",
        "--max-lora-rank",
        str(max_lora_rank(served.lora_rank)),
        "--served-model-name",
        spec.model,
        "--host",
        host,
        "--port",
        str(spec.port),
    ]
    if spec.max_model_len:
        args += ["--max-model-len", str(spec.max_model_len)]
    if spec.trust_remote_code:
        args.append("--trust-remote-code")
    if not cuda:
        args.append("--enforce-eager")  # no compile step on a CPU (engine/train/vllm_cpu.py says why)
    if environ.get(ENV_SERVER):
        return [*shlex.split(environ[ENV_SERVER]), model_path, *args]
    if importlib.util.find_spec("vllm") is None:
        raise FatalWorkerError(
            "this pod has no vLLM to serve with", hint="a serve's pod installs it (boot's --vllm); check the image"
        )
    if _has_dist("vllm") and shutil.which("vllm"):
        return ["vllm", "serve", model_path, *args]
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path, *args]


def public_url(environ, port: int, host: str) -> str:
    """Where the OpenAI API of this pod is reached from outside (the vendor's proxy or port map), else here.
    A vendor whose status names the URL (Hugging Face Jobs: ``Capabilities.endpoint_from``) gives nothing
    to the pod: the heartbeat names the server's address in the pod, and the controller asks the vendor
    (``sdk/serve_endpoint.endpoint``)."""
    from autoslm._image.boot_rules import served_at  # the vendors' pod table (worker_image/boot_rules.py)

    outside = served_at(environ, port)
    if outside:
        return outside
    return f"http://{'127.0.0.1' if host in ('127.0.0.1', '0.0.0.0') else host}:{port}/v1"


def answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(STOP_WAIT_S)


def serve(ctx, spec, artifacts, uploader, reporter, environ, log, *, clock=time.time) -> None:
    """Serve the adapter until a limit (then return: the run is done) or an error (raised)."""
    from autoslm.engine.pod.limits import LimitEnd, run_end, save_seconds
    from autoslm.engine.train.models import resolve_model_path
    from autoslm.store import open_store
    from autoslm.store.adapters import AdapterDamaged, check_adapter

    sv = spec.adapter
    started = clock()
    end = run_end(ctx, spec, started)
    if end is not None and end.limit == LIMIT_USD:
        # The money limit has no grace in the watchdog: stop early enough to write the end within it.
        end = LimitEnd(end.at - save_seconds(0, spec.artifacts.store), end.limit)
    reporter.beat("setup", message=f"fetching the adapter of run {sv.source_run}")
    adapter = ctx.workdir / "adapter"
    open_store(sv.store).download(sv.adapter_path, adapter)
    try:
        check_adapter(adapter)
    except AdapterDamaged as e:
        raise FatalWorkerError(f"the adapter to serve ({sv.store} {sv.adapter_path}): {e.path.name}: {e.problem}") from None
    uploader.required(lambda: artifacts.put_adapter(adapter), "adapter", timeout=300)
    model_path = resolve_model_path(spec.model, ctx.home)
    local = spec.compute.is_local
    host = "127.0.0.1" if local else "0.0.0.0"
    cuda = has_cuda()
    command = server_command(spec, model_path, adapter, environ, host=host, cuda=cuda)
    env = dict(environ)
    if not cuda:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: vLLM's CPU build needs it said
    url = public_url(environ, spec.port, host)
    log(f"[autoslm] serving: {shlex.join(command)}")
    reporter.beat("setup", message=f"starting vLLM for {sv.lora_name}")
    # Held before it starts: a SIGTERM (Preempted) that lands inside Popen still leaves us the server to stop.
    starting = Starting(command, env=env, stdin=subprocess.DEVNULL)
    try:
        proc = starting.begin().started()
        while not answers(spec.port):
            if proc.poll() is not None:
                raise RuntimeError(f"the vLLM server exited with code {proc.returncode} before it answered (see `autoslm logs`)")
            if end is not None and clock() >= end.at:
                break
            time.sleep(POLL_S)
        beat_at = 0.0
        while end is None or clock() < end.at:
            if proc.poll() is not None:
                raise RuntimeError(f"the vLLM server exited with code {proc.returncode} (see `autoslm logs`)")
            if clock() >= beat_at:
                if not beat_at:
                    reporter.event("serving", url=url, model=sv.lora_name, base=spec.model)
                reporter.beat("training", activity="serving", message=f"{SERVING_PREFIX}{url} (model {sv.lora_name})")
                beat_at = clock() + BEAT_S
            time.sleep(POLL_S)
        stop(proc)
        reporter.limit = end.limit
        log(f"[autoslm] serving ended: {end.words}")
        metrics = {
            "serve": {
                "source_run": sv.source_run,
                "step": sv.step,
                "model": sv.lora_name,
                "url": url,
                "served_s": round(clock() - started, 1),
            },
            "stop_reason": f"{end.words} ended the serve",
        }
        uploader.required(lambda: artifacts.put_metrics(metrics), "metrics", timeout=120)
        reporter.beat("done", message=f"served until {end.words}")
        uploader.required(artifacts.mark_done, "DONE", timeout=120)
    finally:
        proc = starting.process()
        if proc is not None:
            stop(proc)
