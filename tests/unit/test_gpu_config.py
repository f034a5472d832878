"""GPU readiness (with an injected probe), diagnostics, and the generation / LoRA / 4-bit config paths."""

from __future__ import annotations

import dataclasses
import re
import subprocess

import pytest

from autoslm.catalog import MODELS, model_info
from autoslm.engine.train.gpu import (
    VISION_EXCLUDE_REGEX,
    gpu_diagnostics,
    grpo_generation_config,
    lora_config_kwargs,
    quantization_config_kwargs,
    wait_for_gpu,
)
from autoslm.errors import FatalWorkerError, WorkerError
from autoslm.recipes.generation import use_4bit
from autoslm.spec import validate_dict

pytestmark = pytest.mark.worker  # also runs on the worker image's pins (make test-image)


def spec(model="Qwen/Qwen3-0.6B", thinking=False, compute=None, **train):
    raw = {
        "name": "g",
        "model": model,
        "thinking": thinking,
        "environment": {"id": "autoslm/arith"},
        "train": {"method": "grpo", "prompts_per_step": 4, "group_size": 4, **train},
        **({"compute": compute, "artifacts": {"store": "hf", "repo": "a/b"}} if compute else {}),
    }
    return validate_dict(raw)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def test_wait_for_gpu_retries_until_a_kernel_runs():
    clock, calls = Clock(), []

    def probe():
        calls.append(1)
        if len(calls) < 4:
            raise RuntimeError("CUDA error: device not ready")

    assert wait_for_gpu(timeout_s=60, sleep=clock.sleep, probe=probe, clock=clock) is True
    assert len(calls) == 4 and 0 < clock.t < 60


def test_wait_for_gpu_gives_up_with_a_retryable_error():
    clock = Clock()

    def probe():
        raise RuntimeError("CUDA error: no kernel image")

    with pytest.raises(WorkerError) as err:
        wait_for_gpu(timeout_s=30, sleep=clock.sleep, probe=probe, clock=clock)
    assert not isinstance(err.value, FatalWorkerError)
    assert "30s" in str(err.value) and "no kernel image" in str(err.value)
    assert clock.t >= 30


def test_wait_for_gpu_is_a_no_op_without_cuda():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert wait_for_gpu(timeout_s=1) is False


def test_a_rented_gpu_pod_without_cuda_is_a_host_fault_not_a_cpu_run():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from autoslm.engine.pod.failures import is_retryable
    from autoslm.engine.train.gpu import rented_gpu

    rented = spec(compute={"provider": "runpod", "gpu": "RTX 4090", "gpu_count": 2})
    pod = {"RUNPOD_POD_ID": "p1"}
    asked = rented_gpu(rented, pod)
    assert asked == "a pod rented from RunPod for 2 x RTX 4090"
    assert rented_gpu(spec(), pod) is None  # a local run: this machine, whatever it has
    assert rented_gpu(rented, {**pod, "AUTOSLM_CPU_POD": "1"}) is None  # a test's fake pod, on this CPU
    assert rented_gpu(spec(compute={"provider": ["runpod", "vast"], "gpu": ["L40S", "RTX 4090"]}), {}) == (
        "a pod rented from RunPod or Vast for L40S or RTX 4090"
    )
    assert rented_gpu(spec(compute={"provider": "hfjobs", "gpu": "L4"}), {"JOB_ID": "j1"}).endswith("Jobs for L4")
    for diag, driver, need in (
        ({"torch": "2.9.0", "torch_cuda": "13.0", "driver": "550.54"}, "NVIDIA driver 550.54", "CUDA 13.0"),
        ({"torch": "2.9.0", "torch_cuda": None}, "no GPU (nvidia-smi is missing or found none)", "a CPU build"),
    ):
        with pytest.raises(WorkerError) as err:
            wait_for_gpu(timeout_s=1, asked=asked, diagnose=lambda d=diag: d)
        line = str(err.value)
        assert asked in line and driver in line and need in line and "no CUDA" in line, line
        assert is_retryable(err.value) and "relaunched" in err.value.hint
    # The real diagnostics of this machine (no CUDA) name what they find.
    with pytest.raises(WorkerError, match=f"torch {re.escape(torch.__version__)} needs"):
        wait_for_gpu(timeout_s=1, asked=asked)


def test_gpu_diagnostics_without_cuda_never_raises():
    def fake_run(*a, **k):
        raise FileNotFoundError("nvidia-smi")

    d = gpu_diagnostics(run=fake_run)
    assert "python" in d and isinstance(d["devices"], list)
    assert "driver" not in d

    def smi(*a, **k):
        return subprocess.CompletedProcess(a, 0, stdout="550.54.15, NVIDIA H100 80GB HBM3, 81559 MiB\n", stderr="")

    assert gpu_diagnostics(run=smi)["driver"] == "550.54.15"


# ---------------------------------------------------------------------------------------------------
# generation paths


def test_vllm_colocate_path():
    s = spec(vllm={"gpu_memory_utilization": 0.4, "sleep_mode": True}, max_length=1024, temperature=0.8)
    notes: list[str] = []
    kw = grpo_generation_config(s, MODELS["Qwen/Qwen3-0.6B"], has_cuda=True, has_vllm=True, notes=notes)
    assert kw["use_vllm"] is True and kw["vllm_mode"] == "colocate"
    assert kw["vllm_gpu_memory_utilization"] == 0.4
    assert kw["vllm_max_model_length"] == 1024
    assert kw["vllm_enable_sleep_mode"] is True
    assert kw["temperature"] == 0.8 and kw["max_completion_length"] == 128
    assert kw["chat_template_kwargs"] == {"enable_thinking": False}
    assert "use_cpu" not in kw and "bf16" not in kw  # precision comes from the common training args
    assert notes == ["colocated vLLM"]


@pytest.mark.parametrize(
    "model,cuda,vllm,multi_turn,why",
    [
        ("Qwen/Qwen3-0.6B", False, True, False, "no CUDA"),
        ("Qwen/Qwen3-0.6B", True, False, False, "not installed"),
        ("Qwen/Qwen3-14B", True, True, False, "4-bit"),  # vLLM 0.31 has no bitsandbytes: QLoRA generates with transformers
    ],
)
def test_transformers_path(model, cuda, vllm, multi_turn, why):
    notes: list[str] = []
    kw = grpo_generation_config(
        spec(model=model), MODELS[model], has_cuda=cuda, has_vllm=vllm, multi_turn=multi_turn, notes=notes
    )
    assert kw["use_vllm"] is False
    assert not any(k.startswith("vllm_") for k in kw)
    assert why in notes[-1]


def test_model_vllm_cannot_serve_generates_with_transformers():
    info = dataclasses.replace(MODELS["Qwen/Qwen3-0.6B"], vllm_ok=False)
    notes: list[str] = []
    assert grpo_generation_config(spec(), info, has_cuda=True, has_vllm=True, notes=notes)["use_vllm"] is False
    assert "cannot serve" in notes[-1]


@pytest.mark.parametrize(
    "enabled,cuda,vllm,want,why",
    [
        ("auto", True, True, True, "colocated vLLM"),
        ("auto", False, True, False, "no CUDA"),
        (True, False, True, True, "colocated vLLM on the CPU"),  # vLLM's CPU build
        (True, True, True, True, "colocated vLLM"),
        (True, False, False, False, "not installed"),  # the worker stops before this (grpo.check_vllm)
        (False, True, True, False, "enabled = false"),
        (False, False, True, False, "enabled = false"),
    ],
)
def test_vllm_enabled_decides_the_engine(enabled, cuda, vllm, want, why):
    notes: list[str] = []
    # A pod's spec: `validate` checks that vllm is installed only where the worker is this Python (local).
    pod = {"provider": "runpod", "gpu": ["RTX 4090"]}
    kw = grpo_generation_config(
        spec(model="autoslm/tiny", vllm={"enabled": enabled}, compute=pod),
        model_info("autoslm/tiny"),
        has_cuda=cuda,
        has_vllm=vllm,
        notes=notes,
    )
    assert kw["use_vllm"] is want and why in notes[0], notes
    if want and not cuda:
        assert kw["vllm_enable_sleep_mode"] is False  # vLLM refuses sleep mode on the CPU platform


def test_vllm_enabled_true_is_refused_where_vllm_cannot_serve(tmp_path):
    from autoslm.errors import SpecError
    from autoslm.spec import load_spec

    p = tmp_path / "q.toml"
    p.write_text(
        'name = "q"\nmodel = "Qwen/Qwen3-14B"\n[environment]\nid = "autoslm/arith"\n'
        '[train]\nmethod = "grpo"\nquantization = "4bit"\nvllm = { enabled = true }\n'
        '[compute]\nprovider = "runpod"\ngpu = ["RTX 4090"]\n[artifacts]\nstore = "hf"\nrepo = "a/b"\n'
    )
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert any(i.field == "train.vllm.enabled" for i in e.value.issues), e.value.issues


def test_multi_turn_drives_colocated_vllm():
    notes: list[str] = []
    kw = grpo_generation_config(spec(), MODELS["Qwen/Qwen3-0.6B"], has_cuda=True, has_vllm=True, multi_turn=True, notes=notes)
    assert kw["use_vllm"] is True and kw["vllm_mode"] == "colocate"
    assert any("turn by turn" in n for n in notes)


@pytest.mark.parametrize(
    "gpu_gib,util,micro,want_sleep", [(80.0, 0.3, None, False), (24.0, 0.35, None, False), (24.0, 0.7, 128, True)]
)
def test_sleep_mode_auto_only_when_training_and_vllm_do_not_both_fit(gpu_gib, util, micro, want_sleep):
    s = spec(
        prompts_per_step=32,
        group_size=8,
        max_length=512,
        max_completion_tokens=256,
        micro_batch_size=micro,
        vllm={"gpu_memory_utilization": util, "max_model_len": 768},
    )
    kw = grpo_generation_config(s, MODELS["Qwen/Qwen3-0.6B"], True, True, gpu_mem_gib=gpu_gib)
    assert kw["vllm_enable_sleep_mode"] is want_sleep


def test_vllm_context_never_shorter_than_training():
    kw = grpo_generation_config(spec(max_length=1024), MODELS["Qwen/Qwen3-0.6B"], True, True)
    assert kw["vllm_max_model_length"] == 1024


def test_unknown_hub_model_is_assumed_servable():
    kw = grpo_generation_config(spec(model="someone/some-model"), None, has_cuda=True, has_vllm=True)
    assert kw["use_vllm"] is True


def test_stop_strings_per_path():
    s = spec(stop=["\nUser:"])
    kw = grpo_generation_config(s, MODELS["Qwen/Qwen3-0.6B"], has_cuda=True, has_vllm=True)
    assert kw["generation_kwargs"] == {"stop": ["\nUser:"], "include_stop_str_in_output": True}
    assert kw["mask_truncated_completions"] is False
    kw = grpo_generation_config(s, MODELS["Qwen/Qwen3-0.6B"], has_cuda=False, has_vllm=False)
    assert "generation_kwargs" not in kw and kw["mask_truncated_completions"] is False
    assert grpo_generation_config(spec(), None, has_cuda=False, has_vllm=False)["mask_truncated_completions"] is True


def test_vision_language_model_on_vllm():
    notes: list[str] = []
    kw = grpo_generation_config(
        spec(model="Qwen/Qwen2.5-VL-3B-Instruct"), MODELS["Qwen/Qwen2.5-VL-3B-Instruct"], True, True, notes=notes
    )
    assert kw["use_vllm"] is True and kw["vllm_model_impl"] == "vllm"
    assert any("language_model_only" in n for n in notes)


def test_thinking_reaches_the_chat_template():
    kw = grpo_generation_config(spec(thinking=True), None, has_cuda=False, has_vllm=False)
    assert kw["chat_template_kwargs"] == {"enable_thinking": True}


def test_every_key_is_a_grpo_config_field(tmp_path):
    trl = pytest.importorskip("trl")
    fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    s = spec(stop=["###"])
    for cuda, vllm in [(True, True), (False, False)]:
        kw = grpo_generation_config(s, MODELS["Qwen/Qwen2.5-VL-3B-Instruct"], cuda, vllm)
        assert set(kw) <= fields, set(kw) - fields
    cfg = trl.GRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], **grpo_generation_config(spec(), None, False, False)
    )
    assert cfg.use_vllm is False and cfg.max_completion_length == 128


# ---------------------------------------------------------------------------------------------------
# LoRA and quantization


def test_lora_kwargs_text_model():
    kw = lora_config_kwargs(spec(lora_rank=8, lora_alpha=16, lora_targets=["q_proj", "v_proj"]), MODELS["Qwen/Qwen3-0.6B"])
    assert kw["r"] == 8 and kw["lora_alpha"] == 16 and kw["target_modules"] == ["q_proj", "v_proj"]
    assert "exclude_modules" not in kw


VISION_NAMES = [
    "model.visual.blocks.0.attn.qkv",
    "model.visual.merger.mlp.0",
    "visual.blocks.3.mlp.fc1",
    "model.vision_tower.vision_model.encoder.layers.0.self_attn.q_proj",
    "model.multi_modal_projector.linear_1",
    "model.vision_model.encoder.layers.1.mlp.fc2",
    "model.connector.modality_projection.proj",
]
TEXT_NAMES = [
    "model.language_model.layers.0.self_attn.q_proj",
    "model.layers.3.mlp.down_proj",
    "model.language_model.layers.10.mlp.gate_proj",
]


def test_lora_kwargs_vision_model_excludes_the_vision_tower():
    kw = lora_config_kwargs(spec(model="Qwen/Qwen2.5-VL-7B-Instruct"), MODELS["Qwen/Qwen2.5-VL-7B-Instruct"])
    assert kw["target_modules"] == "all-linear"
    pattern = kw["exclude_modules"]
    assert pattern == VISION_EXCLUDE_REGEX
    for name in VISION_NAMES:
        assert re.fullmatch(pattern, name), name
    for name in TEXT_NAMES:
        assert not re.fullmatch(pattern, name), name


def test_lora_kwargs_build_a_peft_config_that_skips_vision_modules():
    peft = pytest.importorskip("peft")
    torch = pytest.importorskip("torch")

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.visual = torch.nn.ModuleDict({"qkv": torch.nn.Linear(4, 4)})
            self.language_model = torch.nn.ModuleDict({"q_proj": torch.nn.Linear(4, 4)})

        def forward(self, x):
            return self.language_model["q_proj"](self.visual["qkv"](x))

    kw = lora_config_kwargs(
        spec(model="Qwen/Qwen2.5-VL-3B-Instruct", lora_targets=["qkv", "q_proj"]), MODELS["Qwen/Qwen2.5-VL-3B-Instruct"]
    )
    kw.pop("task_type")
    model = peft.get_peft_model(Tiny(), peft.LoraConfig(**kw))
    names = [n for n, _ in model.named_modules() if n.endswith("lora_A")]
    assert any("language_model" in n for n in names)
    assert not any("visual" in n for n in names)


@pytest.mark.parametrize(
    "model,quant,cuda,want",
    [
        ("Qwen/Qwen3-14B", "auto", True, True),  # the catalog says 4-bit
        ("Qwen/Qwen3-0.6B", "auto", True, False),
        ("Qwen/Qwen3-0.6B", "4bit", True, True),
        ("Qwen/Qwen3-14B", "none", True, False),
        ("Qwen/Qwen3-14B", "auto", False, False),  # CPU: auto stays unquantized
        ("Qwen/Qwen3-0.6B", "4bit", False, True),  # explicit 4-bit is honoured on CPU
        ("someone/unknown", "auto", True, False),
    ],
)
def test_quantization_tier(model, quant, cuda, want):
    s = spec(model=model, quantization=quant)
    info = MODELS.get(model)
    kw = quantization_config_kwargs(s, info, has_cuda=cuda)
    assert (kw is not None) == want
    if want:
        assert kw["load_in_4bit"] and kw["bnb_4bit_quant_type"] == "nf4"
        assert kw["bnb_4bit_compute_dtype"] == ("bfloat16" if cuda else "float32")
    assert use_4bit(s, info) == (quant == "4bit" or (quant == "auto" and info is not None and info.quant == "4bit"))


def test_quantized_vision_model_keeps_its_tower_in_full_precision():
    s = spec(model="Qwen/Qwen2.5-VL-7B-Instruct", quantization="4bit")
    kw = quantization_config_kwargs(s, MODELS["Qwen/Qwen2.5-VL-7B-Instruct"], has_cuda=True)
    assert "visual" in kw["llm_int8_skip_modules"] and "lm_head" in kw["llm_int8_skip_modules"]


def test_quantization_kwargs_build_a_bitsandbytes_config():
    transformers = pytest.importorskip("transformers")
    kw = quantization_config_kwargs(spec(model="Qwen/Qwen3-14B"), MODELS["Qwen/Qwen3-14B"], has_cuda=True)
    cfg = transformers.BitsAndBytesConfig(**kw)
    assert cfg.load_in_4bit and cfg.bnb_4bit_quant_type == "nf4"


def test_plan_says_what_generates_on_the_pod():
    from autoslm.catalog.spec_checks import recipe_summary

    pod = {"provider": "runpod", "gpu": ["RTX 4090"]}
    assert "rollouts: colocated vLLM" in recipe_summary(spec(compute=pod))
    off = recipe_summary(spec(compute=pod, vllm={"enabled": False}))
    assert "rollouts: train.vllm.enabled = false: generating with transformers" in off
