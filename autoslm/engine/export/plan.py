"""An export's checks, all before anything is written: the base model, the converter and what it knows,
llama.cpp's quantizer, and the disk. What they find is the ``Plan`` the export follows.

A refusal is ``Refused`` (exit 2, one line): an architecture or a tokenizer the pinned converter does
not know (naming the ones it knows), a quantization llama.cpp's quantizer writes when neither its tool nor
llama-cpp-python's library is there, a destination without room for what the export writes at its peak.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from autoslm.recipes.export import (
    QUANTIZE_BINDINGS,
    bytes_needed,
    find_quantizer,
    gigabytes,
    needs_quantize_tool,
    quantize_tool_missing_hint,
)


class Refused(Exception):
    """Bad input found before any work: one line, exit 2."""


@dataclass
class Plan:
    req: dict
    model_path: str  # what transformers loads: a local directory or a Hub id
    config_dir: Path  # a local directory holding the base's config.json and tokenizer (the converter reads it)
    params: int = 0
    arch: str = ""
    converter: Path | None = None
    pre: str | None = None  # the pre-tokenizer autoslm names for the converter (gguf_convert.declared_pre)
    quantize_tool: str | None = None  # the tool's path, or QUANTIZE_BINDINGS: libllama through llama-cpp-python
    notes: list[str] = field(default_factory=list)

    @property
    def fmt(self) -> str:
        return self.req["format"]

    @property
    def quant(self) -> str:
        return self.req.get("quant") or ""


def make_plan(req: dict, home: Path, log) -> Plan:
    """Every check of the export described by ``req``, in the order that costs least first."""
    from autoslm.engine.train import models
    from autoslm.errors import FatalWorkerError

    fmt, quant = req["format"], req.get("quant") or ""
    tool = None
    if needs_quantize_tool(fmt, quant):
        tool = find_quantizer()
        if tool is None:
            raise Refused(f"--quant {quant}: {quantize_tool_missing_hint()}")
        if tool == QUANTIZE_BINDINGS:
            try:  # installed is not enough: a build without a library of its own needs LLAMA_CPP_LIB_PATH
                importlib.import_module(QUANTIZE_BINDINGS)
            except Exception as e:  # noqa: BLE001 - a library that does not load is this refusal, whatever says so
                raise Refused(
                    f"--quant {quant}: llama-cpp-python is installed but its library does not load ({type(e).__name__}); "
                    f"{quantize_tool_missing_hint()}"
                ) from None
    try:
        model_path = models.resolve_model_path(req["model"], home)
    except FatalWorkerError as e:
        raise Refused(str(e)) from None
    config_dir = _config_dir(model_path)
    config = json.loads((config_dir / "config.json").read_text(encoding="utf-8"))
    plan = Plan(req, model_path, config_dir, arch=(config.get("architectures") or ["?"])[0], quantize_tool=tool)
    if fmt != "merged":
        _check_converter(plan, home, log)
    plan.params = _parameters(model_path, req.get("trust_remote_code", False))
    need = bytes_needed(plan.params, fmt, quant, req["dtype"])
    free = int(req["free_bytes"])
    if need > free:
        raise Refused(
            f"--to {req['dest']}: exporting {req['model']} ({plan.params / 1e9:.2f}B parameters, {req['dtype']}) as {fmt}"
            f"{' ' + quant if quant else ''} needs about {gigabytes(need)} free there, and its disk has {gigabytes(free)}"
        )
    return plan


def _config_dir(model_path: str) -> Path:
    """A local folder with the base model's config and tokenizer: the model's own, or the Hub's cache of
    those files (not the weights: they load later, once every check has passed)."""
    if Path(model_path).is_dir():
        return Path(model_path)
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(model_path, allow_patterns=["*.json", "*.model", "*.jinja", "*.txt"]))
    except Exception as e:  # noqa: BLE001 - the Hub's errors are many; one line names the model
        raise Refused(f"model {model_path}: cannot read its config from the Hub ({type(e).__name__}: {str(e)[:200]})") from None


def _check_converter(plan: Plan, home: Path, log) -> None:
    from autoslm.engine.export.converter import ensure_converter, home_root, known_architectures, unknown_architecture

    plan.converter = ensure_converter(home_root(home), log)
    known = known_architectures(plan.converter)
    if plan.arch not in known:
        raise Refused(unknown_architecture(plan.arch, known))
    if plan.fmt == "gguf" and (plan.config_dir / "tokenizer.model").exists():
        import importlib.util

        if importlib.util.find_spec("sentencepiece") is None:  # the converter reads a SentencePiece model with it
            raise Refused(
                f"{plan.req['model']} has a SentencePiece tokenizer, which llama.cpp's converter reads with sentencepiece: pip install sentencepiece"
            )
    if plan.fmt == "gguf":
        from autoslm.engine.export.gguf_convert import tokenizer_check
        from autoslm.engine.train import models

        tokenizer = models.load_tokenizer(str(plan.config_dir), plan.req.get("trust_remote_code", False))
        plan.pre, refusal = tokenizer_check(plan.converter, plan.config_dir, tokenizer)
        if refusal:
            raise Refused(refusal)
        if plan.pre:
            plan.notes.append(f"the tokenizer's pre-tokenizer is named {plan.pre!r} from its tokenizer.json")


def _parameters(model_path: str, trust_remote_code: bool) -> int:
    """The model's weights, counted on the meta device (nothing is loaded)."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return sum(p.numel() for p in model.parameters())
