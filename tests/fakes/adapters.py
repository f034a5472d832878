"""A LoRA adapter's weights file, well formed, built without torch: for tests of what reads adapters."""

from __future__ import annotations

import json
import struct


def safetensors_bytes(tensors: dict[str, tuple[str, list[int]]]) -> bytes:
    """A well-formed safetensors file (header + zeroed data), written as the format says: 8-byte
    little-endian header length, the JSON header, then each tensor's bytes at its data_offsets."""
    sizes = {"F32": 4, "BF16": 2, "F16": 2}
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"\0" * offset


LORA = {"base_model.model.layer.lora_A.weight": ("F32", [8, 64]), "base_model.model.layer.lora_B.weight": ("F32", [64, 8])}
