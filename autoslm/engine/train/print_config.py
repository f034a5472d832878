"""``python -m autoslm.engine --print-config SPEC [--device cuda|cpu] [--gpu NAME]``: what the pod will run.

Prints one JSON object built by the same functions the worker calls, without loading weights or
touching the network:

- ``trainer``: the TRL config (SFTConfig / GRPOConfig) ``to_dict()``;
- ``model``: how the base model is loaded (auto class, dtype, attention kernel, device placement,
  quantization) and the LoRA config;
- ``generation``: colocated vLLM's settings, or transformers generation, with the reasons;
- ``memory``: the planner's estimate for this recipe (``catalog.fit_report``, the function `autoslm plan`
  and the worker use): the peak it runs at, the micro-batch, the generation batch, vLLM's share, the
  decode waves a step takes and the step time they imply, and whether it fits the GPU.

With ``--device cuda`` on a machine without one, the device is the catalog's GPU (``--gpu``, else the
spec's first ``compute.gpu``) with the worker image's packages, and the TRL config is built as the pod
builds it: transformers refuses bf16 where no GPU is present, so that one check is bypassed by setting
the GPU precision after construction.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any


def pod_device(spec, device_kind: str = "cuda", gpu: str | None = None, *, vllm: bool = True):
    """The ``engine.train.recipe.Device`` a pod would have: ``gpu`` (else the spec's first ``compute.gpu``) from
    the catalog with the image's packages (without vllm where ``vllm`` is False: a pod whose package set
    lacks it, as `autoslm plan` says per provider), one per training process."""
    from autoslm.engine.train.recipe import Device

    gpu = gpu or (spec.compute.gpus[0] if device_kind == "cuda" and spec.compute.gpus else None)
    device = Device.assumed(device_kind, gpu)
    if not vllm:
        device = dataclasses.replace(device, packages=device.packages - {"vllm"})
    return dataclasses.replace(device, world_size=spec.compute.ranks)


def build(spec, *, device_kind: str = "cuda", gpu: str | None = None, vllm: bool = True) -> dict[str, Any]:
    from autoslm.catalog import model_info
    from autoslm.engine.train.gpu import lora_config_kwargs
    from autoslm.engine.train.models import load_kwargs

    device = pod_device(spec, device_kind, gpu, vllm=vllm)
    info = model_info(spec.model)
    model = load_kwargs(spec, info, device)
    model["lora"] = lora_config_kwargs(spec, info)
    env = _local_environment(spec)
    multi_turn = bool(env is not None and env.multi_turn)
    config, generation, micro = _trainer_config(spec, device, info, model, _max_steps(spec, env), multi_turn)
    return {
        "spec": spec.name,
        "method": spec.train.method,
        "device": device.to_dict(),
        "trainer": _jsonable(config.to_dict()),
        "model": _jsonable(model),
        "generation": _jsonable(generation),
        "memory": _memory(spec, device, info, generation, micro, multi_turn),
    }


def _trainer_config(spec, device, info, model: dict, max_steps: int, multi_turn: bool) -> tuple[Any, dict[str, Any], int]:
    """(TRL's config as the pod builds it, how it generates, the micro-batch per process)."""
    out_dir = Path("/tmp/autoslm-print-config")
    if spec.train.method != "grpo":
        from trl import SFTConfig

        from autoslm.engine.train.sft import sft_config_kwargs

        kwargs = sft_config_kwargs(
            spec, device, model["attn_implementation"], seed=spec.seeds[0], output_dir=out_dir, max_steps=max_steps
        )
        generation = {"backend": "transformers", "notes": ["SFT generates only for the held-out evaluation"]}
        return _config(SFTConfig, kwargs), generation, kwargs["per_device_train_batch_size"]
    from trl import GRPOConfig

    from autoslm.engine.train.grpo import grpo_config_kwargs

    notes: list[str] = []
    kwargs, plan = grpo_config_kwargs(
        spec, device, seed=spec.seeds[0], output_dir=out_dir, max_steps=max_steps, multi_turn=multi_turn, notes=notes
    )
    generation = {
        "backend": "vllm-colocate" if kwargs.get("use_vllm") else "transformers",
        "notes": notes,
        "batching": plan.to_dict(),
        **{
            k: v
            for k, v in kwargs.items()
            if k.startswith("vllm_") or k in ("temperature", "top_p", "max_completion_length", "generation_kwargs")
        },
    }
    if kwargs.get("use_vllm") and info is not None and info.vision:
        generation["language_model_only"] = True
    return _config(GRPOConfig, kwargs), generation, plan.per_device_train_batch_size


def _memory(spec, device, info, generation: dict, micro: int, multi_turn: bool) -> dict[str, Any]:
    """The memory estimate at the pod's micro-batch, the fit on the card, and GRPO's step time."""
    from autoslm.catalog import host_ram_gb, step_seconds, vram_breakdown
    from autoslm.engine.train.recipe import memory_fit, use_checkpointing, use_liger

    if info is None:
        return {"model": spec.model, "note": "unknown model: no size to estimate from"}
    train, procs, strategy = spec.train, spec.compute.ranks, spec.compute.strategy
    grpo = train.method == "grpo"
    allow_sleep = True
    if grpo:
        from autoslm.recipes.generation import sleep_allowed

        allow_sleep = sleep_allowed(spec, multi_turn)
    fit = memory_fit(train, info, device, strategy=strategy, allow_sleep=allow_sleep)
    ckpt = fit.checkpointing if fit is not None else use_checkpointing(train, device, info, strategy=strategy)
    est = vram_breakdown(
        info,
        train,
        micro=micro,
        checkpointing=ckpt,
        liger=use_liger(train, info, device),
        processes=procs,
        strategy=strategy,
        vllm=(fit.engine == "vllm") if fit is not None and grpo else None,
        generation_batch=generation["batching"]["generation_batch_size"] // max(1, procs) if grpo else None,
    )
    memory = est.as_dict()
    memory["host_ram_gb"] = round(
        host_ram_gb(info, train, processes=spec.compute.gpu_count, strategy=strategy) or 0, 1
    )  # a pod's, while loading
    if fit is not None:
        memory.update(gpu=device.name, gpu_gib=device.mem_gib, **fit.as_dict())
        if grpo:
            step = step_seconds(info, device.name, train, procs, waves=max(1, fit.waves), has_vllm=fit.engine == "vllm")
            memory["step_s"] = round(step, 1) if step is not None else None
    return memory


def _config(cls, kwargs: dict):
    """Build the TRL config as the pod does. Without CUDA here, transformers rejects ``bf16=True`` and
    ``use_cpu=False``: construct with CPU values, then set the GPU's."""
    import torch

    if kwargs.get("use_cpu") or torch.cuda.is_available():
        return cls(**kwargs)
    cfg = cls(**{**kwargs, "bf16": False, "use_cpu": True})
    for key in ("bf16", "use_cpu"):
        setattr(cfg, key, kwargs[key])
    return cfg


def _local_environment(spec):
    """The environment when it can be read offline (built-in tasks, local files), else None."""
    env_id = spec.environment.id
    if not (env_id.startswith("autoslm/") or env_id.startswith("jsonl:")):
        return None
    try:
        from autoslm.envs.task_table import load_environment

        return load_environment(spec)
    except Exception:  # noqa: BLE001 - a printout must not fail on data the pod will check anyway
        return None


def _max_steps(spec, env) -> int:
    from autoslm.engine.train.training_args import total_steps

    train = spec.train
    if train.max_steps:
        return train.max_steps
    if env is None:
        return -1  # epochs over data only the pod can read: TRL counts them
    per_step = train.prompts_per_step if train.method == "grpo" else train.batch_size
    return total_steps(train, len(env.train_examples()), per_step)


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in x]
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return str(x)


def main(argv: list[str]) -> int:
    import argparse

    from autoslm.errors import AutoslmError
    from autoslm.spec import load_spec

    p = argparse.ArgumentParser(
        prog="python -m autoslm.engine --print-config",
        description="Print the trainer, model, generation and memory settings a pod would use.",
    )
    p.add_argument("spec")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--gpu", default=None, help='a catalog GPU name, e.g. "H100 80GB" (default: the spec\'s first compute.gpu)')
    p.add_argument(
        "--no-vllm",
        action="store_true",
        help="a pod whose package set has no vllm (`autoslm plan` says which providers' pods have it)",
    )
    args = p.parse_args(argv)
    try:
        spec = load_spec(args.spec)
        out = build(spec, device_kind=args.device, gpu=args.gpu, vllm=not args.no_vllm)
    except AutoslmError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    json.dump(out, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")
    return 0
