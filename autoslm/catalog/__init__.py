"""What we know about models and GPUs: sizes, memory needs, provider ids, speed. Pure data and arithmetic.

Used by ``autoslm plan`` (does the model fit, what will it cost), by the providers (RunPod GPU ids,
Vast GPU names) and by the worker (quantization tier, whether vLLM can serve it, how to treat
vision-language checkpoints). It must never touch the network, the filesystem or torch: every number
here is an estimate from a formula, stated with its assumptions, so a plan can be shown before any
money is spent.

Four modules, imported here as one namespace: ``models`` (the model table), ``gpus`` (the GPU table and
the worker image), ``memory`` (the planner: fit and sleep mode) and ``cost`` (time and money).
"""

from __future__ import annotations

from autoslm.catalog.models import (  # noqa: F401
    BUILTIN_MODELS,
    LIGER_MODEL_TYPES,
    MODELS,
    ModelInfo,
    guess_model_info,
    model_info,
)
from autoslm.catalog.gpus import (  # noqa: F401
    gpu_choices,
    GPUInfo,
    GPUS,
    GiB,
    WORKER_IMAGE_REPO,
    WORKER_MIN_CUDA,
    default_worker_image,
    gpu_id,
    gpu_info,
    gpu_names,
)
from autoslm.catalog.memory import (  # noqa: F401
    FUSED_HEAD_TOKENS,
    FUSED_HEAD_VOCAB,
    FitReport,
    VLLM_KV_TARGET,
    VramEstimate,
    WEIGHT_BYTES,
    estimate_vram_gb,
    fit_report,
    fits,
    host_ram_gb,
    kv_bytes_per_token,
    liger_applies,
    needs_sleep_mode,
    quant_tier,
    resolve_model,
    vllm_fixed_bytes,
    vllm_share,
    vllm_waves,
    vram_breakdown,
)
from autoslm.catalog.cost import (  # noqa: F401
    DECODE_EFFICIENCY,
    MFU,
    RunEstimate,
    SETUP_HOURS,
    estimate_run,
    step_seconds,
    train_steps,
)
