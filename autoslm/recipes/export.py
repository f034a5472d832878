"""`autoslm export`'s rules: the formats, the quantizations and who writes each, the pinned converter,
and the disk an export needs. Data and arithmetic, and one lookup (``find_quantizer``: PATH and the
installed packages), shared by the SDK's checks (before anything runs) and the worker's export
(engine/export/).

GGUF is written by llama.cpp's own converter (``convert_hf_to_gguf.py``, ``convert_lora_to_gguf.py``
and their ``gguf-py``), never by autoslm: the version pinned here is the llama-cpp-python source
distribution whose ``vendor/llama.cpp`` holds them. The converter writes 32- and 16-bit floats and
Q8_0 alone; every other quantization is llama.cpp's quantizer on its f16 file: its tool (``llama-quantize``)
where it is on PATH, else the same function (libllama's ``llama_model_quantize``) through llama-cpp-python.
"""

from __future__ import annotations

import importlib.util
import shutil

from autoslm.errors import UsageError

# The llama-cpp-python release whose source distribution carries the converter (llama.cpp 0c1e570):
# it knows Qwen3 and converts with transformers 5 and torch 2.13 (the stacks autoslm runs).
CONVERTER_DIST = "llama-cpp-python"
CONVERTER_VERSION = "0.3.36"
QUANTIZE_TOOL = "llama-quantize"
# llama-cpp-python's module: its bindings call libllama's llama_model_quantize, the function the tool calls.
QUANTIZE_BINDINGS = "llama_cpp"

FORMATS = ("merged", "gguf", "gguf-lora")
# Bytes per weight of each GGUF type (blocks carry their scales), for the disk an export needs.
CONVERTER_QUANTS = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32}
LORA_QUANTS = ("f32", "f16", "bf16", "q8_0")  # convert_lora_to_gguf.py's output types
QUANTIZE_TOOL_QUANTS = {
    "q4_0": 18 / 32,
    "q4_1": 20 / 32,
    "q5_0": 22 / 32,
    "q5_1": 24 / 32,
    "q2_k": 84 / 256,
    "q3_k_s": 110 / 256,
    "q3_k_m": 110 / 256,
    "q3_k_l": 110 / 256,
    "q4_k_s": 144 / 256,
    "q4_k_m": 144 / 256,
    "q5_k_s": 176 / 256,
    "q5_k_m": 176 / 256,
    "q6_k": 210 / 256,
    "iq4_nl": 18 / 32,
    "iq4_xs": 136 / 256,
}
DEFAULT_QUANT = "f16"
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Room on top of what is written: the safetensors and GGUF headers, the tokenizer, the file system's slack.
DISK_HEADROOM = 1.1


def checked_request(fmt: str, quant: str | None) -> str:
    """The quantization an export writes (the default when none is given); an unknown format or
    quantization is one UsageError naming the ones there are."""
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: not a format autoslm exports", hint=f"one of {', '.join(FORMATS)}")
    if fmt == "merged":
        if quant is not None:
            raise UsageError(
                f"--quant {quant}: merged weights are saved in the dtype the run trained in",
                hint="--quant goes with --format gguf or gguf-lora",
            )
        return ""
    q = (quant or DEFAULT_QUANT).lower()
    known = LORA_QUANTS if fmt == "gguf-lora" else (*CONVERTER_QUANTS, *QUANTIZE_TOOL_QUANTS)
    if q not in known:
        raise UsageError(f"--quant {quant!r}: not a quantization of --format {fmt}", hint=f"one of {', '.join(known)}")
    return q


def needs_quantize_tool(fmt: str, quant: str) -> bool:
    return fmt == "gguf" and quant in QUANTIZE_TOOL_QUANTS


def find_quantizer() -> str | None:
    """What writes the k-quants here: the quantize tool's path where it is on PATH, else ``QUANTIZE_BINDINGS``
    where llama-cpp-python is installed (whether its library loads, the export's plan finds out), else None."""
    tool = shutil.which(QUANTIZE_TOOL)
    if tool is not None:
        return tool
    try:
        return QUANTIZE_BINDINGS if importlib.util.find_spec(QUANTIZE_BINDINGS) is not None else None
    except (ImportError, ValueError):
        return None


def quantize_tool_missing_hint() -> str:
    return (
        f"llama.cpp's quantizer writes this type: install llama.cpp (its release archives, or `brew install llama.cpp`) "
        f"so that {QUANTIZE_TOOL} is on PATH, or llama-cpp-python (`pip install llama-cpp-python`), whose library "
        "quantizes; f16, bf16 and q8_0 need nothing more"
    )


def bytes_needed(params: int, fmt: str, quant: str, dtype: str) -> int:
    """What an export writes at its peak, in bytes, for a model of ``params`` weights: the merged weights
    (kept under the staging folder while a GGUF is converted from them), the GGUF, and for a quantize-tool
    type the f16 file it starts from."""
    merged = params * DTYPE_BYTES.get(dtype, 4)
    if fmt == "merged":
        total = merged
    elif fmt == "gguf-lora":
        total = 0  # an adapter: small beside any model (the check is for merged weights)
    elif quant in QUANTIZE_TOOL_QUANTS:
        total = merged + params * (CONVERTER_QUANTS["f16"] + QUANTIZE_TOOL_QUANTS[quant])
    else:
        total = merged + params * CONVERTER_QUANTS[quant]
    return int(total * DISK_HEADROOM)


def gguf_name(quant: str, lora: bool = False) -> str:
    """The file an export writes: ``model-q8_0.gguf``, ``adapter-f16.gguf``."""
    return f"{'adapter' if lora else 'model'}-{quant}.gguf"


def gigabytes(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"
