"""`autoslm plan`, `python -m autoslm.engine --print-config` and the worker say the same memory, micro-batch,
generation batch and decode waves (one function: catalog.fit_report), and a CUDA out-of-memory error
while generating ends the run with its numbers instead of being retried on new pods."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from autoslm import catalog
from autoslm.controller.placement import judge_offer
from autoslm.engine.pod.failures import is_retryable
from autoslm.engine.train.print_config import build, pod_device
from autoslm.errors import FatalWorkerError
from autoslm.providers.base import Offer
from autoslm.spec import load_spec

pytestmark = pytest.mark.worker
REPO = Path(__file__).resolve().parents[2]
GPU_JOBSPECS = sorted(p for p in (REPO / "jobspecs").glob("*.toml") if load_spec(p).compute.providers != ["local"])


def _offer(spec, gpu: str) -> Offer:
    return Offer("runpod", gpu, spec.compute.gpu_count, catalog.gpu_info(gpu).vram_gb, 0.5)


@pytest.mark.parametrize("path", GPU_JOBSPECS, ids=lambda p: p.name)
def test_plans_need_is_the_peak_print_config_shows_for_the_shipped_gpu_jobspecs(path):
    spec = load_spec(path)
    assert spec.compute.gpus
    for gpu in spec.compute.gpus:
        planned = judge_offer(spec, _offer(spec, gpu))
        out = build(spec, device_kind="cuda", gpu=gpu)
        mem, trainer = out["memory"], out["trainer"]
        print(
            f"{path.name} {gpu}: plan {planned.vram_need_gb} GB, --print-config {mem['peak_gb']} GB, micro "
            f"{planned.micro_batch}/{trainer['per_device_train_batch_size']}, waves {planned.waves}/{mem['waves']}"
        )
        assert planned.vram_need_gb == pytest.approx(mem["peak_gb"], abs=0.1)
        assert planned.fits is mem["fits"] and planned.waves == mem["waves"]
        assert planned.micro_batch == mem["micro_batch"] == trainer["per_device_train_batch_size"]
        if spec.train.method == "grpo":
            assert planned.step_s == pytest.approx(mem["step_s"], abs=0.1)
            assert planned.vllm_util == trainer["vllm_gpu_memory_utilization"] == mem["vllm_util"]


def _no_vllm_spec(tmp_path):
    text = (REPO / "jobspecs" / "qwen3-0.6b-grpo-gpu.toml").read_text()
    path = tmp_path / "no-vllm.toml"
    path.write_text(text.replace('gpu = ["RTX 4090", "RTX 3090", "L4"]', 'gpu = "RTX 4090"'))
    spec = load_spec(path)
    t = spec.train.model_copy(
        update=dict(
            prompts_per_step=16,
            group_size=8,
            max_length=2048,
            max_completion_tokens=1536,
            vllm=spec.train.vllm.model_copy(update={"max_model_len": 2048}),
        )
    )
    return spec.model_copy(update={"train": t})


def test_without_vllm_plan_print_config_and_the_worker_agree_on_the_split_generation_batch(tmp_path):
    from autoslm.engine.train.grpo import grpo_config_kwargs

    spec = _no_vllm_spec(tmp_path)
    planned = judge_offer(spec, _offer(spec, "RTX 4090"), has_vllm=False)
    out = build(spec, device_kind="cuda", gpu="RTX 4090", vllm=False)
    mem, trainer, gen = out["memory"], out["trainer"], out["generation"]
    assert gen["backend"] == "transformers" and trainer["use_vllm"] is False
    assert planned.fits is mem["fits"] is True, (planned.note, mem)
    assert planned.vram_need_gb == pytest.approx(mem["peak_gb"], abs=0.1)
    rounds = mem["generation_rounds"]
    assert rounds > 1 and planned.waves == mem["waves"] == rounds
    # TRL generates (per process) per_device_train_batch_size x steps_per_generation completions at a time.
    per_call = trainer["per_device_train_batch_size"] * trainer["steps_per_generation"]
    assert per_call == mem["generation_batch"] == planned.generation_batch == 128 // rounds
    assert trainer["gradient_accumulation_steps"] == trainer["steps_per_generation"] * rounds
    assert mem["generate_kv_gb"] == pytest.approx(
        per_call * 2048 * catalog.kv_bytes_per_token(catalog.model_info(spec.model)) / catalog.GiB, abs=0.01
    )
    assert any(f"in {rounds} rounds" in n for n in gen["notes"])
    # The worker, on a device whose packages lack vllm, builds the same configuration.
    device = pod_device(spec, "cuda", "RTX 4090", vllm=False)
    kwargs, plan = grpo_config_kwargs(spec, device, seed=0, output_dir=tmp_path, max_steps=10)
    assert kwargs["steps_per_generation"] == trainer["steps_per_generation"]
    assert kwargs["per_device_train_batch_size"] == trainer["per_device_train_batch_size"]
    assert plan.generation_batch_size == 128 // rounds
    # With vLLM on the pod, the same spec is sized for vLLM, generating the step at once.
    with_vllm = build(spec, device_kind="cuda", gpu="RTX 4090")
    assert with_vllm["generation"]["backend"] == "vllm-colocate" and with_vllm["memory"]["generation_rounds"] == 1


@pytest.mark.pod  # a process of its own, once, on the pod's pins
def test_print_config_says_the_waves_and_takes_no_vllm():
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "autoslm.engine",
            "--print-config",
            "jobspecs/qwen3-0.6b-grpo-gpu.toml",
            "--gpu",
            "RTX 4090",
            "--no-vllm",
        ],
        capture_output=True,
        text=True,
        cwd=str(REPO),
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["generation"]["backend"] == "transformers" and "vllm" not in out["device"]["packages"]
    assert out["memory"]["engine"] == "transformers" and out["memory"]["waves"] >= 1 and out["memory"]["step_s"] > 0


class OutOfMemoryError(RuntimeError):
    """Stands in for torch.cuda.OutOfMemoryError (recognised by its class name)."""


def test_a_cuda_oom_while_generating_is_fatal_and_names_the_numbers(tmp_path):
    from autoslm.engine.train.grpo import generation_oom_error
    from autoslm.engine.train.trainer import generation_oom_fatal
    from autoslm.recipes.batching import plan_grpo_batches

    spec = _no_vllm_spec(tmp_path)
    device = pod_device(spec, "cuda", "RTX 4090", vllm=False)
    plan = plan_grpo_batches(spec.train.model_copy(update={"micro_batch_size": 8}), 1, 2)

    def generate_and_score(inputs):
        if inputs == "boom":
            raise ValueError("not memory")
        raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    oom = functools.partial(generation_oom_error, spec, device, plan, "transformers")

    def guarded(inputs):  # as AutoslmGRPOTrainer._generate_and_score_completions guards its steps
        with generation_oom_fatal(oom, len(inputs)):
            return generate_and_score(inputs)

    with pytest.raises(FatalWorkerError) as err:
        guarded(list(range(64)))
    msg = str(err.value)
    assert "CUDA out of memory while generating 64 completions of up to 2048 tokens with transformers on RTX 4090" in msg
    assert "generation batch 64 per process" in msg and "planner estimated" in msg
    assert is_retryable(err.value) is False
    with pytest.raises(ValueError):  # anything else passes through as it was
        guarded("boom")
