"""The memory planner: what a run needs on one GPU (weights, LoRA, optimizer, activations, logits,
colocated vLLM), whether it fits, and whether GRPO needs vLLM's sleep mode. Every number is an
estimate from a formula stated with its assumptions; nothing here touches a device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from autoslm.catalog.gpus import GiB
from autoslm.catalog.models import LIGER_MODEL_TYPES, ModelInfo, guess_model_info

# Bytes per parameter of the frozen base model by quantization tier. "4bit" is NF4 with double
# quantization (~0.5 B) plus the embeddings and norms that stay in bf16: 0.6 B on average.
WEIGHT_BYTES = {"none": 2.0, "4bit": 0.6}
# vLLM 0.31's start-up rule (vllm/v1/worker/gpu_worker.py, vllm/v1/core/kv_cache_utils.py): it takes
# ``total x gpu_memory_utilization``; less its weights, the non-torch memory, the profiling peak (a forward
# of max_num_batched_tokens, 4096 from TRL, and a sampler pass over max_num_seqs rows: ``vllm_sampler_bytes``)
# and its CUDA-graph estimate, what is left is KV cache, which must hold one max_model_len request.
VLLM_PROFILE_TOKENS = 4096  # TRL 1.16's max_num_batched_tokens
VLLM_NON_TORCH_GB = 0.25  # NCCL and cuBLAS workspaces vLLM counts outside torch's allocator
VLLM_CUDA_GRAPH_GB = 0.5  # its CUDA-graph estimate for the batch sizes it captures
# "auto" sizes vLLM's share for as much of a step's rollouts as fits (``catalog.memplan``). Below
# VLLM_KV_WARN of a step's rollouts in KV at once, plan warns with the decode waves that implies; below
# VLLM_KV_MIN (or one max_model_len request, whichever is more) "auto" does not fit.
VLLM_KV_WARN = 0.25
VLLM_KV_MIN = 0.10
VLLM_MAX_AUTO_SHARE = 0.9
FUSED_HEAD_TOKENS = 4096  # TRL's chunked log-prob kernel: tokens per tile
FUSED_HEAD_VOCAB = 32768  # and vocabulary entries per tile
_ATTN_TARGETS = {"q_proj": 2, "k_proj": 1.25, "v_proj": 1.25, "o_proj": 2}  # multiples of rank*hidden
_MLP_TARGETS = {"gate_proj": 4, "up_proj": 4, "down_proj": 4}  # intermediate ~= 3 * hidden


@dataclass(frozen=True)
class VramEstimate:
    """Peak GPU memory of one training process, in GiB, with the parts that make it up.

    ``vllm_gb`` is the least the colocated vLLM engine needs to start, by vLLM 0.31's own rule: its
    weights, non-torch memory, profiling peak and CUDA-graph estimate (``vllm_fixed_bytes``), and the KV
    cache of one request at ``max_model_len`` (it refuses to start with less: vllm/v1/core/kv_cache_utils.py). ``vllm_kv_full_gb`` is the KV cache that holds every rollout of a step at full
    length at once: a speed hint (with less, vLLM generates in waves), never a reason not to fit. On a
    GPU, vLLM takes ``vllm_fraction`` of the card, so whether it fits depends on the card: see
    ``fit_report``.
    """

    model: str
    quant: str
    weights_gb: float
    lora_gb: float  # LoRA weights, gradients and AdamW state (fp32)
    activations_gb: float  # checkpointed hidden states, one layer's recompute, logits and their gradient
    overhead_gb: float  # CUDA context, allocator fragmentation
    vllm_gb: float = 0.0
    vllm_kv_gb: float = 0.0  # the KV cache of one request at max_model_len (part of vllm_gb)
    vllm_kv_full_gb: float = 0.0
    load_gb: float = 0.0  # while the model loads, before training starts (FSDP: one shard, see vram_breakdown)
    generate_kv_gb: float = 0.0  # GRPO without vLLM: transformers generate()'s KV cache for the generation batch
    vllm_fraction: float | None = 0.0  # None: "auto", sized per card by ``vllm_share``
    vllm_sleep: bool = False
    estimated_model: bool = False

    @property
    def train_gb(self) -> float:
        """The training peak, or the load peak or (GRPO with transformers generation) generate()'s peak where
        that is higher."""
        return max(
            self.weights_gb + self.lora_gb + self.activations_gb + self.overhead_gb,
            self.load_gb,
            self.static_gb + self.generate_kv_gb,
        )

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
            "vllm_kv_gb": round(self.vllm_kv_gb, 2),
            "vllm_kv_full_gb": round(self.vllm_kv_full_gb, 2),
            "load_gb": round(self.load_gb, 2),
            "generate_kv_gb": round(self.generate_kv_gb, 2),
            "total_gb": round(self.total_gb, 2),
            "estimated_model": self.estimated_model,
        }


def resolve_model(model: str | ModelInfo) -> ModelInfo | None:
    return model if isinstance(model, ModelInfo) else guess_model_info(model)


def quant_tier(model: str | ModelInfo, train: Any = None) -> str:
    """ "none" or "4bit": the train spec's ``quantization`` if set, else the catalog's tier for "auto"."""
    info = resolve_model(model)
    wanted = getattr(train, "quantization", "auto") if train is not None else "auto"
    if wanted in ("none", "4bit"):
        return wanted
    return info.quant if info else "none"


def lora_params(info: ModelInfo, train: Any) -> float:
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
    """Whether the worker patches this model with Liger kernels on a GPU (``train.liger_kernel``; SFT
    only, as ``engine.train.recipe.use_liger`` decides)."""
    wanted = getattr(train, "liger_kernel", "auto") if train is not None else "auto"
    method = getattr(train, "method", "sft") if train is not None else "sft"
    return wanted is not False and method == "sft" and info.model_type in LIGER_MODEL_TYPES


def vram_breakdown(
    model: str | ModelInfo,
    train: Any = None,
    *,
    micro: int | None = None,
    checkpointing: bool | None = None,
    liger: bool | None = None,
    processes: int = 1,
    strategy: str = "ddp",
    vllm: bool | None = None,
    generation_batch: int | None = None,
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
    tier, which vLLM cannot load), sized by its start-up rule (``vllm_fixed_bytes``; the KV cache is
    2 x layers x kv_heads x head_dim bf16 values per token). ``micro``, ``checkpointing`` and ``liger`` override what the spec implies.
    ``vllm``: whether the pod generates with vLLM (None: wherever the spec and model allow, as if the pod
    had it; False: transformers' generate(), whose KV cache for ``generation_batch`` completions per
    process at full length -- default: the process's whole step -- is counted).
    """
    if train is None:
        from autoslm.recipes.sft import SFTTrain

        train = SFTTrain()
    info = resolve_model(model)
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
    lora = lora_params(info, train) * 16
    micro, seq, logit_tokens = _micro_batch(train, micro, procs)
    # Loading: DDP puts the whole model on every GPU. FSDP loads as transformers does under accelerate's
    # cpu_ram_efficient_loading (engine/models.py): rank 0 reads the weights into CPU memory, the other
    # ranks build empty ones, and each GPU then receives only its shard.
    load = weights + 1 * GiB
    if strategy == "fsdp" and procs > 1:
        weights = weights / procs + weights / max(1, info.layers)  # own shard + one gathered layer
        lora = lora / procs
        load = weights + 1 * GiB
    activations = _activations(info, micro, seq, logit_tokens, liger=liger, checkpointing=checkpointing)
    subtotal = weights + lora + activations
    overhead = 1 * GiB + 0.1 * subtotal

    rollouts = math.ceil(train.prompts_per_step * train.group_size / procs) if method == "grpo" else 0
    gen = _generation_memory(info, train, rollouts, seq, vllm, generation_batch) if method == "grpo" else _Generation()
    return VramEstimate(
        model=info.id,
        quant=quant,
        weights_gb=weights / GiB,
        lora_gb=lora / GiB,
        activations_gb=activations / GiB,
        overhead_gb=overhead / GiB,
        vllm_gb=gen.vllm_bytes / GiB,
        vllm_kv_gb=gen.kv_one / GiB,
        vllm_kv_full_gb=gen.kv_full / GiB,
        load_gb=load / GiB,
        generate_kv_gb=gen.gen_kv / GiB,
        vllm_fraction=gen.fraction,
        vllm_sleep=gen.sleep,
        estimated_model=info.estimated,
    )


def _activations(info: ModelInfo, micro: int, seq: int, logit_tokens: int, *, liger: bool, checkpointing: bool) -> float:
    """Bytes of one micro-batch's activations in training: the layers' working sets and the logits."""
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
    return activations + min(kept, FUSED_HEAD_TOKENS) * min(info.vocab, FUSED_HEAD_VOCAB) * 8 + kept * 4 * 3


@dataclass(frozen=True)
class _Generation:
    """What generating a GRPO step holds beside training (bytes): vLLM's share and its KV room, or
    transformers' generate() KV cache. All zero for SFT."""

    vllm_bytes: float = 0.0
    kv_one: float = 0.0
    kv_full: float = 0.0
    gen_kv: float = 0.0
    fraction: float | None = 0.0
    sleep: bool = False


def _generation_memory(
    info: ModelInfo, train: Any, rollouts: int, seq: int, vllm: bool | None, generation_batch: int | None
) -> _Generation:
    if vllm is None:
        vllm = servable_by_vllm(info, train)
    kv_per_token = kv_bytes_per_token(info)
    if not vllm:
        # transformers' generate() over a generation batch at once: its KV cache holds every rollout of it
        # at full length (bf16, also under 4-bit weights) beside the weights and LoRA state.
        return _Generation(gen_kv=min(generation_batch or rollouts, rollouts) * seq * kv_per_token)
    vcfg = getattr(train, "vllm", None)
    ctx = max((vcfg.max_model_len if vcfg and vcfg.max_model_len else None) or seq, seq)
    kv_one = ctx * kv_per_token
    wanted = vcfg.gpu_memory_utilization if vcfg else "auto"
    return _Generation(
        vllm_bytes=vllm_fixed_bytes(info, rollouts) + kv_one,
        kv_one=kv_one,
        kv_full=rollouts * seq * kv_per_token,  # every rollout at its longest (prompt + completion) at once
        fraction=None if wanted == "auto" else wanted,
        sleep=(vcfg.sleep_mode is True) if vcfg else False,
    )


def servable_by_vllm(info: ModelInfo, train: Any) -> bool:
    """Whether GRPO may generate with colocated vLLM for this model and ``[train]`` on a pod that has it:
    not for the 4-bit tier (vLLM cannot load bitsandbytes weights), a model vLLM cannot serve, or
    ``train.vllm.enabled = false``."""
    enabled = getattr(getattr(train, "vllm", None), "enabled", "auto")
    return enabled is not False and info.vllm_ok and quant_tier(info, train) != "4bit"


# The profiling sampler pass, as vLLM 0.31 runs it for TRL's colocated engine. TRL 1.16 starts it with
# logprobs_mode="processed_logprobs" (trl/generation/vllm_generation.py, VLLMGeneration's LLM(...)), so
# on CUDA TopKTopPSampler.__init__ (vllm/v1/sample/ops/topk_topp_sampler.py) binds forward_native
# (FlashInfer's sampler cannot return processed log-probs). GPUModelRunner._dummy_sampler_run
# (vllm/v1/worker/gpu_model_runner.py) computes logits for num_reqs = min(max_num_seqs, 4096) rows and
# samples them once with top-k and top-p set. At the sampler's peak these are alive at once, per row and
# vocabulary entry:
#   2 B  the bf16 logits from compute_logits (held by _dummy_sampler_run until it returns);
#   4 B  ``logits.to(torch.float32)`` in Sampler.forward (vllm/v1/sample/sampler.py); temperature
#        (apply_temperature, ``div_``) and top-k/top-p (apply_top_k_top_p_triton) work in place;
#   4 B  forward_native's ``logits.log_softmax(dim=-1, dtype=torch.float32)``, kept as the processed log-probs;
#   4 B  its ``logits.softmax(dim=-1, dtype=torch.float32)`` (probs);
#   4 B  random_sample's exponential noise ``q`` (empty_exponential_noise_like, fp32); probs.div_(q) is in place.
# = 18 B. The Triton top-k/top-p kernel adds one cached fp32 buffer of min(rows, SMs) x vocab
# (apply_top_k_top_p_triton's ``_TRITON_BUFFER_CACHE``), counted at VLLM_TOPK_BUFFER_ROWS rows.
VLLM_SAMPLER_BYTES = 2 + 4 + 4 + 4 + 4
VLLM_TOPK_BUFFER_ROWS = 128  # about the SM count of the cards in the catalog (L4 58 ... L40S 142)


def vllm_sampler_bytes(max_num_seqs: int, vocab: int) -> float:
    """The profiling sampler pass's peak in bytes (see the derivation above)."""
    rows = min(max(1, max_num_seqs), VLLM_PROFILE_TOKENS)
    return VLLM_SAMPLER_BYTES * rows * vocab + 4 * min(rows, VLLM_TOPK_BUFFER_ROWS) * vocab


def vllm_fixed_bytes(info: ModelInfo, max_num_seqs: int) -> float:
    """What vLLM 0.31 subtracts from its share before the KV cache: bf16 weights, non-torch memory, the
    profiling peak and the CUDA-graph estimate. The profiling forward of ``VLLM_PROFILE_TOKENS`` tokens
    peaks at one layer's MLP working set (gate and up projections and their product: ~3 x 3 x hidden
    bf16 values a token) plus the residual stream, and the sampler pass at ``vllm_sampler_bytes``
    (TRL: max_num_seqs = the completions one process generates per step)."""
    weights = info.params_b * 1e9 * 2
    forward = VLLM_PROFILE_TOKENS * info.hidden * (9 + 2) * 2
    sampler = vllm_sampler_bytes(max_num_seqs, info.vocab)
    return weights + (VLLM_NON_TORCH_GB + VLLM_CUDA_GRAPH_GB) * GiB + forward + sampler


def kv_bytes_per_token(info: ModelInfo) -> float:
    """vLLM's KV cache per token: K and V, every layer, kv_heads x head_dim values each, bf16."""
    return 2 * info.layers * info.kv_width * 2


def estimate_vram_gb(model: str | ModelInfo, train: Any = None, *, processes: int = 1, strategy: str = "ddp") -> float | None:
    """Total GiB one training process needs (training peak + what colocated vLLM needs); None if unknown."""
    est = vram_breakdown(model, train, processes=processes, strategy=strategy)
    return None if est is None else est.total_gb


# Host memory of one training process beside what it loads: torch, the CUDA context's host side, the
# tokenizer and the dataset.
PROCESS_HOST_GIB = 3.0
# transformers reads a checkpoint one shard file at a time (the Hub's shards are at most ~5 GB).
LOAD_SHARD_GIB = 5.0


def host_ram_gb(model: str | ModelInfo, train: Any = None, *, processes: int = 1, strategy: str = "ddp") -> float | None:
    """Host RAM (GiB) a pod needs while its training processes load the model: the peak, since training
    then lives on the GPUs. One process, or DDP: each process streams the checkpoint onto its own GPU, a
    shard at a time. FSDP: rank 0 reads the whole model into CPU memory (``cpu_ram_efficient_loading``,
    engine/models.py) and sends each rank its shard; the others build empty weights. None for an
    unknown model."""
    info = resolve_model(model)
    if info is None:
        return None
    procs = max(1, processes)
    weights = info.params_b * 1e9 * WEIGHT_BYTES[quant_tier(info, train)] / GiB
    if strategy == "fsdp" and procs > 1:
        return weights + procs * PROCESS_HOST_GIB
    return procs * (PROCESS_HOST_GIB + min(weights, LOAD_SHARD_GIB))
