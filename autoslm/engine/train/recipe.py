"""The GPU recipe: how a run uses the device it lands on. Pure decisions, no torch at import.

Given the JobSpec and a ``Device`` (the machine the worker runs on, or the one ``--print-config``
assumes), this module decides precision, activation checkpointing, the attention kernel, Liger kernels,
padding-free SFT and the micro-batch size. The worker and ``python -m autoslm.engine --print-config``
call the same functions, so what the printout says is what the pod runs. On a CPU it also fixes the
built-in model's thread count (``cpu_threads``: speed under load, and runs that repeat).

Every choice is a ``[train]`` field whose default is "auto" (documented in ``autoslm/recipes/``); a
user can turn each one off. On a CPU everything fast-path is off: the tiny model trains in fp32 with
eager/SDPA attention and no checkpointing (recomputing a 2-layer model costs more than it saves).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autoslm.catalog import LIGER_MODEL_TYPES, MAX_TOKENS_PER_MICRO_BATCH, FitReport, GPUInfo, ModelInfo, gpu_info  # noqa: F401

# Packages the pod image installs (worker_image/requirements-gpu.txt): what --print-config assumes.
IMAGE_PACKAGES = frozenset({"vllm", "liger_kernel", "bitsandbytes", "kernels"})
# Hub kernels for attention (transformers loads them through the ``kernels`` package on the pod).
FLASH_ATTN_HUB = "kernels-community/flash-attn2"  # Ampere (8.0) and newer
FLASH_ATTN3_HUB = "kernels-community/vllm-flash-attn3"  # Hopper (9.0) only
# Models up to this size (billions of parameters) train on one CPU thread: see ``cpu_threads``.
TINY_PARAMS_B = 0.01
TINY_CPU_THREADS = 1
FLASH_IMPLEMENTATIONS = ("flash_attention_2", "flash_attention_3", FLASH_ATTN_HUB, FLASH_ATTN3_HUB)


@dataclass(frozen=True)
class Device:
    """Where training runs. ``capability`` is the CUDA compute capability ((8, 9) for an RTX 4090)."""

    kind: str  # "cuda" | "cpu"
    name: str = "cpu"
    mem_gib: float | None = None
    capability: tuple[int, int] | None = None
    packages: frozenset[str] = field(default_factory=frozenset)
    world_size: int = 1

    @property
    def cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def bf16(self) -> bool:
        return self.cuda and (self.capability or (0, 0)) >= (8, 0)

    def has(self, package: str) -> bool:
        return package in self.packages

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "mem_gib": self.mem_gib,
            "capability": ".".join(map(str, self.capability)) if self.capability else None,
            "packages": sorted(self.packages),
            "world_size": self.world_size,
        }

    @classmethod
    def detect(cls) -> "Device":
        """The machine this process runs on (imports torch)."""
        import torch

        from autoslm.engine.train.gpu import installed

        packages = {p for p in ("vllm", "liger_kernel", "bitsandbytes", "kernels", "flash_attn") if installed(p)}
        if "kernels" in packages and not kernels_usable():
            packages.discard("kernels")  # a version transformers ignores: no Hub attention kernel
        packages = frozenset(packages)
        if not torch.cuda.is_available():
            return cls("cpu", packages=packages)
        p = torch.cuda.get_device_properties(0)
        return cls("cuda", p.name, round(p.total_memory / 2**30, 1), (p.major, p.minor), packages)

    @classmethod
    def assumed(cls, kind: str = "cuda", gpu: str | None = None) -> "Device":
        """The device a pod would have: a catalog GPU with the image's packages (no torch, no probe)."""
        if kind == "cpu":
            return cls("cpu")
        g: GPUInfo | None = gpu_info(gpu) if gpu else None
        if gpu and g is None:
            raise ValueError(f"unknown GPU {gpu!r}: pick one of the catalog's names (autoslm plan lists them)")
        if g is None:
            return cls("cuda", "unspecified 24 GB GPU", 24.0, (8, 9), IMAGE_PACKAGES)
        return cls("cuda", g.name, g.mem_gib, g.capability, IMAGE_PACKAGES)


def kernels_usable() -> bool:
    """Whether transformers will load Hub kernels: it accepts only a narrow ``kernels`` version range
    (5.17: >=0.16,<0.17) and silently ignores any other."""
    from transformers.utils import is_kernels_available

    return bool(is_kernels_available())


def _auto(value, default: bool) -> bool:
    return default if value == "auto" else bool(value)


def use_bf16(train, device: Device) -> bool:
    return _auto(getattr(train, "bf16", "auto"), device.bf16) and device.bf16


def cpu_threads(info: ModelInfo | None, device: Device) -> int | None:
    """Intra-op threads for a model too small to gain from several (the built-in one): exactly
    ``TINY_CPU_THREADS``; None leaves torch's default (a thread per core) for everything else.

    Why one: its matrices are a few thousand numbers, so threads only add barriers. On a loaded 2-core
    machine a forward+backward+sampling step of the built-in model took 0.9-1.2 s on one thread and
    7.8-9.5 s on two (an OpenMP team waits whenever one of its threads is descheduled). And a fixed
    count makes a seeded run the same step for step on any machine of the same CPU instruction set:
    a reduction split across a machine-dependent number of threads adds in a different order."""
    if device.cuda or info is None or info.params_b > TINY_PARAMS_B:
        return None
    return TINY_CPU_THREADS


def memory_fit(
    train, info: ModelInfo | None, device: Device, *, strategy: str = "ddp", allow_sleep: bool = True
) -> FitReport | None:
    """The planner's one answer for this run on this device (``catalog.fit_report``): micro-batch,
    checkpointing, generation batch, vLLM's share and sleep mode, with vLLM counted only where this
    device's packages have it. None on a CPU, for an unknown model, or without the GPU's memory."""
    if not device.cuda or info is None or not device.mem_gib:
        return None
    from autoslm.catalog import fit_report

    return fit_report(
        info,
        device.mem_gib,
        train,
        processes=max(1, device.world_size),
        strategy=strategy,
        allow_sleep=allow_sleep,
        has_vllm=device.has("vllm"),
        liger=use_liger(train, info, device),
    )


def use_checkpointing(
    train, device: Device, info: ModelInfo | None = None, *, strategy: str = "ddp", allow_sleep: bool = True
) -> bool:
    """Activation checkpointing (recompute in the backward pass: non-reentrant, LoRA-safe). "auto": on a GPU
    only where memory needs it -- where the micro-batch the step runs at would not fit as well without it
    (``catalog.fit_report``; GRPO: beside vLLM's share with no more decode waves, or the same generation
    batch). Recompute costs about a third more compute, so a step that fits without it runs 25-33% faster.
    Without ``info`` (or the GPU's memory) it stays on."""
    wanted = getattr(train, "gradient_checkpointing", "auto")
    if wanted != "auto":
        return bool(wanted)
    if not device.cuda:
        return False
    fit = memory_fit(train, info, device, strategy=strategy, allow_sleep=allow_sleep)
    return True if fit is None or fit.checkpointing is None else fit.checkpointing


def attn_implementation(train, info: ModelInfo | None, device: Device) -> str:
    """A flash-attention kernel where the GPU and image have one (needed by padding-free SFT), else SDPA."""
    wanted = getattr(train, "attn_implementation", "auto")
    if wanted != "auto":
        return wanted
    if not device.cuda or (device.capability or (0, 0)) < (8, 0):
        return "sdpa"
    if device.has("flash_attn"):
        return "flash_attention_2"
    if device.has("kernels"):
        # FA3 is Hopper-only; vision towers of VL checkpoints are not verified with it: use FA2 there.
        if device.capability == (9, 0) and not (info and info.vision):
            return FLASH_ATTN3_HUB
        return FLASH_ATTN_HUB
    return "sdpa"


def use_liger(train, info: ModelInfo | None, device: Device, model_type: str | None = None) -> bool:
    """Liger's Triton kernels (RMSNorm, RoPE, SwiGLU, fused linear cross-entropy) on a CUDA GPU for
    the architectures Liger patches, for SFT. Not for GRPO: TRL 1.16 scores GRPO's tokens through its
    own fused LM head, keeps only Liger's layer kernels there, and deprecates ``use_liger_kernel`` for
    GRPO (removed in TRL 2). ``model_type`` (from the loaded config) beats the catalog's guess."""
    wanted = getattr(train, "liger_kernel", "auto")
    if wanted is False or getattr(train, "method", "sft") != "sft" or not device.cuda or not device.has("liger_kernel"):
        return False
    mtype = model_type or (info.model_type if info else None)
    return mtype in LIGER_MODEL_TYPES if mtype else wanted is True


def use_padding_free(train, attn: str) -> bool:
    """SFT without pad tokens: sequences are concatenated with position ids, which only flash-attention
    kernels honour. "auto" turns it on when the attention kernel is one of them."""
    if getattr(train, "method", "sft") != "sft":
        return False
    wanted = getattr(train, "padding_free", "auto")
    flash = attn in FLASH_IMPLEMENTATIONS
    return flash if wanted == "auto" else bool(wanted) and flash


def sft_micro_batch(train, info: ModelInfo | None, device: Device, *, strategy: str = "ddp") -> int:
    """Sequences per forward pass per process: the spec's, else the largest divisor of the per-process
    batch whose training peak fits the GPU's memory (``catalog.fit_report``); the whole batch on a CPU."""
    per_process = max(1, train.batch_size // max(1, device.world_size))
    if train.micro_batch_size:
        return train.micro_batch_size
    fit = memory_fit(train, info, device, strategy=strategy)
    return fit.micro if fit is not None and fit.micro else per_process


def checkpointing_kwargs(train, device: Device, *, fsdp: bool = False, on: bool | None = None) -> dict[str, Any]:
    """TrainingArguments keywords for activation checkpointing, under the name this transformers has:
    5.17 (the pod image) knows ``gradient_checkpointing``; 5.2x renamed it ``activation_checkpointing``
    and keeps the old name as a deprecated alias. Under FSDP it is off here: FSDP checkpoints itself
    (``fsdp_config.activation_checkpointing``, see ``engine.distributed.trainer_kwargs``)."""
    on = (use_checkpointing(train, device) if on is None else on) and not fsdp
    names = _training_arg_names()
    key = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    out: dict[str, Any] = {key: on}
    if on:
        # Non-reentrant: works with frozen base weights (LoRA) without forcing input gradients.
        out[f"{key}_kwargs"] = {"use_reentrant": False}
    return out


def _training_arg_names() -> set[str]:
    import dataclasses

    from transformers import TrainingArguments

    return {f.name for f in dataclasses.fields(TrainingArguments)}


def precision_kwargs(train, device: Device) -> dict[str, Any]:
    return {"use_cpu": not device.cuda, "bf16": use_bf16(train, device), "fp16": False}


def torch_dtype_name(train, device: Device) -> str:
    return "bfloat16" if use_bf16(train, device) else "float32"


def grpo_micro_batch(
    train, info: ModelInfo | None, device: Device, *, strategy: str = "ddp", allow_sleep: bool = True
) -> int | None:
    """Completions per forward pass per process for GRPO on a GPU, as ``catalog.fit_report`` chooses it
    beside vLLM's share (fewest decode waves, then the largest micro-batch; sleep mode only where nothing
    fits awake) or beside generate()'s KV cache. ``allow_sleep`` False: sleep mode is no way out
    (multi-turn and dynamic sampling, see ``recipes.generation.sleep_allowed``). None leaves the choice to
    ``recipes.batching`` (CPU, an unknown model, or a spec that sets it)."""
    if train.micro_batch_size:
        return None
    fit = memory_fit(train, info, device, strategy=strategy, allow_sleep=allow_sleep)
    return fit.micro if fit is not None else None
