"""``[train]`` fields that every method shares: LoRA, length, schedule, checkpoints."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TrainCommon(BaseModel):
    model_config = ConfigDict(extra="forbid")

    epochs: Annotated[float | None, Field(gt=0, description="passes over the train split; ignored when max_steps is set")] = None
    max_steps: Annotated[int | None, Field(ge=1, description="optimizer steps; overrides epochs")] = None
    learning_rate: Annotated[float, Field(gt=0, lt=1, description="peak learning rate")] = 2e-4
    lr_scheduler: Annotated[Literal["linear", "cosine", "constant"], Field(description="decay after warm-up")] = "linear"
    warmup_ratio: Annotated[float, Field(ge=0, lt=1, description="fraction of steps spent warming up")] = 0.0
    weight_decay: Annotated[float, Field(ge=0, description="AdamW weight decay")] = 0.0
    max_length: Annotated[
        int,
        Field(
            ge=16,
            le=262144,
            description="tokens per sequence (prompt + answer); longer ones are truncated (SFT) or dropped (GRPO)",
        ),
    ] = 512
    save_every: Annotated[int, Field(ge=1, description="checkpoint every N optimizer steps (and always at the end)")] = 20
    keep_checkpoints: Annotated[
        int, Field(ge=1, le=10, description="checkpoints kept in the store; >= 2 lets resume skip a corrupt newest one")
    ] = 2
    lora_rank: Annotated[int, Field(ge=1, le=1024, description="LoRA rank r")] = 16
    lora_alpha: Annotated[float, Field(gt=0, description="LoRA alpha (scale = alpha / rank)")] = 32
    lora_dropout: Annotated[float, Field(ge=0, lt=1, description="dropout on the LoRA input")] = 0.0
    lora_targets: Annotated[str | list[str], Field(description='"all-linear" or a list of module names')] = "all-linear"
    eval_samples: Annotated[int, Field(ge=0, description="held-out examples scored before and after training (0 = skip)")] = 64
    log_every: Annotated[int, Field(ge=1, description="heartbeat/event every N steps")] = 1
    quantization: Annotated[
        Literal["auto", "none", "4bit"],
        Field(
            description='base weights: "4bit" is QLoRA (NF4; generation then runs without vLLM); "auto" picks 4-bit when the catalog says the model needs it on a GPU'
        ),
    ] = "auto"
    # The GPU recipe (autoslm/engine/train/recipe.py). "auto" = on where the device supports it, off on a CPU.
    bf16: Annotated[bool | Literal["auto"], Field(description="train in bfloat16 (GPUs of compute capability 8.0+)")] = "auto"
    gradient_checkpointing: Annotated[
        bool | Literal["auto"],
        Field(
            description="recompute activations in the backward pass (non-reentrant): far less memory for ~30% more compute; auto = on a GPU where the micro-batch would not fit without it"
        ),
    ] = "auto"
    liger_kernel: Annotated[
        bool | Literal["auto"],
        Field(
            description="Liger's fused Triton kernels (RMSNorm, RoPE, SwiGLU, fused cross-entropy) for the architectures it supports; auto = on a GPU with liger-kernel installed"
        ),
    ] = "auto"
    attn_implementation: Annotated[
        str,
        Field(
            description='"auto" (flash-attention where the GPU has it: a flash_attn wheel or the Hub kernel, else "sdpa"), or a transformers attn_implementation such as "sdpa" or "eager"'
        ),
    ] = "auto"
    report_to: Annotated[
        list[Literal["wandb", "trackio", "tensorboard", "mlflow"]],
        Field(
            description="experiment trackers TRL logs to; their keys (WANDB_API_KEY, MLFLOW_TRACKING_TOKEN...) go to the pod by name from your environment"
        ),
    ] = []

    @model_validator(mode="after")
    def _default_length(self):
        if self.epochs is None and self.max_steps is None:
            self.epochs = 1.0
        return self
