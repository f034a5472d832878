"""What we know about models and GPUs: sizes, memory needs, provider ids, speed. Pure data and arithmetic.

Used by ``autoslm plan`` (does the model fit, what will it cost), by the providers (RunPod GPU ids,
Vast GPU names) and by the worker (quantization tier, whether vLLM can serve it, how to treat
vision-language checkpoints). It must never touch the network, the filesystem or torch: every number
here is an estimate from a formula, stated with its assumptions, so a plan can be shown before any
money is spent.

Five modules, imported here as one namespace: ``models`` (the model table), ``gpus`` (the GPU table and
the worker image), ``memory`` (what a run holds on a GPU), ``fit`` (whether it fits, and at which micro-batch,
generation batch, vLLM share and sleep mode: the one function plan, validate, --print-config and the worker
share) and ``cost`` (time and money). ``spec_checks`` (vLLM's share of each GPU a spec names, and
``plan``'s line about the pod's recipe) is imported by its own name.

The catalog sits above ``autoslm.recipes`` (it prices and fits the recipes' rules); ``recipes`` never
imports it.
"""

from __future__ import annotations

from autoslm.catalog.cost import (  # noqa: F401
    DECODE_EFFICIENCY,
    MFU,
    RunEstimate,
    estimate_run,
    step_seconds,
    train_steps,
)
from autoslm.catalog.fit import (  # noqa: F401
    MAX_TOKENS_PER_MICRO_BATCH,
    FitReport,
    fit_report,
    fits,
    kv_floor_gb,
    needs_sleep_mode,
    vllm_headroom_gib,
    vllm_share,
    vllm_waves,
)
from autoslm.catalog.gpus import (  # noqa: F401
    GPUS,
    WORKER_IMAGE_REPO,
    WORKER_MIN_CUDA,
    GiB,
    GPUInfo,
    default_worker_image,
    gpu_choices,
    gpu_id,
    gpu_info,
    gpu_names,
)
from autoslm.catalog.memory import (  # noqa: F401
    FUSED_HEAD_TOKENS,
    FUSED_HEAD_VOCAB,
    VLLM_KV_MIN,
    VLLM_KV_WARN,
    VLLM_MAX_AUTO_SHARE,
    VLLM_SAMPLER_BYTES,
    WEIGHT_BYTES,
    VramEstimate,
    estimate_vram_gb,
    host_ram_gb,
    kv_bytes_per_token,
    liger_applies,
    quant_tier,
    resolve_model,
    servable_by_vllm,
    vllm_fixed_bytes,
    vllm_sampler_bytes,
    vram_breakdown,
)
from autoslm.catalog.models import (  # noqa: F401
    BUILTIN_MODELS,
    LIGER_MODEL_TYPES,
    MODELS,
    ModelInfo,
    guess_model_info,
    model_info,
)
from autoslm.catalog.setup import SetupEstimate, model_download_gb, setup_estimate  # noqa: F401
