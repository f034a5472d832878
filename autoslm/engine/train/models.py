"""Load the base model, its tokenizer and the LoRA adapter a run trains.

``trust_remote_code`` follows the JobSpec (off by default): a write token sits in the environment,
so foreign code runs only when the user asked for it.
"""

from __future__ import annotations

import os
from pathlib import Path

from autoslm.errors import FatalWorkerError


def resolve_model_path(model_id: str, home: Path) -> str:
    """A local directory or Hub id that transformers can load; builds the offline model when asked."""
    if model_id == "autoslm/tiny":
        from autoslm.engine.train.tiny import ensure_tiny

        return str(ensure_tiny(home / "models"))
    if model_id.startswith(("/", "./", "~")):
        path = Path(model_id).expanduser()
        if not (path / "config.json").exists():
            raise FatalWorkerError(f"model: no config.json in {path}")
        return str(path)
    return model_id


def load_tokenizer(model_path: str, trust_remote_code: bool):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    except OSError as e:
        raise FatalWorkerError(f"model {model_path!r}: cannot load its tokenizer ({str(e).splitlines()[0]})") from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if not tok.chat_template:
        raise FatalWorkerError(f"model {model_path!r} has no chat template: use an instruct/chat model")
    return tok


def load_kwargs(spec, info, device, *, local_rank: int = 0) -> dict:
    """How the base model is loaded (``from_pretrained`` keywords, plus ``auto_class`` and
    ``fsdp_loading``): the dtype and attention kernel of the GPU recipe, straight onto this process's
    GPU (never via the CPU, so the "before" evaluation runs on the GPU too), the 4-bit tier's
    quantization config, and the auto class that can load the checkpoint (vision-language checkpoints
    are not causal-LM classes).

    Under FSDP there is no device map: rank 0 reads the weights into CPU memory, the other ranks build
    empty ones, and FSDP sends each GPU its shard (``fsdp_loading``: ``load_model`` sets what
    transformers reads for that). A device map would put the whole model on every GPU first."""
    from autoslm.engine.distributed import uses_fsdp
    from autoslm.engine.train.gpu import quantization_config_kwargs
    from autoslm.engine.train.recipe import attn_implementation, torch_dtype_name

    fsdp = device.cuda and uses_fsdp(spec, device.cuda)
    kwargs: dict = {
        "auto_class": "AutoModelForImageTextToText" if info is not None and info.vision else "AutoModelForCausalLM",
        "dtype": torch_dtype_name(spec.train, device),
        "attn_implementation": attn_implementation(spec.train, info, device),
        "device_map": {"": f"cuda:{local_rank}"} if device.cuda and not fsdp else None,
        "trust_remote_code": spec.trust_remote_code,
    }
    if fsdp:
        kwargs["fsdp_loading"] = True
    quant = quantization_config_kwargs(spec, info, device.cuda)
    if quant is not None:
        kwargs["quantization_config"] = quant
    return kwargs


def require_package(name: str, for_what: str) -> None:
    """A package the recipe needs is installed, or a non-retryable error that names it (another pod of
    the same image would lack it too)."""
    import importlib.util

    if importlib.util.find_spec(name) is None:
        raise FatalWorkerError(
            f"{for_what} needs {name}, which this pod's python does not have: install "
            f"autoslm[kernels] on the image (a bootstrap pod does) or use the worker image"
        )


def load_model(model_path: str, kwargs: dict, on_fallback=None):
    """Load with ``load_kwargs``'s result. An attention kernel that cannot be loaded on the pod (the Hub
    kernel, fetched by ``engine/pod/prefetch.py`` before the worker starts, failed a trust, version, build
    variant or GPU check; no flash_attn wheel) falls back to SDPA, which also turns padding-free SFT off:
    ``on_fallback(wanted, reason)`` is told (the worker makes it an event)."""
    import transformers

    kwargs = dict(kwargs)
    auto = getattr(transformers, kwargs.pop("auto_class"))
    if kwargs.pop("fsdp_loading", False):
        # transformers (distributed/fsdp.py: is_fsdp_enabled) loads weights on local rank 0 only, and
        # empty ones elsewhere, when accelerate's FSDP variables say so before from_pretrained; the
        # Trainer's FSDP plugin then broadcasts them shard by shard (cpu_ram_efficient_loading).
        os.environ["ACCELERATE_USE_FSDP"] = "true"
        os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "true"
    quant = kwargs.pop("quantization_config", None)
    if quant is not None:
        require_package("bitsandbytes", '4-bit loading (the 4-bit tier or train.quantization = "4bit")')
        kwargs["quantization_config"] = transformers.BitsAndBytesConfig(**quant)
    if kwargs.get("device_map") is None:
        kwargs.pop("device_map", None)
    from autoslm.engine.pod.prefetch import trusted_kernel

    try:
        try:
            with trusted_kernel(kwargs.get("attn_implementation")):
                return auto.from_pretrained(model_path, **kwargs)
        except (ImportError, ValueError, OSError) as e:
            # A flash kernel that cannot be imported or fetched (no wheel, no Hub access) must not fail
            # the run: retry with SDPA; a model that cannot load fails the retry the same way.
            if kwargs.get("attn_implementation") in (None, "sdpa", "eager"):
                raise
            reason = (str(e).splitlines() or [type(e).__name__])[0][:300]
            print(f"[autoslm] attention kernel {kwargs['attn_implementation']!r} unavailable ({reason}): using sdpa", flush=True)
            if on_fallback is not None:
                on_fallback(kwargs["attn_implementation"], reason)
            return auto.from_pretrained(model_path, **{**kwargs, "attn_implementation": "sdpa"})
    except OSError as e:
        raise FatalWorkerError(f"model {model_path!r}: cannot load it ({str(e).splitlines()[0]})") from None


def attach_adapter(model, spec, info=None, adapter_dir: Path | None = None):
    """Wrap ``model`` with a trainable LoRA adapter: a fresh one, or one continued from ``adapter_dir``.
    Vision-language checkpoints keep LoRA off their vision tower (they train text-only)."""
    from peft import LoraConfig, PeftModel, get_peft_model

    from autoslm.engine.train.gpu import lora_config_kwargs

    # No prepare_model_for_kbit_training for the 4-bit tier: it upcasts every non-quantized weight
    # (embeddings, norms, lm_head) to fp32, which costs GBs; non-reentrant checkpointing needs none of it.
    if adapter_dir is not None:
        return PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=True)
    return get_peft_model(model, LoraConfig(**lora_config_kwargs(spec, info)))


def keep_adapter_fp32(model) -> None:
    """Trainable (LoRA) weights back to fp32 where TRL cast them to bf16 (it does for a quantized base):
    AdamW's small updates vanish against bf16 weights, and the planner counts them in fp32."""
    import torch

    for param in model.parameters():
        if param.requires_grad and param.dtype in (torch.bfloat16, torch.float16):
            param.data = param.data.float()


def adapter_summary(model, init_from: str | None = None) -> dict:
    """What the trainer will update: the adapters on the model and their trainable parameters. A
    continued run must show one adapter whose LoRA weights are all trainable (a frozen or a second,
    fresh adapter would train something else than the one loaded)."""
    params = list(model.named_parameters())
    lora = [p for n, p in params if "lora_" in n]
    return {
        "init_from": init_from,
        "adapters": sorted(getattr(model, "peft_config", {}) or {}),
        "trainable_params": sum(p.numel() for _, p in params if p.requires_grad),
        "lora_params": sum(p.numel() for p in lora),
        "lora_trainable_params": sum(p.numel() for p in lora if p.requires_grad),
    }
