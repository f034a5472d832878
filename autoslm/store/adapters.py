"""A LoRA adapter's files, checked before anything loads them: there, whole and readable.

A download cut short, or a file damaged in a store, otherwise surfaces as a library's error from deep
inside peft or safetensors (``KeyError: 'peft_type'``, ``SafetensorError``, ``JSONDecodeError``, or
``HFValidationError`` when peft takes a folder without weights for a Hub id) that names no file. Here
each problem is one line naming the file and what is wrong with it. Reads headers only (json, struct):
no torch, no safetensors, so the CLI can check before it loads anything heavy.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from autoslm.errors import UsageError

CONFIG = "adapter_config.json"
SAFETENSORS = "adapter_model.safetensors"
PICKLED = "adapter_model.bin"
MAX_HEADER = 100_000_000  # safetensors' own limit on a header


class AdapterDamaged(UsageError):
    """An adapter's file is missing, cut short or unreadable: ``path`` names it."""

    def __init__(self, path: Path, problem: str, *, hint: str | None = None):
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"{path}: {problem}", hint=hint)


def check_adapter(folder: Path, *, hint: str | None = None) -> None:
    """Raise ``AdapterDamaged`` for the first thing wrong with the adapter in ``folder``."""
    folder = Path(folder)
    config = folder / CONFIG
    if not config.is_file():
        raise AdapterDamaged(config, "missing: a PEFT adapter folder has an adapter_config.json", hint=hint)
    check_config(config, hint=hint)
    weights = folder / SAFETENSORS
    if weights.is_file():
        check_safetensors(weights, hint=hint)
    elif (folder / PICKLED).is_file():
        check_pickled(folder / PICKLED, hint=hint)
    else:
        raise AdapterDamaged(weights, f"missing: no adapter weights ({SAFETENSORS} or {PICKLED}) beside {CONFIG}", hint=hint)


def check_config(path: Path, *, hint: str | None = None) -> dict:
    raw = path.read_bytes()
    if not raw.strip():
        raise AdapterDamaged(path, "empty", hint=hint)
    try:
        cfg = json.loads(raw)
    except UnicodeDecodeError:
        raise AdapterDamaged(path, "not text: not a JSON file", hint=hint) from None
    except json.JSONDecodeError as e:
        raise AdapterDamaged(path, f"not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})", hint=hint) from None
    if not isinstance(cfg, dict):
        raise AdapterDamaged(path, f"not a JSON object (a {type(cfg).__name__})", hint=hint)
    if not cfg.get("peft_type"):
        raise AdapterDamaged(path, "has no peft_type: not a PEFT adapter config", hint=hint)
    if str(cfg["peft_type"]).upper() == "LORA" and not (isinstance(cfg.get("r"), int) and cfg["r"] > 0):
        raise AdapterDamaged(path, f"a LoRA config whose rank r is {cfg.get('r')!r}, not a positive integer", hint=hint)
    return cfg


def check_safetensors(path: Path, *, hint: str | None = None) -> None:
    """The header is there and parses, and the file is as long as its tensors say (a cut download is shorter)."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise AdapterDamaged(path, f"truncated: {size} bytes, shorter than a safetensors header", hint=hint)
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER:
            raise AdapterDamaged(path, f"not a safetensors file (its first 8 bytes give a {n:,}-byte header)", hint=hint)
        if 8 + n > size:
            raise AdapterDamaged(path, f"truncated: {size:,} bytes, but its header alone is {8 + n:,}", hint=hint)
        text = f.read(n)
    try:
        header = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise AdapterDamaged(path, "damaged: its safetensors header is not valid JSON", hint=hint) from None
    if not isinstance(header, dict):
        raise AdapterDamaged(path, "damaged: its safetensors header is not a JSON object", hint=hint)
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    if not tensors:
        raise AdapterDamaged(path, "holds no tensors", hint=hint)
    try:
        end = max(int(v["data_offsets"][1]) for v in tensors.values())
    except (KeyError, TypeError, ValueError, IndexError):
        raise AdapterDamaged(path, "damaged: a tensor in its header has no data_offsets", hint=hint) from None
    want = 8 + n + end
    if size < want:
        raise AdapterDamaged(path, f"truncated: {size:,} bytes of the {want:,} its header describes", hint=hint)
    if size > want:
        raise AdapterDamaged(path, f"damaged: {size:,} bytes, {size - want:,} more than its header describes", hint=hint)


def check_pickled(path: Path, *, hint: str | None = None) -> None:
    """A torch.save file is a zip archive: its first bytes say so, its last the archive's end."""
    data = path.read_bytes()
    if not data.startswith(b"PK\x03\x04"):
        raise AdapterDamaged(path, "not a torch.save archive (it does not start as a zip file)", hint=hint)
    if b"PK\x05\x06" not in data[-65_557:]:
        raise AdapterDamaged(path, f"truncated: {len(data):,} bytes and no end of the archive", hint=hint)
