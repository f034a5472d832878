"""The models autoslm knows: size, shape (KV heads and head width), context, vocabulary, quantization tier,
whether the head is tied to the input embeddings, whether vLLM can serve them, how vision-language
checkpoints are treated. Pure data.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelInfo:
    id: str
    params_b: float  # billions of parameters
    hidden: int
    layers: int
    vllm_ok: bool = True  # vLLM can serve it
    vision: bool = False  # a vision-language checkpoint: trained and served text-only
    quant: str = "none"  # "none" | "4bit": the tier used when quantization = "auto"
    max_context: int = 32768
    vocab: int = 151936  # logits are tokens x vocab: often the largest activation of a small model
    estimated: bool = False  # not in the table: sizes guessed from the model id
    model_type: str | None = None  # the config's model_type: decides which Liger kernels apply
    kv_heads: int | None = None  # key/value heads (GQA) and their width: the KV cache per token and layer
    head_dim: int | None = None  # is 2 x kv_heads x head_dim values (None: guessed as hidden / 4 wide)
    tied: bool | None = None  # config.json's tie_word_embeddings: lm_head is the input embedding (None: unknown)

    @property
    def kv_width(self) -> float:
        """Values per token per layer in K (and again in V): num_key_value_heads x head_dim."""
        return self.kv_heads * self.head_dim if self.kv_heads and self.head_dim else self.hidden / 4


# Architectures whose layers Liger patches (liger_kernel.transformers' apply_liger_kernel_to_* table).
LIGER_MODEL_TYPES = frozenset(
    {
        "qwen2",
        "qwen3",
        "qwen2_5_vl",
        "qwen2_vl",
        "llama",
        "mistral",
        "gemma",
        "gemma2",
        "gemma3_text",
        "gemma3",
        "phi3",
        "granite",
        "olmo2",
        "smollm3",
    }
)


# Built-in offline models: built locally by the worker, no download.
BUILTIN_MODELS: dict[str, ModelInfo] = {
    "autoslm/tiny": ModelInfo(
        "autoslm/tiny",
        params_b=0.0002,
        hidden=64,
        layers=2,
        max_context=2048,
        vocab=1024,  # head_dim 32: vLLM serves it
        kv_heads=2,
        head_dim=32,
        tied=True,
    ),
}

# kv_heads, head_dim and tied from each checkpoint's config.json (num_key_value_heads, head_dim, tie_word_embeddings).
MODELS: dict[str, ModelInfo] = {
    **BUILTIN_MODELS,
    "Qwen/Qwen3-0.6B": ModelInfo("Qwen/Qwen3-0.6B", 0.6, 1024, 28, model_type="qwen3", kv_heads=8, head_dim=128, tied=True),
    "Qwen/Qwen3-1.7B": ModelInfo("Qwen/Qwen3-1.7B", 1.7, 2048, 28, model_type="qwen3", kv_heads=8, head_dim=128, tied=True),
    "Qwen/Qwen3-4B": ModelInfo("Qwen/Qwen3-4B", 4.0, 2560, 36, model_type="qwen3", kv_heads=8, head_dim=128, tied=True),
    "Qwen/Qwen3-8B": ModelInfo("Qwen/Qwen3-8B", 8.2, 4096, 36, model_type="qwen3", kv_heads=8, head_dim=128, tied=False),
    "Qwen/Qwen3-14B": ModelInfo(
        "Qwen/Qwen3-14B", 14.8, 5120, 40, quant="4bit", model_type="qwen3", kv_heads=8, head_dim=128, tied=False
    ),
    "Qwen/Qwen3-32B": ModelInfo(
        "Qwen/Qwen3-32B", 32.8, 5120, 64, quant="4bit", model_type="qwen3", kv_heads=8, head_dim=128, tied=False
    ),
    "Qwen/Qwen2.5-0.5B-Instruct": ModelInfo(
        "Qwen/Qwen2.5-0.5B-Instruct", 0.49, 896, 24, model_type="qwen2", kv_heads=2, head_dim=64, tied=True
    ),
    "Qwen/Qwen2.5-1.5B-Instruct": ModelInfo(
        "Qwen/Qwen2.5-1.5B-Instruct", 1.54, 1536, 28, model_type="qwen2", kv_heads=2, head_dim=128, tied=True
    ),
    "Qwen/Qwen2.5-VL-3B-Instruct": ModelInfo(
        "Qwen/Qwen2.5-VL-3B-Instruct", 3.8, 2048, 36, vision=True, model_type="qwen2_5_vl", kv_heads=2, head_dim=128, tied=True
    ),
    "Qwen/Qwen2.5-VL-7B-Instruct": ModelInfo(
        "Qwen/Qwen2.5-VL-7B-Instruct", 8.3, 3584, 28, vision=True, model_type="qwen2_5_vl", kv_heads=4, head_dim=128, tied=False
    ),
    "meta-llama/Llama-3.2-1B-Instruct": ModelInfo(
        "meta-llama/Llama-3.2-1B-Instruct", 1.2, 2048, 16, vocab=128256, model_type="llama", kv_heads=8, head_dim=64, tied=True
    ),
    "meta-llama/Llama-3.2-3B-Instruct": ModelInfo(
        "meta-llama/Llama-3.2-3B-Instruct", 3.2, 3072, 28, vocab=128256, model_type="llama", kv_heads=8, head_dim=128, tied=True
    ),
    "google/gemma-3-1b-it": ModelInfo(
        "google/gemma-3-1b-it", 1.0, 1152, 26, vocab=262144, model_type="gemma3_text", kv_heads=1, head_dim=256, tied=True
    ),
    "HuggingFaceTB/SmolLM2-1.7B-Instruct": ModelInfo(
        "HuggingFaceTB/SmolLM2-1.7B-Instruct", 1.7, 2048, 24, vocab=49152, model_type="llama", kv_heads=32, head_dim=64, tied=True
    ),
}


def model_info(model_id: str) -> ModelInfo | None:
    return MODELS.get(model_id)


_SIZE_IN_NAME = re.compile(r"(?<![A-Za-z0-9.])(\d+(?:\.\d+)?)\s*([BbMm])(?![A-Za-z])")


def guess_model_info(model_id: str) -> ModelInfo | None:
    """The table's entry, else sizes guessed from a "...-7B..." / "...-360M..." id; None if no size is in the name.

    A guess assumes a dense decoder with ``params ~= 12 * layers * hidden**2`` and a Qwen-sized vocab;
    it is marked ``estimated=True`` so a plan can say so.
    """
    known = MODELS.get(model_id)
    if known:
        return known
    name = model_id.rsplit("/", 1)[-1]
    m = _SIZE_IN_NAME.search(name.replace("_", "-"))
    if not m:
        return None
    params_b = float(m.group(1)) / (1000.0 if m.group(2) in "Mm" else 1.0)
    if params_b <= 0:
        return None
    layers = 16 if params_b < 1.5 else 28 if params_b < 5 else 36 if params_b < 10 else 48 if params_b < 40 else 80
    hidden = int(math.sqrt(params_b * 1e9 / (12 * layers)) // 64 * 64) or 64
    return ModelInfo(model_id, params_b, hidden, layers, quant="4bit" if params_b > 12 else "none", estimated=True)
