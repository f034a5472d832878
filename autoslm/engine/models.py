"""Load the base model, its tokenizer and the LoRA adapter a run trains.

``trust_remote_code`` follows the JobSpec (off by default): a write token sits in the environment,
so foreign code runs only when the user asked for it.
"""

from __future__ import annotations

from pathlib import Path

from autoslm.errors import FatalWorkerError

LORA_EXCLUDE_VISION = r".*(visual|vision_tower|vision_model|multi_modal_projector|mm_projector).*"


def resolve_model_path(model_id: str, home: Path) -> str:
    """A local directory or Hub id that transformers can load; builds the offline model when asked."""
    if model_id == "autoslm/tiny":
        from autoslm.engine.tiny import ensure_tiny

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


def load_model(model_path: str, trust_remote_code: bool, dtype=None, quantization_config=None):
    import torch
    from transformers import AutoModelForCausalLM

    if dtype is None:
        dtype = torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32
    kwargs = dict(trust_remote_code=trust_remote_code, dtype=dtype)
    if quantization_config is not None:
        kwargs["quantization_config"] = quantization_config
    try:
        return AutoModelForCausalLM.from_pretrained(model_path, **kwargs)
    except OSError as e:
        raise FatalWorkerError(f"model {model_path!r}: cannot load it ({str(e).splitlines()[0]})") from None


def lora_config(train, vision: bool = False):
    from peft import LoraConfig

    targets = train.lora_targets
    kwargs = {}
    if vision:
        # Vision-language checkpoints train text-only: keep LoRA off the vision tower and projector.
        kwargs["exclude_modules"] = LORA_EXCLUDE_VISION
    return LoraConfig(
        r=train.lora_rank,
        lora_alpha=train.lora_alpha,
        lora_dropout=train.lora_dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
        **kwargs,
    )


def attach_adapter(model, train, adapter_dir: Path | None = None, vision: bool = False):
    """Wrap ``model`` with a trainable LoRA adapter: a fresh one, or one continued from ``adapter_dir``."""
    from peft import PeftModel, get_peft_model

    if adapter_dir is not None:
        return PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=True)
    return get_peft_model(model, lora_config(train, vision=vision))
