"""The model behind `autoslm chat`: the base model and a run's LoRA adapter, loaded on this machine
(CUDA, Apple MPS or the CPU), answering through the model's own chat template.

The one laptop-side module that imports torch, and only when a chat starts (``autoslm.views.chat``
imports it then): `autoslm --help` and every other command stay light. The built-in ``autoslm/tiny``
is built by the worker's code, started as a process (the laptop side never imports the engine).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from autoslm.errors import UsageError

HEADROOM = 1.25  # activations, the KV cache and the allocator's slack on top of the weights


def resolve_model(model: str, home: Path) -> str:
    """A local directory or Hub id that transformers can load (the built-in model built first if missing)."""
    if model == "autoslm/tiny":
        p = subprocess.run(
            [sys.executable, "-m", "autoslm.engine.train.tiny", str(home / "models")],
            capture_output=True,
            text=True,
            env={**os.environ, "AUTOSLM_HOME": str(home)},
        )
        if p.returncode != 0:
            tail = (p.stderr or p.stdout).strip().splitlines()
            raise UsageError(f"could not build the built-in model autoslm/tiny: {tail[-1] if tail else p.returncode}")
        return p.stdout.strip().splitlines()[-1]
    return model


def pick_device(wanted: str | None = None):
    import torch

    if wanted:
        return torch.device(wanted)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def pick_dtype(device):
    import torch

    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "mps":
        return torch.float16
    return torch.float32  # CPU: half precision is slow or unsupported there


def free_memory_gb(device) -> float | None:
    """What this device can hold now: free GPU memory, else the machine's available RAM."""
    import torch

    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] / 1e9
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 / 1e9
    except OSError:
        pass
    try:  # macOS and others: the physical memory (MPS shares it)
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(model: str, device, dtype, free_gb: float | None) -> None:
    """Refuse, in one line, a model that cannot fit: better than an allocator error or a swapping machine."""
    import torch

    from autoslm.catalog.models import guess_model_info

    info = guess_model_info(model)
    if info is None or free_gb is None:
        return
    bytes_per = torch.tensor([], dtype=dtype).element_size()
    need = info.params_b * 1e9 * bytes_per * HEADROOM / 1e9
    if need > free_gb:
        where = "GPU" if device.type == "cuda" else "machine"
        raise UsageError(
            f"{model} needs about {need:.1f} GB in {str(dtype).removeprefix('torch.')} on {device.type}; "
            f"this {where} has {free_gb:.1f} GB free",
            hint="chat on a machine with more memory (or a GPU); the run's adapter is the same there",
        )


class ChatModel:
    def __init__(self, model, tokenizer, device, thinking: bool):
        self.model, self.tokenizer, self.device, self.thinking = model, tokenizer, device, thinking

    def _stop_ids(self) -> list[int]:
        tok = self.tokenizer
        ids = [tok.eos_token_id] if tok.eos_token_id is not None else []
        end = tok.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tok.get_vocab() else None
        return ids + ([end] if end is not None and end not in ids else [])

    def generate(self, messages: list[dict], *, temperature: float = 0.0, max_new_tokens: int = 256, on_text=None) -> str:
        import torch
        from transformers import TextIteratorStreamer

        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=self.thinking
        )
        inputs = self.tokenizer(text, return_tensors="pt", add_special_tokens=False).to(self.device)
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        kwargs = dict(
            **inputs,
            max_new_tokens=max_new_tokens,
            streamer=streamer,
            eos_token_id=self._stop_ids(),
            pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
        )
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        failed: list[BaseException] = []

        def run():
            try:
                with torch.inference_mode():
                    self.model.generate(**kwargs)
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                failed.append(e)
                streamer.end()

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        pieces = []
        for piece in streamer:
            pieces.append(piece)
            if on_text is not None and piece:
                on_text(piece)
        worker.join()
        if failed:
            raise failed[0]
        return "".join(pieces).strip()


def load(target, home: Path, device: str | None = None) -> ChatModel:
    """The base model (+ the run's adapter unless ``target.adapter`` is None) on the best device here."""
    import logging
    import warnings

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # The chat is the output: no loading bars or library deprecation notes around it.
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="peft")
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # peft imports it: its optional-kernel notes
    dev = pick_device(device)
    dtype = pick_dtype(dev)
    check_fits(target.model, dev, dtype, free_memory_gb(dev))
    path = resolve_model(target.model, home)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=target.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=target.trust_remote_code)
    except OSError as e:
        raise UsageError(
            f"cannot load {target.model}: {str(e).splitlines()[0]}",
            hint="a Hub model needs network access the first time (or HF_HUB_OFFLINE with a cached copy)",
        ) from None
    if not tokenizer.chat_template:
        raise UsageError(f"{target.model} has no chat template: chat needs an instruct/chat model")
    if target.adapter is not None:
        from peft import PeftModel

        try:  # checked file by file before (store/adapters.py); what is left is a mismatch with the model
            model = PeftModel.from_pretrained(model, str(target.adapter))
        except Exception as e:  # noqa: BLE001 - peft/safetensors/torch raise many kinds; one line names the cause
            first = (str(e).strip().splitlines() or [""])[0][:300]
            raise UsageError(
                f"cannot load the adapter {target.source or target.adapter} onto {target.model}: {type(e).__name__}: {first}",
                hint="the adapter was trained for another base model, or its files are damaged",
            ) from None
    model.to(dev).eval()
    torch.manual_seed(0)
    return ChatModel(model, tokenizer, dev, target.thinking)
