"""A k-quant where llama.cpp's quantize tool is not installed: llama-cpp-python's bindings call
``llama_model_quantize``, the libllama function the tool (``llama-quantize``) itself calls, with the
tool's defaults for everything but the type.

``python -m autoslm.engine.export.quantize SRC.gguf OUT.gguf TYPE`` (engine/export/run.py starts it as a
process of its own, so that the library's output goes to the export's log and a crash in it is a failed
step); exit 0 once OUT is written.
"""

from __future__ import annotations

import ctypes
import sys


def quantize(src: str, out: str, quant: str) -> int:
    import llama_cpp

    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{quant.upper()}", None)
    if ftype is None:
        print(f"llama-cpp-python {llama_cpp.__version__} has no quantization {quant}", file=sys.stderr)
        return 2
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    code = llama_cpp.llama_model_quantize(src.encode(), out.encode(), ctypes.byref(params))
    if code != 0:
        print(f"llama_model_quantize returned {code}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit("usage: python -m autoslm.engine.export.quantize SRC.gguf OUT.gguf TYPE")
    raise SystemExit(quantize(*sys.argv[1:]))
