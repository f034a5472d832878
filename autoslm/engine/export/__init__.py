"""The worker's export: a run's adapter merged into its base model and written as safetensors, GGUF
(through llama.cpp's pinned converter and, for k-quants, its quantize tool) or a GGUF LoRA, with an
Ollama Modelfile beside a GGUF.

    python -m autoslm.engine.export REQUEST.json RESULT.json

Started as a process by the SDK (sdk/export.py), so the laptop side never imports torch. Every check
comes first (``plan.py``: the converter knows the architecture and the tokenizer, the quantize tool is
there, the disk holds it); only then is anything written, into a staging folder inside the destination
whose files are renamed into place at the end (``run.py``): a failed export leaves none of its files
where the user looks. Exit codes: 0 done, 2 refused before any work (one line on stderr), 1 failed.
"""
