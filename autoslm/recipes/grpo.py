"""The GRPO recipe: reinforcement learning of a LoRA policy from environment rewards."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from autoslm.recipes.common import TrainCommon


class VLLMConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: Annotated[
        bool | Literal["auto"],
        Field(
            description="generate rollouts with colocated vLLM: auto = on a CUDA GPU with vllm installed; true = wherever vllm imports, a CPU included (the run stops before training if it does not); false = always transformers generation"
        ),
    ] = "auto"
    gpu_memory_utilization: Annotated[
        float | Literal["auto"],
        Field(
            description="share of GPU memory vLLM takes (colocated with training); auto = what vLLM's start-up needs plus KV room for as much of a step's rollouts as fits beside training, all of them at most, less a headroom (autoslm/catalog/fit.py; plan warns below a quarter of a step with the decode waves, refuses below a tenth)"
        ),
    ] = "auto"

    @field_validator("gpu_memory_utilization")
    @classmethod
    def _share(cls, v):
        if v != "auto" and not 0 < v < 1:
            raise ValueError('must be "auto" or a fraction between 0 and 1 (exclusive)')
        return v

    max_model_len: Annotated[int | None, Field(ge=64, description="vLLM context length (default: train.max_length)")] = None
    sleep_mode: Annotated[
        bool | Literal["auto"],
        Field(
            description="free vLLM's weights and KV cache while training (costs seconds per step); auto = where training and vLLM's share do not both fit the GPU awake, or where freeing the share while training saves more than one decode wave a step"
        ),
    ] = "auto"
    cpu_kv_cache_gib: Annotated[
        int,
        Field(
            ge=1,
            le=1024,
            description="KV-cache memory vLLM reserves when it runs on a CPU host, GiB (its VLLM_CPU_KVCACHE_SPACE; 1 keeps a tiny model's run near 2 GB)",
        ),
    ] = 1


class GRPOTrain(TrainCommon):
    method: Literal["grpo"] = "grpo"
    learning_rate: Annotated[float, Field(gt=0, lt=1, description="peak learning rate")] = 5e-5
    prompts_per_step: Annotated[
        int,
        Field(
            ge=1,
            description="distinct prompts optimized per step, all processes together (a multiple of compute.gpu_count: each process samples whole groups)",
        ),
    ] = 8
    group_size: Annotated[int, Field(ge=2, description="completions sampled per prompt")] = 4
    micro_batch_size: Annotated[
        int | None, Field(ge=1, description="completions per forward pass per process (default: chosen to fit the step)")
    ] = None
    num_processes: Annotated[
        int | None,
        Field(ge=1, description="leave unset: the training processes are compute.gpu_count (if set, it must equal it)"),
    ] = None
    temperature: Annotated[float, Field(gt=0, le=5, description="sampling temperature")] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1, description="nucleus sampling")] = 1.0
    max_completion_tokens: Annotated[int, Field(ge=1, description="tokens generated per completion")] = 128
    stop: Annotated[list[str], Field(description="stop sequences")] = []
    beta: Annotated[float, Field(ge=0, description="KL coefficient against the reference policy")] = 0.0
    loss_type: Annotated[Literal["dr_grpo", "grpo", "dapo", "bnpo"], Field(description="GRPO loss normalisation")] = "dr_grpo"
    scale_rewards: Annotated[Literal["none", "group", "batch"], Field(description="divide advantages by the reward std")] = "none"
    mask_truncated_completions: Annotated[
        bool,
        Field(
            description="exclude completions cut at max_completion_tokens from the loss; multi-turn: an episode over its token budget is dropped and its group's advantages recomputed without it"
        ),
    ] = True
    max_turn_tokens: Annotated[
        int | None,
        Field(
            ge=1,
            description="multi-turn: tokens the model may generate per turn (default: what max_completion_tokens leaves after the environment's turns, shared equally)",
        ),
    ] = None
    turn_loss_weights: Annotated[
        list[Annotated[float, Field(ge=0)]] | None,
        Field(
            min_length=1,
            description="multi-turn: loss weight of the model's tokens per turn, e.g. [0.5, 1.0] (later turns repeat the last weight)",
        ),
    ] = None
    thinking_length_penalty: Annotated[
        float,
        Field(
            ge=0,
            description="with thinking = true: reward less this coefficient x the answer's thinking tokens (logged as its own reward, thinking_length_penalty)",
        ),
    ] = 0.0
    dynamic_sampling: Annotated[
        bool, Field(description="drop groups whose rewards are all equal and draw more prompts to fill the step")
    ] = False
    init_from_adapter: Annotated[
        str | None, Field(description="run id of an earlier SFT run whose adapter this run continues")
    ] = None
    vllm: Annotated[VLLMConfig, Field(description="colocated vLLM rollouts (by default used when CUDA and vllm are present)")] = (
        VLLMConfig()
    )


def turn_tokens(train: GRPOTrain, turns: int, env_turn_tokens: int = 0) -> int:
    """Tokens the model may generate per turn of a multi-turn episode: ``train.max_turn_tokens``, or an
    equal share of what ``max_completion_tokens`` leaves after the environment's turns (at least 4)."""
    if train.max_turn_tokens:
        return train.max_turn_tokens
    room = train.max_completion_tokens - max(0, turns - 1) * env_turn_tokens
    return max(4, room // max(1, turns))


def context_tokens(train: GRPOTrain) -> int:
    """The most tokens one sequence (prompt and completion) may hold: colocated vLLM's ``max_model_len``,
    which is ``train.vllm.max_model_len`` and never less than ``train.max_length``."""
    return max(train.vllm.max_model_len or 0, train.max_length)


def turn_weight(weights: list[float] | None, turn: int) -> float:
    """The loss weight of the model's ``turn`` (0-based): the last weight repeats; none: 1."""
    if not weights:
        return 1.0
    return float(weights[min(turn, len(weights) - 1)])
