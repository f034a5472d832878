"""The GPU recipe's decisions (engine/train/recipe.py), and the colocated-vLLM generate function the
multi-turn rollout and the evaluation drive on a GPU pod."""

from __future__ import annotations

import pytest

from autoslm.catalog import MODELS, vram_breakdown
from autoslm.engine.train.recipe import (
    FLASH_ATTN3_HUB,
    FLASH_ATTN_HUB,
    Device,
    attn_implementation,
    checkpointing_kwargs,
    cpu_threads,
    sft_micro_batch,
    use_bf16,
    use_liger,
    use_padding_free,
)
from autoslm.recipes.grpo import GRPOTrain
from autoslm.recipes.sft import SFTTrain

pytestmark = pytest.mark.worker

QWEN = MODELS["Qwen/Qwen3-0.6B"]
CPU = Device("cpu")


@pytest.mark.parametrize(
    "gpu,want",
    [
        ("RTX 3090", FLASH_ATTN_HUB),
        ("RTX 4090", FLASH_ATTN_HUB),
        ("A100 80GB SXM", FLASH_ATTN_HUB),
        ("H100 80GB", FLASH_ATTN3_HUB),
        ("H200", FLASH_ATTN3_HUB),
    ],
)
def test_attention_kernel_is_chosen_per_gpu(gpu, want):
    assert attn_implementation(SFTTrain(), QWEN, Device.assumed("cuda", gpu)) == want


def test_flash_attn_wheel_wins_and_cpu_or_old_gpus_use_sdpa():
    wheel = Device("cuda", "x", 80.0, (9, 0), frozenset({"flash_attn", "kernels"}))
    assert attn_implementation(SFTTrain(), QWEN, wheel) == "flash_attention_2"
    assert attn_implementation(SFTTrain(), QWEN, CPU) == "sdpa"
    assert attn_implementation(SFTTrain(), QWEN, Device("cuda", "T4", 15.0, (7, 5), frozenset({"kernels"}))) == "sdpa"
    vl = MODELS["Qwen/Qwen2.5-VL-3B-Instruct"]
    assert attn_implementation(SFTTrain(), vl, Device.assumed("cuda", "H100 80GB")) == FLASH_ATTN_HUB  # FA3 not for vision towers


def test_hub_kernels_package_is_a_version_transformers_accepts():
    """The image pins ``kernels`` for flash attention; transformers silently ignores a version outside
    its range, which would turn padding-free SFT off on every pod."""
    from autoslm.engine.train.gpu import installed
    from autoslm.engine.train.recipe import kernels_usable

    if not installed("kernels"):
        pytest.skip("kernels is not installed in this stack (the worker image pins it: make test-image)")
    assert kernels_usable()
    assert Device.detect().has("kernels")


def test_the_built_in_model_trains_on_one_cpu_thread_and_others_keep_torchs_default():
    # One fixed count: faster under load, and the same reduction order on any machine.
    assert cpu_threads(MODELS["autoslm/tiny"], CPU) == 1
    assert cpu_threads(QWEN, CPU) is None
    assert cpu_threads(None, CPU) is None  # an unknown model: could be large
    assert cpu_threads(MODELS["autoslm/tiny"], Device("cuda", "H100", 80.0, (9, 0))) is None


def test_padding_free_follows_the_kernel_and_the_spec():
    assert use_padding_free(SFTTrain(), FLASH_ATTN_HUB) is True
    assert use_padding_free(SFTTrain(), "sdpa") is False
    assert use_padding_free(SFTTrain(padding_free=False), FLASH_ATTN_HUB) is False
    assert use_padding_free(SFTTrain(padding_free=True), "sdpa") is False  # would corrupt attention: never
    assert use_padding_free(GRPOTrain(), FLASH_ATTN_HUB) is False


def test_precision_checkpointing_and_liger_defaults():
    gpu = Device.assumed("cuda", "RTX 4090")
    assert use_bf16(SFTTrain(), gpu) and not use_bf16(SFTTrain(), CPU) and not use_bf16(SFTTrain(bf16=False), gpu)
    assert not use_bf16(SFTTrain(bf16=True), Device("cuda", "V100", 16.0, (7, 0)))  # no bf16 on that card
    on = checkpointing_kwargs(SFTTrain(), gpu)
    key = next(k for k in on if not k.endswith("_kwargs"))
    assert on[key] is True and on[f"{key}_kwargs"] == {"use_reentrant": False}
    assert checkpointing_kwargs(SFTTrain(), CPU) == {key: False}
    assert checkpointing_kwargs(SFTTrain(gradient_checkpointing=False), gpu) == {key: False}
    assert use_liger(SFTTrain(), QWEN, gpu) and not use_liger(SFTTrain(liger_kernel=False), QWEN, gpu)
    assert not use_liger(SFTTrain(), QWEN, CPU) and not use_liger(SFTTrain(), MODELS["autoslm/tiny"], gpu)
    # GRPO: TRL's own fused LM head, and use_liger_kernel deprecated there (TRL 1.16 warns, TRL 2 drops it).
    assert not use_liger(GRPOTrain(), QWEN, gpu) and not use_liger(GRPOTrain(liger_kernel=True), QWEN, gpu)


def test_sft_micro_batch_is_sized_from_memory_and_divides_the_batch():
    train = SFTTrain(batch_size=128, max_length=4096)
    small = sft_micro_batch(train, MODELS["Qwen/Qwen3-4B"], Device.assumed("cuda", "RTX 4090"))
    big = sft_micro_batch(train, MODELS["Qwen/Qwen3-4B"], Device.assumed("cuda", "H200"))
    assert 1 <= small < big and 128 % small == 0 and 128 % big == 0
    est = vram_breakdown(MODELS["Qwen/Qwen3-4B"], train, micro=small)
    assert est.train_gb <= 24.0
    assert sft_micro_batch(SFTTrain(batch_size=16), QWEN, CPU) == 16  # a CPU trains the whole batch at once
    assert sft_micro_batch(SFTTrain(batch_size=16, micro_batch_size=4), QWEN, Device.assumed("cuda", "H200")) == 4


def test_planner_follows_the_recipe():
    t = SFTTrain(batch_size=16, max_length=2048)
    on = vram_breakdown(QWEN, t)
    off = vram_breakdown(QWEN, SFTTrain(batch_size=16, max_length=2048, gradient_checkpointing=False))
    assert off.activations_gb > 3 * on.activations_gb  # every layer's working set kept without recompute
    sft_4bit = vram_breakdown(MODELS["Qwen/Qwen3-14B"], SFTTrain())
    assert sft_4bit.quant == "4bit"  # SFT honours train.quantization like GRPO
    assert vram_breakdown(MODELS["Qwen/Qwen3-14B"], SFTTrain(quantization="none")).quant == "none"


def test_plan_says_how_a_4bit_run_generates():
    from autoslm.catalog.spec_checks import recipe_summary
    from autoslm.spec import validate_dict

    def spec(model, method="grpo"):
        return validate_dict(
            {
                "name": "p",
                "model": model,
                "environment": {"id": "autoslm/arith"},
                "train": {"method": method, "max_steps": 2},
                "compute": {"provider": "runpod", "gpu": "RTX 4090"},
                "artifacts": {"store": "hf", "repo": "someone/runs"},
            }
        )

    assert recipe_summary(spec("Qwen/Qwen3-14B")) == (
        "on the pod: 4-bit QLoRA; rollouts: 4-bit QLoRA: vLLM cannot load bitsandbytes weights, generating with transformers"
    )
    assert recipe_summary(spec("Qwen/Qwen3-0.6B")) == "on the pod: bf16 LoRA; rollouts: colocated vLLM"
    assert recipe_summary(spec("Qwen/Qwen3-14B", "sft")) == "on the pod: 4-bit QLoRA"


# ---------------------------------------------------------------------------------------------------
# Colocated vLLM as a GenerateFn. vLLM needs CUDA, so this stands in for TRL's VLLMGeneration object:
# the same attributes and generate() signature as trl 1.16's (prompts, images, num_generations).


class _VLLMGeneration:
    def __init__(self):
        self.max_completion_length, self.temperature = 64, 1.0
        self.synced, self.calls = 0, []

    def sync_weights(self):
        self.synced += 1

    def generate(self, prompts, images, num_generations):
        self.calls.append((self.max_completion_length, self.temperature, prompts))
        ids = [[7] * min(3, self.max_completion_length) for _ in prompts]
        return prompts, ids, [[[-0.5]] * len(i) for i in ids], None


class _State:
    global_step = 0


class _Trainer:
    use_vllm = True

    def __init__(self):
        self.vllm_generation, self.state, self._last_loaded_step = _VLLMGeneration(), _State(), -1


def test_vllm_generate_syncs_once_per_step_and_restores_settings():
    from autoslm.engine.rollout.generators import rollout_generate, vllm_generate

    trainer = _Trainer()
    gen = rollout_generate(trainer)
    out = gen([[1, 2], [3]], 2)
    assert out == [([7, 7], [-0.5, -0.5]), ([7, 7], [-0.5, -0.5])]
    gen([[1]], 5)
    assert trainer.vllm_generation.synced == 1  # same step: weights already there
    trainer.state.global_step = 1
    greedy = vllm_generate(trainer, temperature=0.0)
    greedy([[1]], 4)
    vg = trainer.vllm_generation
    assert vg.synced == 2 and vg.calls[-1][:2] == (4, 0.0)
    assert (vg.max_completion_length, vg.temperature) == (64, 1.0)  # TRL's own settings are left as they were


def test_a_constant_schedule_keeps_its_warm_up():
    from autoslm.engine.train.training_args import scheduler_type

    # transformers' "constant" has no warm-up: asked for one, the run gets "constant_with_warmup".
    assert scheduler_type(GRPOTrain(lr_scheduler="constant", warmup_ratio=0.1)) == "constant_with_warmup"
    assert scheduler_type(GRPOTrain(lr_scheduler="constant")) == "constant"
    assert scheduler_type(GRPOTrain(lr_scheduler="cosine", warmup_ratio=0.1)) == "cosine"
