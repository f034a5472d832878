"""GPU readiness, diagnostics, and the GPU-dependent parts of the GRPO configuration.

``wait_for_gpu`` and ``gpu_diagnostics`` talk to the device (torch is imported inside them, never at
module import). The config builders are pure functions of the JobSpec, the catalog entry and what the
machine has (CUDA, vLLM): they decide between colocated vLLM and transformers generation, LoRA targets
for vision-language checkpoints, and the 4-bit QLoRA tier, and are unit-tested without a GPU.
Nothing here reads environment variables to override the JobSpec: ``rented_gpu`` reads the pod's only
for which vendor's pod it is and a test fake's word that its "pod" has no GPU (``ENV_CPU_POD``).
"""

from __future__ import annotations

import logging
import platform
import subprocess
import time
from collections.abc import Callable
from typing import Any

from autoslm.recipes.generation import sleep_allowed, use_4bit, vllm_usable
from autoslm.recipes.grpo import context_tokens

log = logging.getLogger("autoslm.gpu")

# Module names of vision towers and projectors in the vision-language checkpoints transformers ships
# (Qwen2/2.5/3-VL "visual", LLaVA/Gemma 3 "vision_tower" + "multi_modal_projector", Idefics/SmolVLM
# "vision_model" + "connector", Mllama "vision_model", InternVL "vision_model" + "mlp1"). PEFT applies
# a string ``exclude_modules`` with re.fullmatch to each module's full name.
VISION_MODULES = (
    "visual",
    "vision_tower",
    "vision_model",
    "vision_encoder",
    "image_encoder",
    "multi_modal_projector",
    "mm_projector",
    "connector",
    "mlp1",
)
VISION_EXCLUDE_REGEX = r"(^|.*\.)(" + "|".join(VISION_MODULES) + r")(\..*)?"


# ---------------------------------------------------------------------------------------------------
# Readiness and diagnostics


# Where a test's fake vendor runs a "pod" as a local process on a machine without a GPU
# (tests/fakes/cloud.py), it says so with this variable, and that pod trains on the CPU. No vendor sets
# it and the controller never passes it to a pod: a rented pod without CUDA is a host fault.
ENV_CPU_POD = "AUTOSLM_CPU_POD"


def rented_gpu(spec, environ) -> str | None:
    """The GPU a rented pod asked for, in words ("a pod rented from RunPod for RTX 4090"), or None where no
    GPU was asked for: a local run, or a test's fake vendor running a pod on this CPU (``ENV_CPU_POD``)."""
    from autoslm._image.boot_rules import pod_vendor
    from autoslm.providers import VENDORS

    c = spec.compute
    if c.is_local or not c.gpus or environ.get(ENV_CPU_POD) == "1":
        return None
    row = pod_vendor(environ)
    vendor = row["title"] if row else " or ".join(VENDORS[n].title for n in c.providers)
    cards = " or ".join(c.gpus)
    return f"a pod rented from {vendor} for {f'{c.gpu_count} x ' if c.gpu_count > 1 else ''}{cards}"


def no_cuda_fault(asked: str, diag: dict):
    """The error of a rented GPU pod whose torch sees no CUDA (``diag``: ``gpu_diagnostics()``): the GPU
    asked for, the driver nvidia-smi reports (or that there is none) and the CUDA torch needs. Retryable,
    as a lost host: another pod may be fine."""
    from autoslm.errors import WorkerError

    driver = f"NVIDIA driver {diag['driver']}" if diag.get("driver") else "no GPU (nvidia-smi is missing or found none)"
    need = f"CUDA {diag['torch_cuda']}" if diag.get("torch_cuda") else "CUDA, and this one is a CPU build"
    return WorkerError(
        f"{asked}, but torch sees no CUDA: nvidia-smi reports {driver}; torch {diag.get('torch', '?')} needs {need}",
        hint="the host is faulty (no GPU, or a driver older than that CUDA): the run is relaunched on another pod",
    )


def wait_for_gpu(
    timeout_s: float = 300.0,
    sleep: Callable[[float], None] = time.sleep,
    *,
    probe: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    max_interval_s: float = 5.0,
    asked: str | None = None,
    diagnose: Callable[[], dict] | None = None,
) -> bool:
    """Block until a real CUDA kernel runs. Rented nodes sometimes report a GPU before its driver can
    launch work; failing the first real allocation would look like a training bug.

    Returns True once the GPU ran a kernel, False at once when there is no CUDA (nothing to wait for)
    and no GPU was ``asked`` for; where one was (``rented_gpu``), no CUDA raises ``no_cuda_fault``: a
    rented GPU pod never trains on its CPU. Raises ``WorkerError`` (retryable: another node may be fine)
    after ``timeout_s``. ``probe`` replaces the kernel launch (tests); pauses grow from 0.5 s to
    ``max_interval_s``.
    """
    from autoslm.errors import WorkerError

    if probe is None:
        try:
            import torch

            cuda = torch.cuda.is_available()
        except ImportError:
            cuda = False
        if not cuda:
            if asked:
                raise no_cuda_fault(asked, (diagnose or gpu_diagnostics)())
            return False
        probe = _cuda_probe
    deadline = clock() + timeout_s
    attempt = 0
    while True:
        attempt += 1
        try:
            probe()
            if attempt > 1:
                log.info("GPU ready after %d attempts", attempt)
            return True
        except Exception as e:  # noqa: BLE001 - any failure of the probe means "not ready yet"
            last = f"{type(e).__name__}: {e}"
            if clock() >= deadline:
                raise WorkerError(
                    f"the GPU did not run a kernel within {timeout_s:g}s ({last})",
                    hint="the node may be faulty; the run will be relaunched",
                ) from None
            log.warning("GPU not ready (attempt %d): %s", attempt, last)
            sleep(min(max_interval_s, 0.5 * 2 ** (attempt - 1)))


def _cuda_probe() -> None:
    import torch

    for i in range(torch.cuda.device_count()):
        with torch.cuda.device(i):
            x = torch.ones(256, 256, device=f"cuda:{i}")
            y = (x @ x).sum()
            torch.cuda.synchronize(i)
            if float(y) != 256.0**3:
                raise RuntimeError(f"cuda:{i} computed a wrong result")


def gpu_diagnostics(run: Callable[..., Any] = subprocess.run) -> dict[str, Any]:
    """What the worker runs on: torch and CUDA versions, devices and their memory, the driver. Works
    (and says so) without CUDA or without torch; never raises."""
    out: dict[str, Any] = {"python": platform.python_version(), "cuda_available": False, "devices": []}
    try:
        import torch

        out["torch"] = torch.__version__
        out["torch_cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            out["cuda_available"] = True
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                dev = {
                    "index": i,
                    "name": p.name,
                    "memory_gb": round(p.total_memory / 2**30, 1),
                    "capability": f"{p.major}.{p.minor}",
                }
                try:
                    free, total = torch.cuda.mem_get_info(i)
                    dev["free_gb"] = round(free / 2**30, 1)
                except Exception:  # noqa: BLE001 - an unready device must not hide the rest
                    pass
                out["devices"].append(dev)
            out["bf16"] = bool(torch.cuda.is_bf16_supported())
    except Exception as e:  # noqa: BLE001
        out["torch_error"] = f"{type(e).__name__}: {e}"
    try:
        res = run(
            ["nvidia-smi", "--query-gpu=driver_version,name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        lines = [ln.strip() for ln in (res.stdout or "").splitlines() if ln.strip()]
        if res.returncode == 0 and lines:
            out["driver"] = lines[0].split(",")[0].strip()
            out["nvidia_smi"] = lines
    except (OSError, subprocess.SubprocessError):
        pass
    for pkg in ("vllm", "bitsandbytes", "flash_attn"):
        out[f"{pkg}_installed"] = installed(pkg)
    return out


def installed(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


# ---------------------------------------------------------------------------------------------------
# Config builders (pure)


def quantization_config_kwargs(spec, model_info, has_cuda: bool) -> dict[str, Any] | None:
    """``BitsAndBytesConfig(**kwargs)`` for the 4-bit tier, or None. The compute dtype is a name
    ("bfloat16"/"float32"): BitsAndBytesConfig accepts it as a string. On a machine without CUDA
    "auto" stays unquantized (CPU runs are for tiny models); an explicit "4bit" is honoured."""
    if not use_4bit(spec, model_info):
        return None
    if not has_cuda and spec.train.quantization != "4bit":
        return None
    kwargs: dict[str, Any] = {
        "load_in_4bit": True,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": True,
        "bnb_4bit_compute_dtype": "bfloat16" if has_cuda else "float32",
    }
    if model_info is not None and model_info.vision:
        # Keep the vision tower in full precision: it is not trained and quantizing it only costs quality.
        kwargs["llm_int8_skip_modules"] = list(VISION_MODULES) + ["lm_head"]
    return kwargs


def lora_config_kwargs(spec, model_info) -> dict[str, Any]:
    """``peft.LoraConfig(**kwargs)``: rank, alpha, dropout and targets from the JobSpec. For
    vision-language checkpoints the vision tower and projector are excluded (they are trained and
    served text-only)."""
    t = spec.train
    kwargs: dict[str, Any] = {
        "r": t.lora_rank,
        "lora_alpha": t.lora_alpha,
        "lora_dropout": t.lora_dropout,
        "target_modules": t.lora_targets if isinstance(t.lora_targets, str) else list(t.lora_targets),
        "bias": "none",
        "task_type": "CAUSAL_LM",
    }
    if model_info is not None and model_info.vision:
        kwargs["exclude_modules"] = VISION_EXCLUDE_REGEX
    return kwargs


# Over 80 lines by its docstring (each generation decision and why), not its body: the body is one
# straight run of those decisions into one dict.
def grpo_generation_config(
    spec,
    model_info,
    has_cuda: bool,
    has_vllm: bool,
    *,
    multi_turn: bool = False,
    notes: list[str] | None = None,
    gpu_mem_gib: float | None = None,
    processes: int = 1,
    micro: int | None = None,
    strategy: str = "ddp",
    fit=None,
) -> dict[str, Any]:
    """GRPOConfig keyword arguments for generation on this machine.

    vLLM path: ``use_vllm=True, vllm_mode="colocate"`` with the memory share, context length and sleep
    mode the planner chose (``fit``, a ``catalog.FitReport``; without one it is computed here for
    ``gpu_mem_gib`` at micro-batch ``micro``): "auto" share and "auto" sleep mode resolved for this card,
    sleep mode never chosen for multi-turn or dynamic sampling (``sleep_allowed``). Transformers path:
    ``use_vllm=False``. Precision and device (``use_cpu``, ``bf16``) are left out: they are common to every
    method. Stop strings: vLLM stops on them (``generation_kwargs={"stop": ...}``); the transformers path
    cannot (TRL does not hand generate() a tokenizer), so the reward builder must cut completions at them
    instead. A completion that ends on a stop string has no EOS token, which TRL's
    ``mask_truncated_completions`` would treat as truncated, so that option is turned off when there are
    stops. ``notes`` (if given) collects one line per decision, for the run's events.
    """
    t = spec.train
    notes = notes if notes is not None else []
    kwargs: dict[str, Any] = {
        "temperature": t.temperature,
        "top_p": t.top_p,
        "max_completion_length": t.max_completion_tokens,
        "beta": t.beta,
        "loss_type": t.loss_type,
        "scale_rewards": t.scale_rewards,
        "mask_truncated_completions": t.mask_truncated_completions and not t.stop,
        "chat_template_kwargs": {"enable_thinking": bool(spec.thinking)},
    }
    if t.stop and t.mask_truncated_completions:
        notes.append("stop strings end completions without EOS: mask_truncated_completions is off")
    vllm, why = vllm_usable(spec, model_info, has_cuda, has_vllm, multi_turn)
    notes.append(why)
    allow = sleep_allowed(spec, multi_turn)
    if fit is None and has_cuda and model_info is not None:
        from autoslm.catalog import fit_report

        sized = t.model_copy(update={"micro_batch_size": micro}) if micro else t
        fit = fit_report(
            model_info, gpu_mem_gib or 24.0, sized, processes=processes, strategy=strategy, allow_sleep=allow, has_vllm=has_vllm
        )
    if vllm:
        kwargs.update(_vllm_kwargs(t, fit, has_cuda, allow, notes))
        if model_info is not None and model_info.vision:
            notes.append(
                "vision-language model: vLLM serves its language model only (language_model_only); prompts are text-only"
            )
    else:
        kwargs["use_vllm"] = False
        if has_cuda and fit is not None and fit.generation_rounds > 1:
            notes.append(
                f"transformers generation in {fit.generation_rounds} rounds of {fit.generation_batch} completions per "
                "process: generate()'s KV cache for the whole step would not fit (see the memory estimate)"
            )
        if t.stop:
            notes.append("transformers generation cannot stop on strings: rewards cut completions at the stop strings")
    return kwargs


def _vllm_kwargs(t, fit, has_cuda: bool, allow: bool, notes: list[str]) -> dict[str, Any]:
    """Colocated vLLM's GRPOConfig keyword arguments: its memory share ("auto": the planner's, ``fit``),
    context length, stop strings and sleep mode (``allow``: ``sleep_allowed``)."""
    util = t.vllm.gpu_memory_utilization
    if util == "auto":
        util = fit.vllm_util if has_cuda and fit is not None and fit.vllm_util is not None else DEFAULT_VLLM_UTIL
        if has_cuda and fit is not None and fit.kv_fraction is not None:
            notes.append(
                f"vLLM's share: {util:.0%} of the GPU (auto: vLLM's start-up need plus KV room for "
                f"{fit.kv_fraction:.0%} of a step's rollouts, {fit.waves} decode wave{'s' if fit.waves != 1 else ''} a step)"
            )
    kwargs: dict[str, Any] = dict(
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=float(util),
        vllm_max_model_length=context_tokens(t),
        vllm_enable_sleep_mode=_sleep_mode(t, fit, has_cuda, allow, notes),
        vllm_tensor_parallel_size=1,
        vllm_model_impl="vllm",
    )
    if t.stop:
        kwargs["generation_kwargs"] = {"stop": list(t.stop), "include_stop_str_in_output": True}
    return kwargs


def _sleep_mode(t, fit, has_cuda: bool, allow: bool, notes: list[str]) -> bool:
    """Whether vLLM sleeps while training: "auto" follows the planner (``fit``), and the notes say why."""
    if not has_cuda:
        # Nothing to free on a CPU host: only an explicit true asks (vLLM's CPU platform refuses it;
        # grpo.check_vllm says so before training).
        return t.vllm.sleep_mode is True
    if t.vllm.sleep_mode != "auto":
        sleep = bool(t.vllm.sleep_mode)
        if sleep and not allow:
            notes.append(
                "sleep mode on (asked for): every generation call (each turn, each extra draw) wakes vLLM "
                "and re-pushes every weight"
            )
        return sleep
    sleep = bool(fit is not None and fit.sleep_mode)
    fits = fit is None or bool(fit.ok)
    awake = fit.awake_waves if fit is not None else None
    notes.append(
        (
            "sleep mode on: training and vLLM do not both fit"
            if awake is None
            else f"sleep mode on: vLLM's share is freed while training, so its KV cache holds more of a step "
            f"({fit.waves} decode waves instead of {awake})"
        )
        if sleep
        else "sleep mode off: it would not make training and vLLM fit (see the memory estimate)"
        if allow and not fits
        else "sleep mode off: training and vLLM fit side by side"
        if allow
        else "sleep mode off: multi-turn and dynamic sampling generate several times per step, and each "
        "wake-up would re-push every weight"
    )
    return sleep


# What "auto" resolves to where the card is not known (a CPU host: vLLM's CPU build sizes its KV cache by
# train.vllm.cpu_kv_cache_gib instead).
DEFAULT_VLLM_UTIL = 0.3


def vision_engine_args(vision: bool) -> dict:
    """The colocated engine's extra arguments for a vision-language checkpoint: serve only its language
    model (vLLM 0.31's ``language_model_only``: no vision tower in GPU memory, and the weight names TRL
    syncs match). TRL 1.16 has no way to add an engine argument; ``engine.train.trainer`` adds these."""
    return {"language_model_only": True} if vision else {}
