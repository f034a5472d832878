"""The catalog's tables and estimates: lookups, memory arithmetic, fit, time and cost.

    .venv/bin/python -m pytest tests/unit/test_catalog.py -q
"""

from __future__ import annotations

import pytest

from autoslm import catalog
from autoslm.recipes.grpo import GRPOTrain, VLLMConfig
from autoslm.recipes.sft import SFTTrain


@pytest.mark.parametrize("name", ["RTX 4090", "rtx4090", "NVIDIA GeForce RTX 4090", "rtx-4090"])
def test_gpu_lookup_accepts_our_name_and_vendor_ids(name):
    g = catalog.gpu_info(name)
    assert g is not None and g.name == "RTX 4090" and g.vram_gb == 24


def test_every_gpu_maps_both_ways():
    for g in catalog.GPUS.values():
        assert g.mem_gib <= g.vram_gb + 0.01
        for vendor_id, provider in ((g.runpod_id, "runpod"), (g.vast_name, "vast")):
            if vendor_id is None:  # RunPod's catalog has no 40 GB A100
                assert provider == "runpod" and g.name.startswith("A100 40GB"), g.name
                continue
            # A name two cards share (Vast's "A100 PCIE") finds the card by the memory it reports.
            assert catalog.gpu_info(vendor_id, g.mem_gib) is g, (g.name, provider)
            assert catalog.gpu_id(provider, g.name) == vendor_id


def test_unknown_gpu_passes_through_to_the_vendor():
    assert catalog.gpu_info("Quantum 9000") is None
    assert catalog.gpu_id("runpod", "NVIDIA Quantum 9000") == "NVIDIA Quantum 9000"


def test_model_guess_from_the_id():
    assert catalog.guess_model_info("Qwen/Qwen3-4B") is catalog.MODELS["Qwen/Qwen3-4B"]
    seven = catalog.guess_model_info("someone/Mistral-7B-Instruct-v0.3")
    assert seven.estimated and seven.params_b == 7 and seven.hidden > 1000
    assert catalog.guess_model_info("someone/tiny-360M").params_b == pytest.approx(0.36)
    assert catalog.guess_model_info("someone/no-size-here") is None


def test_memory_grows_with_what_should_grow_it():
    base = catalog.vram_breakdown("Qwen/Qwen3-4B", SFTTrain(batch_size=8))
    assert catalog.vram_breakdown("Qwen/Qwen3-8B", SFTTrain(batch_size=8)).total_gb > base.total_gb
    assert catalog.vram_breakdown("Qwen/Qwen3-4B", SFTTrain(batch_size=16)).activations_gb > base.activations_gb
    assert catalog.vram_breakdown("Qwen/Qwen3-4B", SFTTrain(batch_size=8, max_length=2048)).activations_gb > base.activations_gb
    assert catalog.vram_breakdown("Qwen/Qwen3-4B", SFTTrain(batch_size=8, lora_rank=64)).lora_gb > base.lora_gb
    assert catalog.vram_breakdown("Qwen/Qwen3-4B", SFTTrain(batch_size=8, lora_targets=["q_proj", "v_proj"])).lora_gb < base.lora_gb
    # Micro-batching trades memory for accumulation.
    assert catalog.vram_breakdown("Qwen/Qwen3-4B", SFTTrain(batch_size=8, micro_batch_size=2)).activations_gb < base.activations_gb
    assert base.vllm_gb == 0 and base.total_gb == pytest.approx(base.train_gb)


def test_weights_follow_the_quantization_tier():
    full = catalog.vram_breakdown("Qwen/Qwen3-8B", GRPOTrain(quantization="none"))
    q4 = catalog.vram_breakdown("Qwen/Qwen3-8B", GRPOTrain(quantization="4bit"))
    assert full.quant == "none" and q4.quant == "4bit"
    assert full.weights_gb == pytest.approx(8.2e9 * 2 / catalog.GiB)
    assert q4.weights_gb < full.weights_gb / 3
    # "auto" takes the catalog's tier: 14B is a 4-bit model.
    assert catalog.quant_tier("Qwen/Qwen3-14B", GRPOTrain()) == "4bit"
    assert catalog.quant_tier("Qwen/Qwen3-14B", SFTTrain()) == "4bit"
    assert catalog.quant_tier("Qwen/Qwen3-4B", GRPOTrain()) == "none"


def test_grpo_adds_vllm_where_vllm_can_serve():
    est = catalog.vram_breakdown("Qwen/Qwen3-1.7B", GRPOTrain())
    assert est.vllm_gb > est.weights_gb and est.vllm_fraction is None  # "auto": sized per card
    assert not est.vllm_sleep  # "auto": decided per GPU by fit_report, not assumed
    assert catalog.vram_breakdown("Qwen/Qwen3-1.7B", GRPOTrain(quantization="4bit")).vllm_gb == 0  # no vLLM for QLoRA
    more_rollouts = catalog.vram_breakdown("Qwen/Qwen3-1.7B", GRPOTrain(prompts_per_step=32, group_size=8))
    # vLLM needs one request's KV at max_model_len to start; more rollouts only want more KV for speed.
    # Only its profiling sampler pass grows with them: 18 bytes x max_num_seqs x vocab, plus the Triton
    # top-k/top-p buffer of min(rows, 128) x vocab fp32 (vLLM 0.31 with processed_logprobs).
    vocab = catalog.model_info("Qwen/Qwen3-1.7B").vocab
    assert more_rollouts.vllm_gb - est.vllm_gb == pytest.approx((18 * (256 - 32) + 4 * (128 - 32)) * vocab / catalog.GiB)
    assert more_rollouts.vllm_kv_full_gb > est.vllm_kv_full_gb
    longer = catalog.vram_breakdown("Qwen/Qwen3-1.7B", GRPOTrain(max_length=4096))
    assert longer.vllm_gb > est.vllm_gb
    assert catalog.estimate_vram_gb("Qwen/Qwen3-1.7B", GRPOTrain()) == pytest.approx(est.total_gb)


def test_fits():
    assert catalog.fits("Qwen/Qwen3-0.6B", "RTX 4090") is True
    # Judged at the micro-batch the pod picks: 8B bf16 SFT runs 4 sequences a pass on a 4090; 14B bf16 cannot.
    assert catalog.fits("Qwen/Qwen3-8B", "RTX 4090", SFTTrain()) is True
    assert catalog.fit_report("Qwen/Qwen3-8B", "RTX 4090", SFTTrain()).micro == 4
    assert catalog.fits("Qwen/Qwen3-14B", "RTX 4090", SFTTrain(quantization="none")) is False
    assert catalog.fits("Qwen/Qwen3-8B", "H100 SXM", SFTTrain()) is True
    assert catalog.fits("Qwen/Qwen3-8B", 80.0, SFTTrain()) is True  # a bare size for a card the table lacks
    assert catalog.fits("someone/unknown", "RTX 4090") is None
    assert catalog.fits("Qwen/Qwen3-0.6B", "Quantum 9000") is None
    report = catalog.fit_report("Qwen/Qwen3-14B", "RTX 4090", SFTTrain(quantization="none"))
    assert report.ok is False and "RTX 4090" in report.reason and report.need_gb > 23 and report.micro == 1


def test_a_vllm_share_too_small_says_what_to_change():
    tight = GRPOTrain(vllm=VLLMConfig(gpu_memory_utilization=0.1))
    report = catalog.fit_report("Qwen/Qwen3-8B", "H100 SXM", tight)
    assert report.ok is False and "gpu_memory_utilization" in report.reason
    assert catalog.fits("Qwen/Qwen3-8B", "H100 SXM", GRPOTrain()) is True


def test_sleep_mode_lets_training_and_vllm_take_turns():
    awake = GRPOTrain(vllm=VLLMConfig(gpu_memory_utilization=0.5, sleep_mode=False))
    asleep = GRPOTrain(vllm=VLLMConfig(gpu_memory_utilization=0.5, sleep_mode=True))
    assert catalog.fit_report("Qwen/Qwen3-4B", "L40S", asleep).need_gb < catalog.fit_report("Qwen/Qwen3-4B", "L40S", awake).need_gb


def test_steps_from_the_train_section():
    assert catalog.train_steps(SFTTrain(max_steps=123)) == 123
    assert catalog.train_steps(SFTTrain(epochs=2, batch_size=16), n_examples=1000) == 125
    assert catalog.train_steps(GRPOTrain(epochs=1, prompts_per_step=8), n_examples=100) == 13
    assert catalog.train_steps(SFTTrain(epochs=1)) is None


def test_run_estimate_and_its_ceiling():
    est = catalog.estimate_run("Qwen/Qwen3-0.6B", "RTX 4090", GRPOTrain(max_steps=200), 0.5, max_hours=4)
    assert est.steps == 200 and est.hours > catalog.SETUP_HOURS and est.usd == pytest.approx(est.hours * 0.5)
    assert est.ceiling_usd == 2.0 and est.usd <= est.ceiling_usd
    faster = catalog.estimate_run("Qwen/Qwen3-0.6B", "H100 SXM", GRPOTrain(max_steps=200), 0.5, max_hours=4)
    assert faster.hours < est.hours
    capped = catalog.estimate_run("Qwen/Qwen3-8B", "RTX 3090", SFTTrain(max_steps=100000), 1.0, max_hours=3, max_usd=2.0)
    assert capped.hours == 3 and capped.usd == 2.0 and "max_hours" in capped.basis
    unknown = catalog.estimate_run("Qwen/Qwen3-0.6B", "RTX 4090", SFTTrain(epochs=1), 0.5, max_hours=2)
    assert unknown.usd is None and unknown.ceiling_usd == 1.0 and "unknown" in unknown.basis


def test_builtin_models_stay_what_the_spec_checks():
    assert "autoslm/tiny" in catalog.BUILTIN_MODELS and catalog.model_info("autoslm/tiny").vllm_ok is True  # head_dim 32: vLLM CPU attention serves it
    assert catalog.default_worker_image().startswith(catalog.WORKER_IMAGE_REPO + ":")


def test_the_four_a100s_are_distinct_and_a_name_that_fits_several_is_refused_with_the_choices(tmp_path):
    from autoslm.catalog import gpu_choices, gpu_id, gpu_info
    from autoslm.errors import SpecError
    from autoslm.spec import load_spec

    cards = {n: gpu_info(n) for n in ("A100 40GB PCIe", "A100 40GB SXM", "A100 80GB PCIe", "A100 80GB SXM")}
    assert len({g.name for g in cards.values()}) == 4 and [g.vram_gb for g in cards.values()] == [40, 40, 80, 80]
    assert gpu_info("NVIDIA A100-SXM4-80GB").name == "A100 80GB SXM" and gpu_info("a100 sxm4 40gb").name == "A100 40GB SXM"
    assert gpu_info("A100") is None and gpu_choices("A100") == ["A100 40GB PCIe", "A100 40GB SXM", "A100 80GB PCIe", "A100 80GB SXM"]
    # Vast names both sizes alike; the memory an offer reports picks the card.
    assert gpu_info("A100 PCIE") is None and gpu_choices("A100 PCIE") == ["A100 40GB PCIe", "A100 80GB PCIe"]
    assert gpu_info("A100 PCIE", 40.0).name == "A100 40GB PCIe" and gpu_info("A100 PCIE", 80.0).name == "A100 80GB PCIe"
    assert gpu_id("vast", "A100 40GB SXM") == "A100 SXM4" and gpu_id("runpod", "A100 40GB SXM") is None
    assert gpu_id("runpod", "A100") is None and gpu_id("runpod", "Some Future GPU") == "Some Future GPU"
    path = tmp_path / "a100.toml"
    path.write_text('name = "a"\nmodel = "autoslm/tiny"\n[environment]\nid = "autoslm/arith"\n[compute]\ngpu = ["RTX 4090", "A100"]\n')
    with pytest.raises(SpecError, match='compute.gpu: .*\'A100\' names 4 cards: write one of "A100 40GB PCIe", "A100 40GB SXM", '
                                        '"A100 80GB PCIe", "A100 80GB SXM"'):
        load_spec(str(path))
