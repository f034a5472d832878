"""Prefetch the run's base model before the worker starts, and say how far it got.

    python -m autoslm.engine.pod.prefetch      # every pod's start runs it (worker_image/boot.sh)

Downloads the JobSpec model's weights, config and tokenizer files into the Hub cache, then the Hub attention
kernel the GPU recipe picks (``attention_kernel``), so no load fetches it over the network, and checks its
publisher's trust once for the pod (the worker's loads then skip that Hub lookup: ``trusted_kernel``). While it does,
it writes a "setup" heartbeat every ``PROGRESS_EVERY_S`` seconds ("downloading Qwen/Qwen3-8B: 6.1 of
16.4 GB"), so `autoslm status` shows a slow start as progress rather than silence. Beats are sparse on
purpose: each one is a commit to the run's Hub repo, whose hourly commit budget the run shares.

It must never stop the worker from starting: every failure is one log line and exit status 1, and the
worker then downloads (and reports errors) itself. It never prints the environment.
"""

from __future__ import annotations

import fnmatch
import json
import os
import sys
import threading
from pathlib import Path

# Weights, config and tokenizer only: no other frameworks' weights, no repo extras.
ALLOW = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "tokenizer*", "*.tiktoken"]
PROGRESS_EVERY_S = 300.0


def log(msg: str) -> None:
    print(f"[autoslm] prefetch: {msg}", flush=True)


def main(environ: dict[str, str] | None = None, *, every_s: float = PROGRESS_EVERY_S) -> int:
    env = dict(os.environ if environ is None else environ)
    try:
        spec = json.loads(env.get("AUTOSLM_JOBSPEC") or "{}")
    except ValueError:
        log("AUTOSLM_JOBSPEC is not JSON; the worker will report it")
        return 0
    model = spec.get("model") or ""
    if not model or model.startswith(("autoslm/", "/", "./", "~")):
        log(f"{model or 'no model'} needs no download")  # built-in models are built; local paths are there
        return 0
    try:
        from huggingface_hub import HfApi, snapshot_download

        endpoint, token = env.get("HF_ENDPOINT") or None, env.get("HF_TOKEN") or None
        cache = _cache_dir(env)
        total = _total_bytes(HfApi(endpoint=endpoint, token=token), model)
        beat = _heartbeat_writer(env, spec)
        blobs = cache / f"models--{model.replace('/', '--')}" / "blobs"
        stop = threading.Event()

        def report() -> None:
            while not stop.wait(every_s):
                have = sum(f.stat().st_size for f in blobs.glob("*") if f.is_file()) if blobs.is_dir() else 0
                beat(
                    f"downloading {model}: {have / 1e9:.1f} of {total / 1e9:.1f} GB"
                    if total
                    else f"downloading {model}: {have / 1e9:.1f} GB so far"
                )

        reporter = threading.Thread(target=report, name="prefetch-progress", daemon=True)
        reporter.start()
        try:
            path = snapshot_download(model, allow_patterns=ALLOW, cache_dir=str(cache), endpoint=endpoint, token=token)
        finally:
            stop.set()
            reporter.join(timeout=60)
        beat(f"downloaded {model} ({total / 1e9:.1f} GB)")
    except Exception as e:  # noqa: BLE001 - one line in the pod log; the worker meets (and reports) the same error
        first = str(e).splitlines()[0][:300] if str(e) else ""
        log(f"{model}: {type(e).__name__}: {first}")
        return 1
    log(f"{model} -> {path}")
    attention_kernel(env)
    return 0


def attention_kernel(env: dict[str, str]) -> str | None:
    """Fetch (and load once) the Hub attention kernel the recipe picks for this GPU, so the worker finds it
    in the cache rather than on the network, and so a kernel that fails its trust, version, build-variant
    or GPU check says so here, in the pod's log. Returns the kernel's name, or None when none is used.
    Never raises: the worker then falls back to SDPA and records an "attention_fallback" event."""
    try:
        from autoslm.catalog import model_info
        from autoslm.engine.train.recipe import Device, attn_implementation
        from autoslm.spec import spec_from_json

        spec = spec_from_json(env.get("AUTOSLM_JOBSPEC") or "{}")
        if spec.kind != "train":  # a serve's vLLM server picks its own attention
            return None
        attn = attn_implementation(spec.train, model_info(spec.model), Device.detect())
        if "/" not in attn:  # sdpa, eager, a flash_attn wheel: nothing on the Hub
            return None
        from transformers.integrations.hub_kernels import load_and_register_attn_kernel

        load_and_register_attn_kernel(attn)  # with kernels' publisher trust check: once per pod, here
        record_trusted_kernel(attn, env)
        log(f"attention kernel {attn}: ready")
        return attn
    except Exception as e:  # noqa: BLE001 - one line; the worker falls back to sdpa and says so
        log(f"attention kernel: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]} (the worker will use sdpa)")
        return None


def _trusted_file(env) -> Path:
    return _cache_dir(env) / "autoslm-trusted-kernels.txt"


def record_trusted_kernel(repo_id: str, env) -> None:
    """Note that this Hub kernel passed its publisher trust check on this pod (in the Hub cache, which
    the worker's ranks share), so that their loads need not ask the Hub again (``trusted_kernel``)."""
    path = _trusted_file(env)
    path.parent.mkdir(parents=True, exist_ok=True)
    known = set(path.read_text().split()) if path.is_file() else set()
    if repo_id not in known:
        path.write_text("".join(f"{k}\n" for k in sorted(known | {repo_id})))


def trusted_kernel(repo_id: str | None, env=None):
    """A context for loading the model: where the prefetch verified this kernel's publisher on this pod,
    transformers' ``allow_all_hub_kernels`` (no Hub lookup per load and per rank); else nothing changes."""
    import contextlib

    env = os.environ if env is None else env
    path = _trusted_file(env)
    if not repo_id or "/" not in repo_id or not path.is_file() or repo_id not in path.read_text().split():
        return contextlib.nullcontext()
    from transformers.integrations.hub_kernels import allow_all_hub_kernels

    return allow_all_hub_kernels()


def _cache_dir(env) -> Path:
    """Where transformers will look for the files (the same variables huggingface_hub reads)."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    return Path(env.get("HF_HOME") or "~/.cache/huggingface").expanduser() / "hub"


def _total_bytes(api, model: str) -> int:
    info = api.model_info(model, files_metadata=True)
    return sum(s.size or 0 for s in info.siblings or [] if any(fnmatch.fnmatch(s.rfilename, p) for p in ALLOW))


def _heartbeat_writer(env: dict[str, str], spec: dict):
    """A function writing one "setup" heartbeat with a message; a no-op without a run's store."""
    from autoslm.layout import Heartbeat, PodEnv, RunPaths, phase_of
    from autoslm.store import RunArtifacts, open_store

    try:
        pod = PodEnv.from_env(env)
    except ValueError:
        pod = None  # the worker itself says what is wrong with it
    if pod is None:
        return lambda message: log(message)
    phase = phase_of(spec)
    artifacts = RunArtifacts(open_store(pod.store_uri), RunPaths(phase, pod.run_id, pod.seed))

    def beat(message: str) -> None:
        log(message)
        try:
            artifacts.put_heartbeat(
                Heartbeat(run_id=pod.run_id, seed=pod.seed, phase=phase, stage="setup", message=message, attempt=pod.attempt)
            )
        except Exception as e:  # noqa: BLE001 - progress is a courtesy: the download goes on
            log(f"could not write a heartbeat ({type(e).__name__})")

    return beat


if __name__ == "__main__":
    sys.exit(main())
