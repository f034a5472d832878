"""llama.cpp's converter run through its own entry point, and what it will say of a model's tokenizer.

    python -m autoslm.engine.export.gguf_convert CONVERTER hf [--pre NAME] -- MODEL_DIR --outtype f16 --outfile OUT
    python -m autoslm.engine.export.gguf_convert CONVERTER lora -- ADAPTER_DIR --base BASE_DIR --outtype f16 --outfile OUT

CONVERTER is the pinned copy ``converter.py`` unpacked. The scripts run unchanged (``runpy``, as
``python convert_hf_to_gguf.py`` would), with their own ``gguf-py``: autoslm writes no GGUF itself.

The converter knows a BPE tokenizer's pre-tokenizer (how text is split before merging) by a hash of the
token ids of a fixed text, and stops on a hash it does not know. ``--pre`` names it for the one kind of
tokenizer autoslm identifies from its ``tokenizer.json`` instead: a byte-level BPE that normalizes nothing
and splits by GPT-2's own pattern, which is llama.cpp's ``gpt-2`` pre-tokenizer by definition (the
built-in ``autoslm/tiny`` is one). The name goes in through the converter's registry of model classes (a
subclass of the architecture's own class that answers ``get_vocab_base_pre``); the rest is the converter's.
Any other unknown tokenizer is refused before any work (``tokenizer_check``).
"""

from __future__ import annotations

import json
import logging
import runpy
import sys
from pathlib import Path

# tokenizers' ByteLevel pre-tokenizer with its GPT-2 pattern (use_regex) and no prefix space, as
# tokenizer.json writes it: GPT-2's own split.
GPT2_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
SCRIPTS = {"hf": "convert_hf_to_gguf.py", "lora": "convert_lora_to_gguf.py"}


def import_conversion(converter: Path):
    """The converter's ``conversion`` package (and its gguf-py) from the pinned copy."""
    if str(converter) not in sys.path:
        sys.path.insert(0, str(converter))
    import conversion

    return conversion


def declared_pre(model_dir: Path) -> str | None:
    """llama.cpp's name for the pre-tokenizer a ``tokenizer.json`` declares, where autoslm can tell it
    without the converter's hash: GPT-2's byte-level split. None for anything else."""
    try:
        tj = json.loads((Path(model_dir) / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    model = tj.get("model") or {}
    if model.get("type") == "BPE" and tj.get("normalizer") is None and tj.get("pre_tokenizer") == GPT2_BYTE_LEVEL:
        return "gpt-2"
    return None


def uses_bpe_hash(model_dir: Path) -> bool:
    """Whether the converter will identify this tokenizer by its hash: a BPE tokenizer.json, and no
    SentencePiece model beside it (which the converter reads first, without a hash)."""
    d = Path(model_dir)
    if (d / "tokenizer.model").exists() or not (d / "tokenizer.json").exists():
        return False
    try:
        return (json.loads((d / "tokenizer.json").read_text(encoding="utf-8")).get("model") or {}).get("type") == "BPE"
    except ValueError:
        return False


def tokenizer_check(converter: Path, model_dir: Path, tokenizer) -> tuple[str | None, str | None]:
    """(pre-tokenizer to declare, refusal): (None, None) when the converter knows the tokenizer itself or
    reads it without a hash; a name to pass as ``--pre`` for GPT-2's split; else the line that refuses."""
    if not uses_bpe_hash(model_dir):
        return None, None
    conversion = import_conversion(converter)
    quiet = logging.getLogger("hf-to-gguf")
    level, quiet.level = quiet.level, logging.CRITICAL  # its banner for an unknown hash: said below in one line
    try:
        conversion.TextModel.get_vocab_base_pre(None, tokenizer)  # uses only the tokenizer
        return None, None
    except NotImplementedError:
        pass
    finally:
        quiet.setLevel(level)
    pre = declared_pre(model_dir)
    if pre is not None:
        return pre, None
    from hashlib import sha256

    from autoslm.recipes.export import CONVERTER_VERSION

    chktok = tokenizer.encode(_check_text(conversion))
    digest = sha256(str(chktok).encode()).hexdigest()
    return None, (
        f"llama.cpp's converter (llama-cpp-python {CONVERTER_VERSION}) does not know this model's tokenizer "
        f"(its pre-tokenizer hash is {digest[:16]}...): GGUF would tokenize differently from the model; "
        "llama.cpp learns a tokenizer through its convert_hf_to_gguf_update.py"
    )


def _check_text(conversion) -> str:
    """The fixed text the converter hashes, read from its own function."""
    import ast
    import inspect

    src = inspect.getsource(conversion.TextModel.get_vocab_base_pre)
    for node in ast.walk(ast.parse(src.strip() if src.startswith(" ") else src)):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "chktxt":
            return ast.literal_eval(node.value)
    raise RuntimeError("the converter's check text was not found")


def declare(conversion, arch: str, pre: str) -> None:
    """The converter's class for ``arch``, registered again as a subclass that names the pre-tokenizer."""
    base = conversion.get_model_class(arch)

    class Declared(base):
        model_arch = base.model_arch

        def get_vocab_base_pre(self, tokenizer) -> str:
            return pre

    Declared.__name__ = base.__name__
    conversion.ModelBase.register(arch)(Declared)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or "--" not in args or args[1] not in SCRIPTS:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    converter, kind = Path(args[0]), args[1]
    head, rest = args[2 : args.index("--")], args[args.index("--") + 1 :]
    conversion = import_conversion(converter)
    if kind == "hf" and head[:1] == ["--pre"]:
        config = json.loads((Path(rest[0]) / "config.json").read_text(encoding="utf-8"))
        declare(conversion, (config.get("architectures") or [""])[0], head[1])
    sys.argv = [str(converter / SCRIPTS[kind]), *rest]
    runpy.run_path(str(converter / SCRIPTS[kind]), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
