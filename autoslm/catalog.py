"""What we know about models and GPUs: sizes, memory needs, provider ids, speed. Pure data and arithmetic.

Used by ``autoslm plan`` (does the model fit, what will it cost), by the providers (RunPod GPU ids,
Vast GPU names) and by the worker (quantization tier, whether vLLM can serve it, how to treat
vision-language checkpoints). It must never touch the network, the filesystem or torch: every number
here is an estimate from a formula, stated with its assumptions, so a plan can be shown before any
money is spent.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelInfo:
    id: str
    params_b: float  # billions of parameters
    hidden: int
    layers: int
    vllm_ok: bool = True  # vLLM can serve it
    vision: bool = False  # a vision-language checkpoint: trained and served text-only
    quant: str = "none"  # "none" | "4bit": the tier used when quantization = "auto"
    max_context: int = 32768
    vocab: int = 151936  # logits are tokens x vocab: often the largest activation of a small model
    estimated: bool = False  # not in the table: sizes guessed from the model id
    model_type: str | None = None  # the config's model_type: decides which Liger kernels apply


# Architectures whose layers Liger patches (liger_kernel.transformers' apply_liger_kernel_to_* table).
LIGER_MODEL_TYPES = frozenset({"qwen2", "qwen3", "qwen2_5_vl", "qwen2_vl", "llama", "mistral", "gemma", "gemma2",
                               "gemma3_text", "gemma3", "phi3", "granite", "olmo2", "smollm3"})


# Built-in offline models: built locally by the worker, no download.
BUILTIN_MODELS: dict[str, ModelInfo] = {
    "autoslm/tiny": ModelInfo("autoslm/tiny", params_b=0.0002, hidden=64, layers=2, vllm_ok=False, max_context=2048, vocab=1024),
}

MODELS: dict[str, ModelInfo] = {
    **BUILTIN_MODELS,
    "Qwen/Qwen3-0.6B": ModelInfo("Qwen/Qwen3-0.6B", 0.6, 1024, 28, model_type="qwen3"),
    "Qwen/Qwen3-1.7B": ModelInfo("Qwen/Qwen3-1.7B", 1.7, 2048, 28, model_type="qwen3"),
    "Qwen/Qwen3-4B": ModelInfo("Qwen/Qwen3-4B", 4.0, 2560, 36, model_type="qwen3"),
    "Qwen/Qwen3-8B": ModelInfo("Qwen/Qwen3-8B", 8.2, 4096, 36, model_type="qwen3"),
    "Qwen/Qwen3-14B": ModelInfo("Qwen/Qwen3-14B", 14.8, 5120, 40, quant="4bit", model_type="qwen3"),
    "Qwen/Qwen3-32B": ModelInfo("Qwen/Qwen3-32B", 32.8, 5120, 64, quant="4bit", model_type="qwen3"),
    "Qwen/Qwen2.5-VL-3B-Instruct": ModelInfo("Qwen/Qwen2.5-VL-3B-Instruct", 3.8, 2048, 36, vision=True, model_type="qwen2_5_vl"),
    "Qwen/Qwen2.5-VL-7B-Instruct": ModelInfo("Qwen/Qwen2.5-VL-7B-Instruct", 8.3, 3584, 28, vision=True, model_type="qwen2_5_vl"),
    "meta-llama/Llama-3.2-1B-Instruct": ModelInfo("meta-llama/Llama-3.2-1B-Instruct", 1.2, 2048, 16, vocab=128256, model_type="llama"),
    "meta-llama/Llama-3.2-3B-Instruct": ModelInfo("meta-llama/Llama-3.2-3B-Instruct", 3.2, 3072, 28, vocab=128256, model_type="llama"),
    "google/gemma-3-1b-it": ModelInfo("google/gemma-3-1b-it", 1.0, 1152, 26, vocab=262144, model_type="gemma3_text"),
    "HuggingFaceTB/SmolLM2-1.7B-Instruct": ModelInfo("HuggingFaceTB/SmolLM2-1.7B-Instruct", 1.7, 2048, 24, vocab=49152, model_type="llama"),
}


def model_info(model_id: str) -> ModelInfo | None:
    return MODELS.get(model_id)


_SIZE_IN_NAME = re.compile(r"(?<![A-Za-z0-9.])(\d+(?:\.\d+)?)\s*([BbMm])(?![A-Za-z])")


def guess_model_info(model_id: str) -> ModelInfo | None:
    """The table's entry, else sizes guessed from a "...-7B..." / "...-360M..." id; None if no size is in the name.

    A guess assumes a dense decoder with ``params ~= 12 * layers * hidden**2`` and a Qwen-sized vocab;
    it is marked ``estimated=True`` so a plan can say so.
    """
    known = MODELS.get(model_id)
    if known:
        return known
    name = model_id.rsplit("/", 1)[-1]
    m = _SIZE_IN_NAME.search(name.replace("_", "-"))
    if not m:
        return None
    params_b = float(m.group(1)) / (1000.0 if m.group(2) in "Mm" else 1.0)
    if params_b <= 0:
        return None
    layers = 16 if params_b < 1.5 else 28 if params_b < 5 else 36 if params_b < 10 else 48 if params_b < 40 else 80
    hidden = int(math.sqrt(params_b * 1e9 / (12 * layers)) // 64 * 64) or 64
    return ModelInfo(model_id, params_b, hidden, layers, quant="4bit" if params_b > 12 else "none", estimated=True)


# ---------------------------------------------------------------------------------------------------
# GPUs


@dataclass(frozen=True)
class GPUInfo:
    """One GPU type. ``name`` is what a JobSpec says (``compute.gpu``); vendor ids map to it."""

    name: str
    vram_gb: float  # the datasheet's number ("48 GB")
    mem_gib: float  # what the card reports to CUDA (an L40S's "48 GB" is 45 GiB, a 4090's "24 GB" is 24 GiB)
    runpod_id: str | None  # RunPod v2 catalog id ("NVIDIA GeForce RTX 4090"), None where RunPod has none
    vast_name: str | None  # Vast ``gpu_name`` ("RTX 4090")
    bf16_tflops: float  # dense bf16 tensor throughput, from the vendor's datasheet
    mem_bw_gbs: float  # memory bandwidth, GB/s
    capability: tuple[int, int] = (8, 0)  # CUDA compute capability: bf16 and flash-attention need >= 8.0, FA3 9.0
    aliases: tuple[str, ...] = ()


GPUS: dict[str, GPUInfo] = {
    g.name: g
    for g in (
        GPUInfo("RTX 3090", 24, 24.0, "NVIDIA GeForce RTX 3090", "RTX 3090", 71, 936, (8, 6)),
        GPUInfo("RTX 4090", 24, 24.0, "NVIDIA GeForce RTX 4090", "RTX 4090", 165, 1008, (8, 9)),
        GPUInfo("RTX 5090", 32, 31.8, "NVIDIA GeForce RTX 5090", "RTX 5090", 209, 1792, (12, 0)),
        GPUInfo("RTX A5000", 24, 24.0, "NVIDIA RTX A5000", "RTX A5000", 55, 768, (8, 6), ("A5000",)),
        GPUInfo("RTX A6000", 48, 48.0, "NVIDIA RTX A6000", "RTX A6000", 77, 768, (8, 6), ("A6000",)),
        GPUInfo("RTX 6000 Ada", 48, 48.0, "NVIDIA RTX 6000 Ada Generation", "RTX 6000Ada", 182, 960, (8, 9), ("RTX 6000 Ada Generation",)),
        GPUInfo("L4", 24, 22.5, "NVIDIA L4", "L4", 121, 300, (8, 9)),
        GPUInfo("L40", 48, 45.0, "NVIDIA L40", "L40", 181, 864, (8, 9)),
        GPUInfo("L40S", 48, 45.0, "NVIDIA L40S", "L40S", 362, 864, (8, 9)),
        GPUInfo("A40", 48, 45.0, "NVIDIA A40", "A40", 75, 696, (8, 6)),
        GPUInfo("A100 80GB PCIe", 80, 80.0, "NVIDIA A100 80GB PCIe", "A100 PCIE", 312, 1935, (8, 0), ("A100 PCIe", "A100")),
        GPUInfo("A100 80GB SXM", 80, 80.0, "NVIDIA A100-SXM4-80GB", "A100 SXM4", 312, 2039, (8, 0), ("A100 SXM", "A100 SXM4")),
        GPUInfo("H100 PCIe", 80, 79.6, "NVIDIA H100 PCIe", "H100 PCIE", 756, 2000, (9, 0)),
        GPUInfo("H100 SXM", 80, 79.6, "NVIDIA H100 80GB HBM3", "H100 SXM", 989, 3350, (9, 0), ("H100", "H100 80GB", "H100 80GB HBM3")),
        GPUInfo("H100 NVL", 94, 93.6, "NVIDIA H100 NVL", "H100 NVL", 835, 3900, (9, 0)),
        GPUInfo("H200", 141, 140.4, "NVIDIA H200", "H200", 989, 4800, (9, 0)),
        GPUInfo("B200", 180, 179.0, "NVIDIA B200", "B200", 2250, 8000, (10, 0)),
    )
}

# The worker image's CUDA build (torch 2.13 wheels from PyPI carry CUDA 13.0): hosts must offer at least this.
WORKER_MIN_CUDA = "13.0"
# Where worker_image/Dockerfile is pushed (docs/worker-image.md); compute.image overrides it.
WORKER_IMAGE_REPO = "ghcr.io/autoslm/worker"


def default_worker_image() -> str:
    """The worker image tagged with this autoslm version."""
    from autoslm.version import __version__

    return f"{WORKER_IMAGE_REPO}:{__version__}"


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower().replace("nvidia", "").replace("geforce", ""))


_GPU_INDEX: dict[str, GPUInfo] = {}
for _g in GPUS.values():
    for _n in (_g.name, _g.runpod_id, _g.vast_name, *_g.aliases):
        if _n:
            _GPU_INDEX.setdefault(_norm(_n), _g)


def gpu_info(name: str) -> GPUInfo | None:
    """Find a GPU by our name, a RunPod id or a Vast name, ignoring case, spaces and "NVIDIA GeForce"."""
    return _GPU_INDEX.get(_norm(name))


def gpu_id(provider: str, name: str) -> str | None:
    """The vendor's id for a GPU name ("runpod" -> catalog id, "vast" -> gpu_name); None if it has none.

    An unknown name is passed through unchanged, so a GPU newer than this table still works when
    the user writes the vendor's own id.
    """
    g = gpu_info(name)
    if g is None:
        return name
    return {"runpod": g.runpod_id, "vast": g.vast_name}.get(provider)


def gpu_names() -> list[str]:
    return sorted(GPUS)


# ---------------------------------------------------------------------------------------------------
# Memory


GiB = 1024**3
# Bytes per parameter of the frozen base model by quantization tier. "4bit" is NF4 with double
# quantization (~0.5 B) plus the embeddings and norms that stay in bf16: 0.6 B on average.
WEIGHT_BYTES = {"none": 2.0, "4bit": 0.6}
FUSED_HEAD_TOKENS = 4096  # TRL's chunked log-prob kernel: tokens per tile
FUSED_HEAD_VOCAB = 32768  # and vocabulary entries per tile
_ATTN_TARGETS = {"q_proj": 2, "k_proj": 1.25, "v_proj": 1.25, "o_proj": 2}  # multiples of rank*hidden
_MLP_TARGETS = {"gate_proj": 4, "up_proj": 4, "down_proj": 4}  # intermediate ~= 3 * hidden


@dataclass(frozen=True)
class VramEstimate:
    """Peak GPU memory of one training process, in GiB, with the parts that make it up.

    ``vllm_gb`` is the least the colocated vLLM engine needs (weights + KV cache for one rollout
    batch + its own overhead); on a GPU, vLLM takes ``vllm_fraction`` of the card, so whether it
    fits depends on the card: see ``fit_report``.
    """

    model: str
    quant: str
    weights_gb: float
    lora_gb: float  # LoRA weights, gradients and AdamW state (fp32)
    activations_gb: float  # checkpointed hidden states, one layer's recompute, logits and their gradient
    overhead_gb: float  # CUDA context, allocator fragmentation
    vllm_gb: float = 0.0
    vllm_fraction: float = 0.0
    vllm_sleep: bool = False
    estimated_model: bool = False

    @property
    def train_gb(self) -> float:
        return self.weights_gb + self.lora_gb + self.activations_gb + self.overhead_gb

    @property
    def static_gb(self) -> float:
        """What stays on the GPU while vLLM generates (activations are freed by then)."""
        return self.weights_gb + self.lora_gb + self.overhead_gb

    @property
    def total_gb(self) -> float:
        return self.train_gb + self.vllm_gb

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "quant": self.quant,
            "weights_gb": round(self.weights_gb, 2),
            "lora_gb": round(self.lora_gb, 2),
            "activations_gb": round(self.activations_gb, 2),
            "overhead_gb": round(self.overhead_gb, 2),
            "vllm_gb": round(self.vllm_gb, 2),
            "total_gb": round(self.total_gb, 2),
            "estimated_model": self.estimated_model,
        }


def _resolve_model(model: str | ModelInfo) -> ModelInfo | None:
    return model if isinstance(model, ModelInfo) else guess_model_info(model)


def quant_tier(model: str | ModelInfo, train: Any = None) -> str:
    """"none" or "4bit": the train spec's ``quantization`` if set, else the catalog's tier for "auto"."""
    info = _resolve_model(model)
    wanted = getattr(train, "quantization", "auto") if train is not None else "auto"
    if wanted in ("none", "4bit"):
        return wanted
    return info.quant if info else "none"


def _lora_params(info: ModelInfo, train: Any) -> float:
    rank = getattr(train, "lora_rank", 16)
    targets = getattr(train, "lora_targets", "all-linear")
    if targets == "all-linear":
        per_rank_hidden = sum(_ATTN_TARGETS.values()) + sum(_MLP_TARGETS.values())
    else:
        table = {**_ATTN_TARGETS, **_MLP_TARGETS}
        # An unknown module name is counted like an attention projection: a guess, but never zero.
        per_rank_hidden = sum(table.get(t, 2) for t in targets)
    return info.layers * rank * info.hidden * per_rank_hidden


def _micro_batch(train: Any, micro: int | None = None, processes: int = 1) -> tuple[int, int, int]:
    """(sequences per forward pass, tokens per sequence, tokens whose logits are kept) for one of
    ``processes`` training processes (the step's batch is split over them)."""
    max_length = getattr(train, "max_length", 512)
    procs = max(1, processes)
    if getattr(train, "method", "sft") == "grpo":
        per_step = train.prompts_per_step * train.group_size
        micro = micro or train.micro_batch_size or min(max(1, per_step // procs), train.group_size * 2)
        return micro, max_length, min(train.max_completion_tokens, max_length)
    micro = micro or getattr(train, "micro_batch_size", None) or max(1, getattr(train, "batch_size", 16) // procs)
    return micro, max_length, max_length


def liger_applies(info: ModelInfo, train: Any = None) -> bool:
    """Whether the worker patches this model with Liger kernels on a GPU (``train.liger_kernel``)."""
    wanted = getattr(train, "liger_kernel", "auto") if train is not None else "auto"
    return wanted is not False and info.model_type in LIGER_MODEL_TYPES


def vram_breakdown(
    model: str | ModelInfo, train: Any = None, *, micro: int | None = None,
    checkpointing: bool | None = None, liger: bool | None = None, processes: int = 1, strategy: str = "ddp",
) -> VramEstimate | None:
    """Peak GPU memory of one training process (one GPU) for this model and ``[train]`` section, when
    ``processes`` processes share each step under ``strategy``; None for an unknown model.

    DDP: every GPU holds the whole model and LoRA state; the step's batch is split over the GPUs.
    FSDP: base weights and LoRA state are sharded (1/processes each, plus one layer's full weights
    gathered at a time); activations stay per GPU. Colocated vLLM (GRPO) still holds whole weights on
    every GPU (tensor parallel 1), so FSDP helps training, not generation.

    It assumes the GPU recipe the worker runs (``autoslm/engine/train/recipe.py``): bf16 base weights (or the
    quantized tier: ``train.quantization``, for SFT and GRPO alike), LoRA in fp32 with AdamW (16 B/param),
    activation checkpointing on unless ``train.gradient_checkpointing = false`` (one bf16 hidden state per
    layer per token kept, one layer recomputed at a time; off: every layer's working set is kept), the
    logits only in TRL's fused LM-head tiles (never the whole batch x vocab), Liger's layer kernels trimming a
    fifth of a layer's working set, and 1 GiB CUDA context plus 10% fragmentation. GRPO adds colocated vLLM (never for the 4-bit
    tier, which vLLM cannot load): bf16 weights, a KV cache for every rollout of one step, 1.5 GiB engine
    overhead. ``micro``, ``checkpointing`` and ``liger`` override what the spec implies.
    """
    if train is None:
        from autoslm.recipes.sft import SFTTrain

        train = SFTTrain()
    info = _resolve_model(model)
    if info is None:
        return None
    quant = quant_tier(info, train)
    method = getattr(train, "method", "sft")
    if checkpointing is None:
        checkpointing = getattr(train, "gradient_checkpointing", "auto") is not False
    if liger is None:
        liger = liger_applies(info, train)
    params = info.params_b * 1e9
    procs = max(1, processes)
    weights = params * WEIGHT_BYTES[quant]
    lora = _lora_params(info, train) * 16
    micro, seq, logit_tokens = _micro_batch(train, micro, procs)
    if strategy == "fsdp" and procs > 1:
        weights = weights / procs + weights / max(1, info.layers)  # own shard + one gathered layer
        lora = lora / procs
    tokens = micro * seq
    layer_work = tokens * info.hidden * 34 * 2  # one layer's working set (attention + MLP intermediates), bf16
    if liger:
        layer_work = layer_work * 0.8  # Liger's SwiGLU and RMSNorm keep fewer intermediates
    if checkpointing:
        hidden_states = tokens * info.hidden * info.layers * 2  # one checkpoint per layer, bf16
        activations = hidden_states + layer_work
    else:
        activations = layer_work * info.layers
    # TRL 1.16 scores tokens through a fused LM head: logits are computed in [4096 tokens x 32768 vocab]
    # fp32 tiles (with their gradient), never as a whole (batch, seq, vocab) tensor.
    kept = micro * logit_tokens
    logits = min(kept, FUSED_HEAD_TOKENS) * min(info.vocab, FUSED_HEAD_VOCAB) * 8 + kept * 4 * 3
    activations += logits
    subtotal = weights + lora + activations
    overhead = 1 * GiB + 0.1 * subtotal

    vllm = 0.0
    fraction = 0.0
    sleep = False
    if method == "grpo" and info.vllm_ok and quant != "4bit":
        rollouts = math.ceil(train.prompts_per_step * train.group_size / procs)
        vcfg = getattr(train, "vllm", None)
        ctx = (vcfg.max_model_len if vcfg and vcfg.max_model_len else None) or seq
        kv_per_token = 2 * info.layers * (info.hidden / 4) * 2  # K and V, GQA ~ hidden/4, bf16
        vllm = params * WEIGHT_BYTES[quant] + rollouts * ctx * kv_per_token + 1.5 * GiB
        fraction = vcfg.gpu_memory_utilization if vcfg else 0.3
        sleep = (vcfg.sleep_mode is True) if vcfg else False
    return VramEstimate(
        model=info.id,
        quant=quant,
        weights_gb=weights / GiB,
        lora_gb=lora / GiB,
        activations_gb=activations / GiB,
        overhead_gb=overhead / GiB,
        vllm_gb=vllm / GiB,
        vllm_fraction=fraction,
        vllm_sleep=sleep,
        estimated_model=info.estimated,
    )


def estimate_vram_gb(model: str | ModelInfo, train: Any = None, *, processes: int = 1, strategy: str = "ddp") -> float | None:
    """Total GiB one training process needs (training peak + what colocated vLLM needs); None if unknown."""
    est = vram_breakdown(model, train, processes=processes, strategy=strategy)
    return None if est is None else est.total_gb


@dataclass(frozen=True)
class FitReport:
    ok: bool | None  # None: the model is unknown, nobody can tell
    need_gb: float | None
    vram_gb: float | None
    reason: str = ""
    sleep_mode: bool = False  # colocated vLLM must sleep while training for this to fit


def fit_report(model: str | ModelInfo, gpu: str | GPUInfo | float, train: Any = None, *, processes: int = 1,
               strategy: str = "ddp") -> FitReport:
    """Whether one process of this run fits on one GPU of this type, with ``processes`` GPUs per pod
    under ``strategy`` (DDP: every GPU holds it all; FSDP: the model is sharded, see ``vram_breakdown``).

    ``gpu`` is a name, a GPUInfo, or a memory size in GiB (for a vendor's card this table lacks). With
    vLLM colocated, vLLM takes ``gpu_memory_utilization`` of the card: that share must hold vLLM's
    need, and training must fit in the rest -- or, with sleep mode, beside vLLM only while it
    generates (weights and LoRA state stay, activations are gone).
    """
    if isinstance(gpu, (int, float)):
        vram, gib, label = float(gpu), float(gpu), f"{gpu:g} GB GPU"
    else:
        g = gpu if isinstance(gpu, GPUInfo) else gpu_info(gpu)
        if g is None:
            return FitReport(None, None, None, f"unknown GPU {gpu!r}: its memory is not in the catalog")
        vram, gib, label = g.vram_gb, g.mem_gib, g.name
    est = vram_breakdown(model, train, processes=processes, strategy=strategy)
    if est is None:
        return FitReport(None, None, vram, f"unknown model {getattr(model, 'id', model)!r}: no size to estimate from")
    # The driver and CUDA's own reservations leave about 97% of what the card reports.
    have = gib * 0.97
    need = est.total_gb
    if est.vllm_gb == 0:
        ok = est.train_gb <= have
        why = "" if ok else f"needs ~{est.train_gb:.1f} GiB per GPU, {label} has {have:.1f} GiB usable" + (
            ' (compute.strategy = "fsdp" shards the model over the GPUs)' if processes > 1 and strategy != "fsdp" else "")
        return FitReport(ok, est.train_gb, vram, why)
    vllm_share = have * est.vllm_fraction
    if vllm_share < est.vllm_gb:
        return FitReport(
            False, need, vram,
            f"vLLM needs ~{est.vllm_gb:.1f} GiB but gets {est.vllm_fraction:.0%} of {label} = {vllm_share:.1f} GiB: "
            "raise train.vllm.gpu_memory_utilization or pick a larger GPU",
        )
    awake = est.train_gb + vllm_share  # vLLM keeps its share while training runs
    asleep = max(est.train_gb, est.static_gb + vllm_share)  # sleep mode: vLLM's share is freed to train
    wanted = getattr(getattr(train, "vllm", None), "sleep_mode", "auto")
    sleep = est.vllm_sleep or (wanted == "auto" and awake > have)
    peak = asleep if sleep else awake
    ok = peak <= have
    why = "" if ok else (
        f"training ~{est.train_gb:.1f} GiB + vLLM share {vllm_share:.1f} GiB peaks at ~{peak:.1f} GiB"
        f"{' with sleep mode' if sleep else ''}; {label} has {have:.1f} GiB usable"
    )
    return FitReport(ok, peak, vram, why, sleep_mode=sleep)


def needs_sleep_mode(model: str | ModelInfo, gpu: str | GPUInfo | float, train: Any, *, processes: int = 1) -> bool:
    """``train.vllm.sleep_mode`` resolved: "auto" turns it on only when training and vLLM's share do not
    both fit (sleep mode costs seconds per step: vLLM's weights and KV cache are freed and re-made)."""
    wanted = getattr(getattr(train, "vllm", None), "sleep_mode", "auto")
    if wanted != "auto":
        return bool(wanted)
    return fit_report(model, gpu, train, processes=processes).sleep_mode


def fits(model: str | ModelInfo, gpu: str | GPUInfo | float, train: Any = None, *, processes: int = 1, strategy: str = "ddp") -> bool | None:
    """True/False whether the run fits on one GPU of this type; None when the model or GPU is unknown."""
    return fit_report(model, gpu, train, processes=processes, strategy=strategy).ok


# ---------------------------------------------------------------------------------------------------
# Time and money


MFU = 0.30  # share of datasheet bf16 throughput a LoRA run of a small model reaches: a conservative guess
DECODE_EFFICIENCY = 0.35  # share of memory bandwidth a batched decode step uses
SETUP_HOURS = 0.15  # image pull, model download, compile/warm-up: paid before the first step


@dataclass(frozen=True)
class RunEstimate:
    """What a run should take. ``hours``/``usd`` are None when the number of steps is unknown."""

    steps: int | None
    hours: float | None
    usd: float | None
    ceiling_usd: float  # price x limits.max_hours (and limits.max_usd when lower): what it can cost at most
    basis: str  # how the numbers were found, for ``autoslm plan``


def train_steps(train: Any, n_examples: int | None = None) -> int | None:
    """Optimizer steps: ``max_steps``, else epochs x examples / examples-per-step (None without a dataset size)."""
    if getattr(train, "max_steps", None):
        return int(train.max_steps)
    if not n_examples:
        return None
    per_step = train.prompts_per_step if getattr(train, "method", "sft") == "grpo" else train.batch_size
    return max(1, math.ceil((train.epochs or 1.0) * n_examples / per_step))


def step_seconds(model: str | ModelInfo, gpu: str | GPUInfo, train: Any, gpu_count: int = 1) -> float | None:
    """Seconds per optimizer step: compute-bound training plus (GRPO) bandwidth-bound generation."""
    info = _resolve_model(model)
    g = gpu if isinstance(gpu, GPUInfo) else gpu_info(gpu)
    if info is None or g is None:
        return None
    params = info.params_b * 1e9
    flops_per_s = g.bf16_tflops * 1e12 * MFU * max(1, gpu_count)
    if getattr(train, "method", "sft") == "grpo":
        seqs = train.prompts_per_step * train.group_size
        tokens = seqs * train.max_length
        # Forward+backward with recompute ~ 8 x params per token; a KL reference or old-logprob pass adds one forward.
        train_s = 8 * params * tokens / flops_per_s
        weight_bytes = params * WEIGHT_BYTES[quant_tier(info, train)]
        per_decode_step = weight_bytes / (g.mem_bw_gbs * 1e9 * DECODE_EFFICIENCY)
        # All rollouts of a step decode together, so generation costs ~ completion length x one weight read.
        gen_s = train.max_completion_tokens * per_decode_step / max(1, gpu_count) + 0.002 * seqs
        return train_s + gen_s
    tokens = train.batch_size * train.max_length
    return 8 * params * tokens / flops_per_s


def estimate_run(
    model: str | ModelInfo,
    gpu: str | GPUInfo,
    train: Any,
    price_per_hour: float,
    *,
    max_hours: float,
    max_usd: float | None = None,
    gpu_count: int = 1,
    n_examples: int | None = None,
) -> RunEstimate:
    """Rough duration and cost of one replica, and the most it can cost under the spec's limits."""
    ceiling = price_per_hour * max_hours
    if max_usd is not None:
        ceiling = min(ceiling, max_usd)
    steps = train_steps(train, n_examples)
    per_step = step_seconds(model, gpu, train, gpu_count) if steps else None
    if steps is None:
        return RunEstimate(None, None, None, ceiling, "steps unknown (epochs over a dataset of unknown size): cost capped by limits")
    if per_step is None:
        return RunEstimate(steps, None, None, ceiling, "unknown model or GPU speed: cost capped by limits")
    hours = SETUP_HOURS + steps * per_step / 3600
    capped = hours > max_hours
    hours = min(hours, max_hours)
    usd = min(hours * price_per_hour, ceiling)
    basis = f"{steps} steps x ~{per_step:.1f} s + {SETUP_HOURS * 60:.0f} min setup (MFU {MFU:.0%})"
    if capped:
        basis += f"; limited by limits.max_hours = {max_hours:g}"
    return RunEstimate(steps, hours, usd, ceiling, basis)
