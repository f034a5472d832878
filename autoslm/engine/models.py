"""Load the base model, its tokenizer and the LoRA adapter a run trains.

``trust_remote_code`` follows the JobSpec (off by default): a write token sits in the environment,
so foreign code runs only when the user asked for it.
"""

from __future__ import annotations

from pathlib import Path

from autoslm.errors import FatalWorkerError

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


def load_model(model_path: str, trust_remote_code: bool, dtype=None, quantization: dict | None = None):
    """``quantization``: BitsAndBytesConfig keyword arguments for the 4-bit QLoRA tier, or None."""
    import torch
    from transformers import AutoModelForCausalLM

    if dtype is None:
        dtype = torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32
    kwargs = dict(trust_remote_code=trust_remote_code, dtype=dtype)
    if quantization is not None:
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(**quantization)
    try:
        return AutoModelForCausalLM.from_pretrained(model_path, **kwargs)
    except OSError as e:
        raise FatalWorkerError(f"model {model_path!r}: cannot load it ({str(e).splitlines()[0]})") from None


def attach_adapter(model, spec, info=None, adapter_dir: Path | None = None):
    """Wrap ``model`` with a trainable LoRA adapter: a fresh one, or one continued from ``adapter_dir``.
    Vision-language checkpoints keep LoRA off their vision tower (they train text-only)."""
    from peft import LoraConfig, PeftModel, get_peft_model

    from autoslm.engine.gpu import lora_config_kwargs

    if getattr(model, "is_loaded_in_4bit", False):
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if adapter_dir is not None:
        return PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=True)
    return get_peft_model(model, LoraConfig(**lora_config_kwargs(spec, info)))
