"""The JobSpec and its sections as pydantic models: every field, its type, range, default and
description (``autoslm validate`` lists them), and the checks one field or one section can make alone.
Checks across sections are in checks.py; reading a file into a JobSpec is loading.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, ValidationInfo, field_validator, model_validator

from autoslm.recipes.evaluation import EvalSpec
from autoslm.recipes.grpo import GRPOTrain
from autoslm.recipes.sft import SFTTrain
from autoslm.vendors.table import VENDORS
from autoslm.vendors.vendor import Vendor

BUILTIN_MODEL_PREFIX = "autoslm/"
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_REPO_ID = _HUB_ID
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,47}$")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
# A pinned requirement, as boot accepts it (worker_image/boot_rules.py): name, optional extras, ==version; no URL, path or marker.
_PINNED = re.compile(r"^\s*[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9_,.-]+\])?==[A-Za-z0-9_.!+-]+\s*$")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JudgeSpec(_Section):
    base_url: Annotated[str, Field(description="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")]
    model: Annotated[str, Field(description="judge model name at that endpoint")]
    api_key_env: Annotated[str | None, Field(description="name of the environment variable holding the judge's key")] = None
    weight: Annotated[float, Field(description="weight of the judge's score in the reward")] = 1.0
    concurrency: Annotated[int, Field(ge=1, le=256, description="requests in flight")] = 8
    timeout_s: Annotated[float, Field(gt=0, description="per-request timeout")] = 30.0
    retries: Annotated[int, Field(ge=0, le=10, description="retries per request on 429/5xx/timeouts")] = 3
    prompt: Annotated[str | None, Field(description="judge instructions; {prompt}, {completion} and {answer} are filled in")] = (
        None
    )

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, v):
        if v is not None and not _ENV_NAME.match(v):
            raise ValueError(f"must name an environment variable (like JUDGE_API_KEY), got {v!r}")
        return v


class EnvironmentSpec(_Section):
    id: Annotated[
        str,
        Field(
            description='built-in task ("autoslm/arith"), "jsonl:path/to/file.jsonl", a Hub dataset "hf:owner/name", or a verifiers environment "owner/name"'
        ),
    ]
    params: Annotated[dict[str, Any], Field(description="task options, e.g. { n_train = 2000 }")] = {}
    judge: Annotated[JudgeSpec | None, Field(description="score completions with an LLM judge (GRPO)")] = None
    rewards: Annotated[
        list[str],
        Field(
            description='GRPO reward functions with TRL\'s signature: "rewards.py:my_reward" (a file beside the spec, shipped with the run), "trl:accuracy_reward" (TRL\'s own), "env" (the environment\'s own reward); empty: the environment\'s reward'
        ),
    ] = []
    reward_weights: Annotated[
        list[float] | None, Field(description="one weight per entry of rewards (TRL's reward_weights); default 1 each")
    ] = None
    reward_args: Annotated[
        dict[str, dict[str, Any]],
        Field(
            description='arguments of TRL\'s reward factories, e.g. { "trl:get_soft_overlong_punishment" = { soft_punish_cache = 64 } }'
        ),
    ] = {}
    on_reward_error: Annotated[
        Literal["fail", "none"],
        Field(
            description='a reward function that raises on the pod: "fail" ends the run (not retried, traceback in error_<phase>.txt); "none" scores those completions None (left out of the baseline) and counts them'
        ),
    ] = "fail"
    answer_format: Annotated[
        Literal["gsm8k", "boxed"] | None,
        Field(
            description='where a prompt + answer dataset\'s final answer sits: "gsm8k" (after ####, scored strictly) or "boxed" (the last \\boxed{}); for the reward, the held-out eval and the solution column rewards see'
        ),
    ] = None
    packages: Annotated[
        list[str], Field(description='pinned packages the pod installs at start, e.g. ["verifiers==0.1.9"] (name==version only)')
    ] = []
    index_url: Annotated[
        str | None,
        Field(
            pattern=r"^https://\S+$",
            description="an extra package index for those packages and a pinned verifiers environment (\"owner/name@version\"), e.g. its owner's simple index on Prime's Environments Hub",
        ),
    ] = None

    @field_validator("packages")
    @classmethod
    def _pinned(cls, v: list[str]) -> list[str]:
        for p in v:
            if not _PINNED.match(p):
                raise ValueError(
                    f"{p!r} is not a pinned requirement: write it as name==version (a range, a local path or a "
                    "URL cannot be installed the same way on every pod)"
                )
        return [p.strip() for p in v]


class ComputeSpec(_Section):
    provider: Annotated[
        str | list[str],
        Field(
            description="a registered provider (autoslm.providers.VENDORS: "
            + ", ".join(f'"{n}"' for n in VENDORS)
            + "), or a list in failover order"
        ),
    ] = "local"
    gpu: Annotated[
        str | list[str] | None, Field(description='GPU type, or a list in preference order, e.g. ["RTX 4090", "L40S"]')
    ] = None
    gpu_count: Annotated[
        int,
        Field(ge=1, le=8, description="GPUs per pod, one training process each (locally without CUDA: CPU processes over gloo)"),
    ] = 1
    nodes: Annotated[
        int,
        Field(
            ge=1,
            le=64,
            description="pods of one replica, joined by torch's elastic launcher on the vendor's private network "
            "(RunPod Instant Clusters, Hugging Face Jobs network groups, processes of this machine): "
            "nodes x gpu_count training processes in all",
        ),
    ] = 1
    strategy: Annotated[
        Literal["ddp", "fsdp"],
        Field(
            description='with gpu_count > 1: "ddp" (every GPU holds the whole model) or "fsdp" (weights sharded across the GPUs, for a model that does not fit one)'
        ),
    ] = "ddp"
    interruptible: Annotated[
        bool, Field(description="rent a cheaper interruptible (spot) instance where the provider has them (Vast)")
    ] = False
    max_price_per_hour: Annotated[float | None, Field(gt=0, description="ceiling in $/hour for one pod")] = None
    disk_gb: Annotated[int, Field(ge=10, le=2000, description="container disk")] = 40
    image: Annotated[
        str | None,
        Field(
            min_length=1,
            pattern=r"^\S+$",
            description='"auto" (the published autoslm worker image of this version if it exists, else bootstrap), "bootstrap" (a public base image plus autoslm installed at start), or an image reference',
        ),
    ] = "auto"
    options: Annotated[
        dict[str, Any],
        Field(
            description="each vendor's own settings, a table per vendor ("
            + ", ".join(f"[compute.options.{n}]" for n, v in VENDORS.items() if v.options)
            + "), checked by that vendor's model (autoslm/vendors/<vendor>/options.py)"
        ),
    ] = {}
    # The vendors this spec was validated against (the validation context's "vendors", else VENDORS), and the
    # options written at compute's top level, as before the options table ("runpod.cloud" -> "compute.cloud").
    _vendors: Mapping[str, Vendor] = PrivateAttr(default_factory=lambda: VENDORS)
    _top_level: dict[str, str] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _against_the_vendors(cls, data, handler, info: ValidationInfo):
        """Validated against the vendor table (``vendor_table``); an option written at compute's top level
        is read into its vendor's table first (``Vendor.top_level_options``)."""
        if not isinstance(data, dict):
            return handler(data)  # a ComputeSpec already (or what pydantic refuses as it is)
        vendors = vendor_table(info)
        data, moved = _top_level_options(data, vendors)
        self = handler(data)
        self._vendors, self._top_level = vendors, moved
        self._gpu_for_cloud()
        return self

    @field_validator("provider", mode="before")
    @classmethod
    def _registered(cls, v, info: ValidationInfo):
        """One line for a name no vendor registers (not pydantic's union of every shape it tried)."""
        from autoslm.vendors.table import unknown_provider

        vendors = vendor_table(info)
        names = v if isinstance(v, list) else [v]
        if not names:
            raise ValueError("an empty list names no provider: write one of " + ", ".join(f'"{n}"' for n in vendors))
        for name in names:
            if not isinstance(name, str) or name not in vendors:
                raise ValueError(unknown_provider(name, vendors))
        return v

    @field_validator("options")
    @classmethod
    def _vendor_options(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """Each table by its vendor's own model (``Vendor.options``), its errors said at their place in it."""
        from autoslm.vendors.table import unknown_provider

        vendors, out = vendor_table(info), {}
        for name, table in v.items():
            vendor = vendors.get(name)
            if vendor is None:
                raise ValueError(f"[compute.options.{name}]: " + unknown_provider(name, vendors))
            if vendor.options is None:
                raise ValueError(f"{vendor.title} has no options: remove [compute.options.{name}]")
            model = vendor.options_type()
            try:
                out[name] = table if isinstance(table, model) else model.model_validate(table, context=info.context)
            except ValidationError as e:
                errors = [{k: err[k] for k in ("type", "input", "ctx") if k in err} for err in e.errors()]
                for err, raw in zip(errors, e.errors()):
                    err["loc"] = (name, *raw["loc"])
                raise ValidationError.from_exception_data(cls.__name__, errors) from None
        return out

    @field_validator("gpu")
    @classmethod
    def _one_card_each(cls, v):
        from autoslm.catalog import gpu_choices

        for name in [v] if isinstance(v, str) else (v or []):
            choices = gpu_choices(name)
            if choices:
                raise ValueError(f"{name!r} names {len(choices)} cards: write one of " + ", ".join(f'"{c}"' for c in choices))
        return v

    @property
    def providers(self) -> list[str]:
        return [self.provider] if isinstance(self.provider, str) else list(self.provider)

    @property
    def ranks(self) -> int:
        """Training processes of one replica, all its pods together (the world size): nodes x gpu_count."""
        return self.nodes * self.gpu_count

    @property
    def ranks_written(self) -> str:
        """How the JobSpec sets the training processes, for messages: "compute.gpu_count = 2", or with several
        pods "compute.nodes x compute.gpu_count = 2 x 1"."""
        if self.nodes > 1:
            return f"compute.nodes x compute.gpu_count = {self.nodes} x {self.gpu_count}"
        return f"compute.gpu_count = {self.gpu_count}"

    @property
    def vendors(self) -> Mapping[str, Vendor]:
        """The vendor table this spec was validated against (``VENDORS``, unless a test handed its own)."""
        return self._vendors

    @property
    def is_local(self) -> bool:
        """This machine runs the run (a vendor that rents nothing: the local provider), not a rented pod."""
        return all(not self._vendors[n].rented for n in self.providers)

    def written_at(self, vendor: str, option: str) -> str:
        """Where the JobSpec wrote a vendor's option: "compute.options.<vendor>.<option>", or its top-level
        name where it was written so ("compute.cloud")."""
        return self._top_level.get(f"{vendor}.{option}", f"compute.options.{vendor}.{option}")

    @property
    def gpus(self) -> list[str]:
        if self.gpu is None:
            return []
        return [self.gpu] if isinstance(self.gpu, str) else list(self.gpu)

    def _gpu_for_cloud(self) -> None:
        here = [n for n in self.providers if not self._vendors[n].rented]
        if here and len(self.providers) > 1:
            raise ValueError(f'"{here[0]}" cannot be mixed with cloud providers in a failover list')
        if not self.is_local and not self.gpus:
            raise ValueError('a cloud provider needs a GPU type: set compute.gpu, e.g. gpu = "RTX 4090"')
        self._fixed_list_gpus()
        self._pods_joined()

    def _pods_joined(self) -> None:
        """Several pods of one replica need a vendor that joins them on one private network
        (``Capabilities.joins_pods``); one that cannot is refused with its reason, naming those that can."""
        if self.nodes == 1:
            return
        for name in self.providers:
            vendor = self._vendors[name]
            if not vendor.capabilities.joins_pods:
                why = vendor.capabilities.no_joining or "it cannot join pods into one run"
                can = [f'"{n}" ({v.capabilities.joined_by})' for n, v in self._vendors.items() if v.capabilities.joins_pods]
                raise ValueError(
                    f"compute.nodes = {self.nodes}, but {vendor.title} cannot join pods into one run: {why}; "
                    + (f"use {', '.join(can)}, or nodes = 1" if can else "set nodes = 1")
                )

    def _fixed_list_gpus(self) -> None:
        """Where every provider of the run has a fixed list of machines (no market of offers: Hugging Face
        Jobs' flavors), a GPU none of them lists is refused here, naming the ones they do."""
        vendors = [self._vendors[n] for n in self.providers]
        if not all(v.rented and v.capabilities.market != "offers" for v in vendors):
            return
        from autoslm.catalog import gpu_info

        listed = list(dict.fromkeys(card for v in vendors for card in (*v.gpu_ids, *v.other_gpus)))
        ids = {i.lower() for v in vendors for i in v.gpu_ids.values()}
        for name in self.gpus:
            info = gpu_info(name)
            if (info.name if info else name) not in listed and name.lower() not in ids:
                where = " or ".join(v.title for v in vendors)
                raise ValueError(f"gpu {name!r} is not a GPU {where} offers: write one of " + ", ".join(f'"{c}"' for c in listed))


def vendor_table(info: ValidationInfo | None) -> Mapping[str, Vendor]:
    """The vendors a JobSpec is validated against: the validation context's "vendors" (a table of one's
    own, ``validate_dict(..., vendors=)``), else every registered vendor (``VENDORS``)."""
    context = info.context if info is not None else None
    return (context or {}).get("vendors") or VENDORS


def _top_level_options(data: dict, vendors: Mapping[str, Vendor]) -> tuple[dict, dict[str, str]]:
    """``compute.<option>`` as JobSpecs wrote a vendor's option before its table (``Vendor.top_level_options``),
    read into ``options.<vendor>``: (the data, "<vendor>.<option>" -> where it was written)."""
    moved: dict[str, str] = {}
    for vendor in vendors.values():
        for key in vendor.top_level_options:
            options = data.get("options", {})
            if key not in data or not isinstance(options, dict) or not isinstance(options.get(vendor.name, {}), dict):
                continue  # nothing to read, or a table pydantic will refuse as it is
            table = options.get(vendor.name, {})
            if key in table:
                raise ValueError(f"compute.{key} is also set as compute.options.{vendor.name}.{key}: keep the second")
            data = {k: v for k, v in data.items() if k != key} | {"options": {**options, vendor.name: {**table, key: data[key]}}}
            moved[f"{vendor.name}.{key}"] = f"compute.{key}"
    return data, moved


class ArtifactsSpec(_Section):
    store: Annotated[Literal["local", "hf"], Field(description='"local" (a directory) or "hf" (a Hugging Face dataset repo)')] = (
        "local"
    )
    repo: Annotated[str | None, Field(description='dataset repo "owner/name" for store = "hf" (created if missing)')] = None
    path: Annotated[str | None, Field(description='directory for store = "local" (default: $AUTOSLM_HOME/artifacts)')] = None
    private: Annotated[bool, Field(description="create the repo private")] = True
    commits_per_hour: Annotated[
        int, Field(ge=1, le=120, description="commit budget per run (the Hub allows ~128/hour per repo, shared)")
    ] = 60

    @model_validator(mode="after")
    def _repo_for_hf(self):
        if self.store == "hf":
            if not self.repo:
                raise ValueError('store = "hf" needs repo = "owner/name"')
            if not _REPO_ID.match(self.repo):
                raise ValueError(f'repo must look like "owner/name", got {self.repo!r}')
        return self


# A run's limits beside its time (a training run's max_hours, a serve's TTL): both kinds' ``limits`` hold them.
MaxUsd = Annotated[float | None, Field(gt=0, description="money limit for the whole run across restarts")]
MaxRestarts = Annotated[int, Field(ge=0, le=100, description="relaunches after preemption or a retryable error")]
HeartbeatTimeout = Annotated[float, Field(ge=30, description="a running pod silent for this long is treated as lost")]
StartupTimeout = Annotated[
    float,
    Field(
        ge=30,
        description="a pod with no training heartbeat this long after it was started (image pull, model download) is treated as lost",
    ),
]
MAX_RUN_HOURS = 24 * 14


class LimitsSpec(_Section):
    max_hours: Annotated[
        float,
        Field(gt=0, le=MAX_RUN_HOURS, description="wall-clock limit for the whole run; pods are torn down when it passes"),
    ] = 1.0
    max_usd: MaxUsd = None
    max_restarts: MaxRestarts = 3
    heartbeat_timeout_s: HeartbeatTimeout = 900.0
    startup_timeout_s: StartupTimeout = 2700.0

    @property
    def time_limit_s(self) -> float:
        """The run's time from launch to its deadline (a serve's is its TTL: ``ServeLimits``)."""
        return self.max_hours * 3600


TrainSpec = Annotated[Union[SFTTrain, GRPOTrain], Field(discriminator="method")]


class ExportSpec(_Section):
    """An export on a rented GPU: the run merges a trained adapter into its base model and writes it as
    safetensors or GGUF into its store instead of training (written by `autoslm export --on`, not by hand).
    Its time and money limits are the run's ``[limits]``; `autoslm download` fetches what it wrote."""

    source_run: Annotated[str, Field(description="the run whose adapter is exported")]
    store: Annotated[str, Field(description="the store holding the adapter (a store URI)")]
    adapter_path: Annotated[str, Field(description="the adapter's folder in that store")]
    step: Annotated[int | None, Field(description="the kept checkpoint's step; None: the run's final adapter")] = None
    format: Annotated[Literal["merged", "gguf", "gguf-lora"], Field(description="what is written")]
    quant: Annotated[str, Field(description="the GGUF type (f16, bf16, f32, q8_0); empty for merged")] = ""
    dtype: Annotated[
        Literal["float32", "bfloat16", "float16"], Field(description="the dtype the source run trained in: the merge's")
    ] = "float32"


def check_name(v: str) -> str:
    """A run's name (either kind's): what its run id starts with."""
    if not _NAME.match(v):
        raise ValueError(f"must be 1-48 lower-case letters, digits or dashes, got {v!r}")
    return v


def check_model(v: str) -> str:
    """A base model (either kind's): a Hub id, a local path or a built-in model."""
    if not v.strip():
        raise ValueError("must name a model")
    if v.startswith(BUILTIN_MODEL_PREFIX):
        from autoslm.catalog import BUILTIN_MODELS

        if v not in BUILTIN_MODELS:
            raise ValueError(f"unknown built-in model {v!r}; built-in models: {', '.join(sorted(BUILTIN_MODELS))}")
    elif not (_HUB_ID.match(v) or v.startswith(("/", "./", "~"))):
        raise ValueError(f'must be a Hub id like "Qwen/Qwen3-0.6B", a local path, or a built-in model, got {v!r}')
    return v


class JobSpec(_Section):
    """A training run (``kind = "train"``, the default: a spec that names no kind trains). A serve is a
    JobSpec of its own kind (``spec/serve.py``: ``ServeSpec``); ``spec/kinds.py`` reads either."""

    kind: Annotated[Literal["train"], Field(description='what the run does: "train" (a serve is written by `autoslm serve`)')] = (
        "train"
    )
    name: Annotated[str, Field(description="short name: lower-case letters, digits, dashes")]
    model: Annotated[str, Field(description='Hub model id ("Qwen/Qwen3-0.6B") or a built-in offline model ("autoslm/tiny")')]
    thinking: Annotated[bool, Field(description="render prompts with thinking on (Qwen3 enable_thinking)")] = False
    seed: Annotated[int | list[int], Field(description="a seed, or a list: each seed is its own replica under seed<N>/")] = 0
    trust_remote_code: Annotated[
        bool, Field(description="run code shipped with the model (off: no write token sits beside foreign code)")
    ] = False
    environment: EnvironmentSpec
    train: TrainSpec = Field(default_factory=SFTTrain)
    eval: Annotated[EvalSpec, Field(description="held-out validation during training: when, pass@k, stop_at, keep_best")] = (
        EvalSpec()
    )
    compute: ComputeSpec = ComputeSpec()
    artifacts: ArtifactsSpec = ArtifactsSpec()
    limits: LimitsSpec = LimitsSpec()
    export: Annotated[
        ExportSpec | None, Field(description="set by `autoslm export --on`: this run exports an adapter instead of training")
    ] = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v)

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        return check_model(v)

    @field_validator("seed")
    @classmethod
    def _seeds(cls, v):
        seeds = [v] if isinstance(v, int) else v
        if not seeds:
            raise ValueError("needs at least one seed")
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds must be distinct, got {seeds}")
        if any(s < 0 for s in seeds):
            raise ValueError("seeds must be >= 0")
        return v

    @property
    def seeds(self) -> list[int]:
        return [self.seed] if isinstance(self.seed, int) else list(self.seed)

    @property
    def phase(self) -> str:
        return self.train.method

    def to_json(self) -> str:
        # A training run's JSON stays as it was before kinds and exports existed (no "kind", no "export": null).
        # One pod per replica (every run before several pods existed) records no "nodes" either.
        unset: dict = {"kind": True} | ({"export": True} if self.export is None else {})
        if self.compute.nodes == 1:
            unset["compute"] = {"nodes"}
        return self.model_dump_json(exclude_none=False, exclude=unset)

    @classmethod
    def from_json(cls, text: str) -> "JobSpec":
        return cls.model_validate_json(text)
