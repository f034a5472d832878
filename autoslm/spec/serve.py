"""A serve's JobSpec (``kind = "serve"``, written by `autoslm serve`, not by hand): which trained adapter
vLLM's OpenAI server serves, on which port, for how long (its TTL) and within how much money.

A serve is a run: it is planned, rented, supervised, limited, cancelled and collected as a training run
is (the controller reads its ``name``, ``seeds``, ``compute``, ``artifacts`` and ``limits`` as a training
JobSpec's), and its pod runs engine/pod/serving.py instead of training. It has no training sections:
what it serves is ``adapter``; its time is its TTL (``limits.ttl_s``, seconds from launch: the run's
deadline), never hours.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from autoslm.spec.models import (
    MAX_RUN_HOURS,
    ArtifactsSpec,
    ComputeSpec,
    HeartbeatTimeout,
    MaxRestarts,
    MaxUsd,
    StartupTimeout,
    _Section,
    check_model,
    check_name,
)

DEFAULT_PORT = 8000


class ServedAdapter(_Section):
    """The adapter a serve serves: a trained run's final adapter or one of its kept checkpoints."""

    source_run: Annotated[str, Field(description="the run whose adapter is served")]
    store: Annotated[str, Field(description="the store holding the adapter (a store URI)")]
    adapter_path: Annotated[str, Field(description="the adapter's folder in that store")]
    step: Annotated[int | None, Field(description="the kept checkpoint's step; None: the run's final adapter")] = None
    lora_name: Annotated[str, Field(description="the LoRA module's name: the `model` of an OpenAI request")]
    lora_rank: Annotated[int, Field(ge=1, description="the adapter's rank (vLLM's --max-lora-rank is at least this)")]

    @field_validator("lora_rank")
    @classmethod
    def _vllm_loads_it(cls, v: int) -> int:
        from autoslm.recipes.generation import vllm_lora_rank

        vllm_lora_rank(v)  # a rank vLLM cannot load fails here, in one line, before a pod is rented
        return v


class ServeLimits(_Section):
    """A serve's limits: its TTL (`--ttl`) and money (`--max-usd`), and the run's guards as a training run has them."""

    ttl_s: Annotated[
        float,
        Field(gt=0, le=MAX_RUN_HOURS * 3600, description="how long it serves, in seconds from launch: the run's deadline"),
    ]
    max_usd: MaxUsd = None
    max_restarts: MaxRestarts = 3
    heartbeat_timeout_s: HeartbeatTimeout = 900.0
    startup_timeout_s: StartupTimeout = 2700.0

    @property
    def time_limit_s(self) -> float:
        """The run's time from launch to its deadline: the TTL (``LimitsSpec.time_limit_s``, a training run's)."""
        return self.ttl_s


class ServeSpec(_Section):
    """A serve: a run that is vLLM's OpenAI server for a trained adapter, until its TTL or its money ends it."""

    kind: Annotated[Literal["serve"], Field(description="a serve (written by `autoslm serve`)")] = "serve"
    name: Annotated[str, Field(description="short name: lower-case letters, digits, dashes")]
    model: Annotated[str, Field(description="the base model the adapter was trained on (the source run's)")]
    trust_remote_code: Annotated[bool, Field(description="run code shipped with the model (the source run's setting)")] = False
    seed: Annotated[int, Field(ge=0, description="the replica's seed (its records' folder, seed<N>/)")] = 0
    phase: Annotated[
        Literal["sft", "grpo"],
        Field(description="the source run's method: the serve's records lie under <phase>/<run id>/ in its store, as that run's"),
    ]
    adapter: Annotated[ServedAdapter, Field(description="what is served")]
    port: Annotated[int, Field(ge=1, le=65535, description="the port the server listens on in its pod")] = DEFAULT_PORT
    max_model_len: Annotated[int | None, Field(ge=16, description="vLLM's --max-model-len; None: the model's own")] = None
    compute: ComputeSpec
    artifacts: ArtifactsSpec = ArtifactsSpec()
    limits: ServeLimits

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v)

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        return check_model(v)

    @model_validator(mode="after")
    def _one_gpu(self):
        if self.compute.gpu_count != 1:
            raise ValueError(f"a serve runs one server on one GPU: compute.gpu_count must be 1, got {self.compute.gpu_count}")
        if self.compute.nodes != 1:
            raise ValueError(f"a serve runs one server on one pod: compute.nodes must be 1, got {self.compute.nodes}")
        return self

    @property
    def seeds(self) -> list[int]:
        return [self.seed]

    def to_json(self) -> str:
        return self.model_dump_json(exclude={"compute": {"nodes"}})  # always one pod
