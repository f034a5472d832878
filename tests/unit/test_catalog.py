"""The catalog's tables and estimates: lookups, memory arithmetic, fit, time and cost.

.venv/bin/python -m pytest tests/unit/test_catalog.py -q
"""

from __future__ import annotations

import pytest

from autoslm import catalog
from autoslm.providers import VENDORS
from autoslm.recipes.grpo import GRPOTrain, VLLMConfig
from autoslm.recipes.sft import SFTTrain


@pytest.mark.parametrize("name", ["RTX 4090", "rtx4090", "NVIDIA GeForce RTX 4090", "rtx-4090"])
def test_gpu_lookup_accepts_our_name_and_vendor_ids(name):
    g = catalog.gpu_info(name)
    assert g is not None and g.name == "RTX 4090" and g.vram_gb == 24


def test_every_gpu_maps_both_ways():
    for g in catalog.GPUS.values():
        assert g.mem_gib <= g.vram_gb + 0.01
        for vendor_id, provider in (
            (VENDORS["runpod"].gpu_ids.get(g.name), "runpod"),
            (VENDORS["vast"].gpu_ids.get(g.name), "vast"),
        ):
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
    assert (
        catalog.vram_breakdown("Qwen/Qwen3-4B", SFTTrain(batch_size=8, lora_targets=["q_proj", "v_proj"])).lora_gb < base.lora_gb
    )
    # Micro-batching trades memory for accumulation.
    assert (
        catalog.vram_breakdown("Qwen/Qwen3-4B", SFTTrain(batch_size=8, micro_batch_size=2)).activations_gb < base.activations_gb
    )
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
    assert (
        catalog.fit_report("Qwen/Qwen3-4B", "L40S", asleep).need_gb < catalog.fit_report("Qwen/Qwen3-4B", "L40S", awake).need_gb
    )


def test_steps_from_the_train_section():
    assert catalog.train_steps(SFTTrain(max_steps=123)) == 123
    assert catalog.train_steps(SFTTrain(epochs=2, batch_size=16), n_examples=1000) == 125
    assert catalog.train_steps(GRPOTrain(epochs=1, prompts_per_step=8), n_examples=100) == 13
    assert catalog.train_steps(SFTTrain(epochs=1)) is None


def test_run_estimate_and_its_ceiling():
    est = catalog.estimate_run("Qwen/Qwen3-0.6B", "RTX 4090", GRPOTrain(max_steps=200), 0.5, max_hours=4)
    assert est.steps == 200 and est.hours > est.setup_s / 3600 > 0 and est.usd == pytest.approx(est.hours * 0.5)
    assert est.ceiling_usd == 2.0 and est.usd <= est.ceiling_usd
    faster = catalog.estimate_run("Qwen/Qwen3-0.6B", "H100 SXM", GRPOTrain(max_steps=200), 0.5, max_hours=4)
    assert faster.hours < est.hours
    capped = catalog.estimate_run("Qwen/Qwen3-8B", "RTX 3090", SFTTrain(max_steps=100000), 1.0, max_hours=3, max_usd=2.0)
    # Not cut at the limits (issue 42: a capped estimate hid a run its time limit would end): the real
    # estimate, and the ceiling the limits put on what it may cost.
    assert capped.hours > 3 and capped.usd == pytest.approx(capped.hours * 1.0) and capped.ceiling_usd == 2.0
    unknown = catalog.estimate_run("Qwen/Qwen3-0.6B", "RTX 4090", SFTTrain(epochs=1), 0.5, max_hours=2)
    assert unknown.usd is None and unknown.ceiling_usd == 1.0 and "unknown" in unknown.basis


def test_a_runs_time_counts_its_held_out_evaluations():
    """GSM8K's shape (jobspecs/qwen2.5-0.5b-gsm8k-grpo-gpu.toml as it was: 350 steps, [eval] every = 50):
    8 evaluations of the 1319 test problems, each a greedy and 4 sampled answers of up to 1024 tokens.
    Without vLLM (32 prompts a generate() call) one takes about two hours by the decode model that
    times a step's rollouts; the plan counts every one of them, in time and in money."""
    from autoslm.catalog.cost import decode_step_seconds, evaluation_seconds
    from autoslm.recipes.evaluation import EvalSpec, evaluation_count

    train = GRPOTrain(
        max_steps=350, prompts_per_step=64, group_size=5, max_completion_tokens=1024, max_length=1536, eval_samples=1319
    )
    ev = EvalSpec(every=50)
    assert evaluation_count(ev, train, 350) == 8  # at the start, steps 50..300, at the end
    assert evaluation_count(EvalSpec(every=50, at_start=False), train, 351) == 8 and evaluation_count(EvalSpec(), train, 350) == 2
    assert evaluation_count(ev, train.model_copy(update={"eval_samples": 0}), 350) == 0
    model, gpu = "Qwen/Qwen2.5-0.5B-Instruct", "L40S"
    info, g = catalog.model_info(model), catalog.gpu_info(gpu)
    one = evaluation_seconds(info, g, train, 1319, samples=4, vllm=False, quant="none")
    calls = -(-1319 // 32) + -(-1319 * 4 // 32)  # 42 greedy + 165 sampled generate() calls
    # Each call decodes its prompts together: the KV cache of 32 sequences at the mean context is read too.
    per_call = decode_step_seconds(info, g, vllm=False, quant="none", seqs=32, context=512 + 1024 / 2)
    assert one == pytest.approx(calls * 1024 * per_call, rel=0.05)
    assert 130 * 60 < one < 190 * 60  # the decode model with each call's KV reads and floor (was 90-130 min on weights alone)
    on_vllm = evaluation_seconds(info, g, train, 1319, samples=4, vllm=True, quant="none")
    assert on_vllm < one / 3  # 256 completions a call, each token cheaper (the per-step floor bounds the gain)
    assert (
        evaluation_seconds(info, g, train, 1319, samples=4, vllm=True, quant="none", concurrent=64) > on_vllm
    )  # less KV room: more waves

    kw = dict(max_hours=100, has_vllm=False)
    bare = catalog.estimate_run(model, gpu, train, 1.0, **kw)
    counted = catalog.estimate_run(model, gpu, train, 1.0, ev=ev, **kw)
    assert counted.evaluations == 8 and counted.eval_s == pytest.approx(one)
    assert counted.hours - bare.hours == pytest.approx(8 * one / 3600) and counted.usd > bare.usd + 15
    assert "350 steps x ~" in counted.basis and "+ 8 evaluations x ~" in counted.basis


def test_plan_counts_the_evaluations_a_spec_asks_for():
    from autoslm.controller.placement import judge_offer
    from autoslm.providers.base import Offer
    from autoslm.spec import parse_spec

    text = """
name = "gsm8k-like"
model = "Qwen/Qwen2.5-0.5B-Instruct"
[environment]
id = "autoslm/arith"
[train]
method = "grpo"
max_steps = 100
max_completion_tokens = 512
eval_samples = 1000
[eval]
every = 25
[compute]
provider = "runpod"
gpu = "L40S"
[artifacts]
store = "hf"
repo = "someone/runs"
[limits]
max_hours = 100
"""
    offer = Offer("runpod", "L40S", 1, 48, 1.0)
    counted = judge_offer(parse_spec(text), offer, has_vllm=False)
    bare = judge_offer(
        parse_spec(text.replace("eval_samples = 1000", "eval_samples = 0").replace("every = 25", "")), offer, has_vllm=False
    )
    assert counted.evaluations == 5 and counted.eval_s > 600
    assert counted.est_hours == pytest.approx(bare.est_hours + 5 * counted.eval_s / 3600, abs=0.02)
    assert counted.estimated_cost_usd > bare.estimated_cost_usd and "5 evaluations" in counted.note


def test_builtin_models_stay_what_the_spec_checks():
    assert (
        "autoslm/tiny" in catalog.BUILTIN_MODELS and catalog.model_info("autoslm/tiny").vllm_ok is True
    )  # head_dim 32: vLLM CPU attention serves it
    assert catalog.default_worker_image().startswith(catalog.WORKER_IMAGE_REPO + ":")


def test_the_four_a100s_are_distinct_and_a_name_that_fits_several_is_refused_with_the_choices(tmp_path):
    from autoslm.catalog import gpu_choices, gpu_id, gpu_info
    from autoslm.errors import SpecError
    from autoslm.spec import load_spec

    cards = {n: gpu_info(n) for n in ("A100 40GB PCIe", "A100 40GB SXM", "A100 80GB PCIe", "A100 80GB SXM")}
    assert len({g.name for g in cards.values()}) == 4 and [g.vram_gb for g in cards.values()] == [40, 40, 80, 80]
    assert gpu_info("NVIDIA A100-SXM4-80GB").name == "A100 80GB SXM" and gpu_info("a100 sxm4 40gb").name == "A100 40GB SXM"
    assert gpu_info("A100") is None and gpu_choices("A100") == [
        "A100 40GB PCIe",
        "A100 40GB SXM",
        "A100 80GB PCIe",
        "A100 80GB SXM",
    ]
    # Vast names both sizes alike; the memory an offer reports picks the card.
    assert gpu_info("A100 PCIE") is None and gpu_choices("A100 PCIE") == ["A100 40GB PCIe", "A100 80GB PCIe"]
    assert gpu_info("A100 PCIE", 40.0).name == "A100 40GB PCIe" and gpu_info("A100 PCIE", 80.0).name == "A100 80GB PCIe"
    assert gpu_id("vast", "A100 40GB SXM") == "A100 SXM4" and gpu_id("runpod", "A100 40GB SXM") is None
    assert gpu_id("runpod", "A100") is None and gpu_id("runpod", "Some Future GPU") == "Some Future GPU"
    path = tmp_path / "a100.toml"
    path.write_text(
        'name = "a"\nmodel = "autoslm/tiny"\n[environment]\nid = "autoslm/arith"\n[compute]\ngpu = ["RTX 4090", "A100"]\n'
    )
    with pytest.raises(
        SpecError,
        match='compute.gpu: .*\'A100\' names 4 cards: write one of "A100 40GB PCIe", "A100 40GB SXM", '
        '"A100 80GB PCIe", "A100 80GB SXM"',
    ):
        load_spec(str(path))
