"""What a GPU pod will run, built on this CPU: ``python -m autoslm.engine --print-config``.

Runs on both stacks (the worker image's pins in ``make test``, the laptop's in ``make test-fast``): the TRL configs are really built, so a
keyword one transformers/TRL version lacks fails here, not on a rented GPU. The command line, a process
of its own, runs on the image's pins only (`pod`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autoslm.engine.train.print_config import build
from autoslm.spec import load_spec, validate_dict

pytestmark = pytest.mark.worker

REPO = Path(__file__).resolve().parents[2]
JOBSPECS = sorted((REPO / "jobspecs").glob("*.toml"))


def _ckpt(trainer: dict) -> tuple[bool, dict]:
    """(on, kwargs) under whichever name this transformers uses (5.17: gradient_, 5.2x: activation_)."""
    on = trainer.get("activation_checkpointing", trainer.get("gradient_checkpointing"))
    kw = trainer.get("activation_checkpointing_kwargs") or trainer.get("gradient_checkpointing_kwargs") or {}
    return bool(on), kw


def _spec(model: str, method: str, **train) -> object:
    raw = {
        "name": "pc",
        "model": model,
        "environment": {"id": "autoslm/arith", "params": {"n_train": 64, "n_eval": 8}},
        "train": {"method": method, "max_steps": 10, **train},
        "compute": {"provider": "runpod", "gpu": "RTX 4090"},
        "artifacts": {"store": "hf", "repo": "someone/runs"},
    }
    return validate_dict(raw)


@pytest.mark.parametrize("path", JOBSPECS, ids=lambda p: p.name)
def test_every_jobspec_builds_for_cuda(path):
    spec = load_spec(path)
    out = build(spec, device_kind="cuda")
    assert set(out) >= {"trainer", "model", "generation", "memory"}
    t = out["trainer"]
    assert t["use_cpu"] is False
    if spec.model == "autoslm/tiny":
        return  # the built-in CPU model: no GPU-specific claims
    assert t["bf16"] is True
    on, kw = _ckpt(t)
    # Checkpointing only where memory needs it: off means the step fits without it.
    assert (on and kw.get("use_reentrant") is False) or (not on and out["memory"]["fits"] is True)
    assert out["model"]["dtype"] == "bfloat16" and out["model"]["device_map"] == {"": "cuda:0"}
    assert out["memory"]["fits"] is True, out["memory"]


def test_grpo_gpu_jobspec_colocates_vllm_and_fits_its_24gb_cards():
    spec = load_spec(REPO / "jobspecs/qwen3-0.6b-grpo-gpu.toml")
    for gpu in spec.compute.gpus:
        out = build(spec, device_kind="cuda", gpu=gpu)
        t, g = out["trainer"], out["generation"]
        assert t["use_vllm"] is True and t["vllm_mode"] == "colocate" and g["backend"] == "vllm-colocate"
        assert t["vllm_max_model_length"] >= spec.train.max_length
        assert not t.get("use_liger_kernel")  # deprecated for GRPO (TRL's own fused LM head)
        assert out["memory"]["fits"] is True, (gpu, out["memory"])
        # The batch the planner sized from memory is the one the trainer gets.
        assert (
            t["per_device_train_batch_size"] * t["gradient_accumulation_steps"]
            == spec.train.prompts_per_step * spec.train.group_size
        )


def test_sft_gpu_jobspec_is_padding_free_on_a_flash_kernel():
    spec = load_spec(REPO / "jobspecs/qwen3-0.6b-sft-gpu.toml")
    out = build(spec, device_kind="cuda")
    t, m = out["trainer"], out["model"]
    assert t["bf16"] is True
    assert t["padding_free"] is True or t["packing"] is True
    assert "flash" in m["attn_implementation"]
    assert t["use_liger_kernel"] is True


def test_micro_batch_grows_with_gpu_memory():
    spec = _spec("Qwen/Qwen3-1.7B", "sft", batch_size=64, max_length=2048)
    small = build(spec, device_kind="cuda", gpu="RTX 4090")["trainer"]
    big = build(spec, device_kind="cuda", gpu="H100 80GB")["trainer"]
    assert big["per_device_train_batch_size"] > small["per_device_train_batch_size"]
    for t in (small, big):
        assert t["per_device_train_batch_size"] * t["gradient_accumulation_steps"] == 64


def test_each_default_can_be_turned_off():
    spec = _spec(
        "Qwen/Qwen3-0.6B",
        "sft",
        bf16=False,
        gradient_checkpointing=False,
        liger_kernel=False,
        attn_implementation="sdpa",
        padding_free=False,
    )
    out = build(spec, device_kind="cuda")
    t = out["trainer"]
    assert t["bf16"] is False and not _ckpt(t)[0] and t["use_liger_kernel"] is False and t["padding_free"] is False
    assert out["model"]["attn_implementation"] == "sdpa" and out["model"]["dtype"] == "float32"


def test_vision_language_model_uses_its_auto_class_and_serves_text_only():
    out = build(_spec("Qwen/Qwen2.5-VL-3B-Instruct", "grpo", prompts_per_step=8, group_size=4), device_kind="cuda", gpu="L40S")
    assert out["model"]["auto_class"] == "AutoModelForImageTextToText"
    assert out["model"]["lora"]["exclude_modules"]  # LoRA stays off the vision tower
    assert out["generation"]["backend"] == "vllm-colocate" and out["generation"]["language_model_only"] is True


def test_4bit_generates_with_transformers_and_sft_quantizes_too():
    grpo = build(_spec("Qwen/Qwen3-14B", "grpo", prompts_per_step=8, group_size=4), device_kind="cuda", gpu="RTX 4090")
    assert grpo["model"]["quantization_config"]["load_in_4bit"] is True
    assert grpo["trainer"]["use_vllm"] is False and grpo["generation"]["backend"] == "transformers"
    assert any("4-bit" in n for n in grpo["generation"]["notes"])
    assert grpo["memory"]["quant"] == "4bit" and grpo["memory"]["vllm_gb"] == 0
    sft = build(_spec("Qwen/Qwen3-14B", "sft", batch_size=8), device_kind="cuda", gpu="RTX 4090")
    assert sft["model"]["quantization_config"]["load_in_4bit"] is True and sft["memory"]["quant"] == "4bit"


def test_cpu_device_keeps_the_cpu_recipe():
    out = build(_spec("Qwen/Qwen3-0.6B", "sft"), device_kind="cpu")
    t = out["trainer"]
    assert t["use_cpu"] is True and t["bf16"] is False and not _ckpt(t)[0] and t["padding_free"] is False
    assert out["model"]["device_map"] is None and out["model"]["attn_implementation"] == "sdpa"


@pytest.mark.pod  # the command line, once, on the pod's pins: build() above runs in-process on both stacks
def test_command_line_prints_json(tmp_path):
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "autoslm.engine",
            "--print-config",
            "jobspecs/qwen3-0.6b-grpo-gpu.toml",
            "--device",
            "cuda",
            "--gpu",
            "H100 80GB",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["device"]["name"] == "H100 SXM" and out["model"]["attn_implementation"].endswith("flash-attn3")
    bad = subprocess.run(
        [sys.executable, "-m", "autoslm.engine", "--print-config", "jobspecs/qwen3-0.6b-grpo-gpu.toml", "--gpu", "GTX 9999"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert bad.returncode == 2 and "unknown GPU 'GTX 9999'" in bad.stderr and "Traceback" not in bad.stderr


def test_activation_checkpointing_only_where_memory_needs_it():
    small = build(_spec("Qwen/Qwen3-0.6B", "sft", batch_size=8, max_length=512), device_kind="cuda", gpu="H100 80GB")
    assert _ckpt(small["trainer"])[0] is False and small["memory"]["fits"] is True  # ~30% faster: no recompute
    big = build(_spec("Qwen/Qwen3-8B", "sft", batch_size=16, max_length=4096), device_kind="cuda", gpu="RTX 4090")
    assert _ckpt(big["trainer"])[0] is True
    asked = build(
        _spec("Qwen/Qwen3-0.6B", "sft", batch_size=8, max_length=512, gradient_checkpointing=True),
        device_kind="cuda",
        gpu="H100 80GB",
    )
    assert _ckpt(asked["trainer"])[0] is True
