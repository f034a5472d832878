"""Merge a LoRA adapter into its base model and save the merged weights (`autoslm export --format merged`,
`push --merged`; engine/export/ calls ``merge``).

    python -m autoslm.engine.train.merge --model autoslm/tiny --adapter ADAPTER_DIR --out OUT_DIR [--dtype bfloat16]

Runs with the worker extra (torch, transformers, peft) in its own process, so the laptop-side CLI
that asks for it never imports torch. Writes config, generation config, safetensors weights and the
tokenizer with its chat template, loadable by transformers without peft.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def merge(model_id: str, adapter: Path, out: Path, home: Path, trust_remote_code: bool = False, dtype: str = "float32") -> Path:
    """The base loaded in ``dtype`` (the run's: what its adapter was trained against), peft's
    ``merge_and_unload``, saved as safetensors."""
    from peft import PeftModel

    from autoslm.engine.train import models

    path = models.resolve_model_path(model_id, home)
    tokenizer = models.load_tokenizer(path, trust_remote_code)
    import torch
    from transformers import AutoModelForCausalLM

    # No 4-bit and no kernels: merged weights are published, not trained on.
    base = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=trust_remote_code, dtype=getattr(torch, dtype))
    merged = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    return out


def main(argv: list[str] | None = None) -> int:
    from autoslm.secrets import autoslm_home

    p = argparse.ArgumentParser(prog="python -m autoslm.engine.train.merge", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--adapter", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    a = p.parse_args(argv)
    merge(a.model, a.adapter, a.out, autoslm_home(), a.trust_remote_code, a.dtype)
    print(f"merged weights written to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
