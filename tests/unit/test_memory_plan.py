"""The planner's one answer (catalog.fit_report) over (model, GPU, method) pairs: the share "auto" gives
vLLM, the KV room as a fraction of a step's rollouts, the decode waves and the step time they imply;
where a run fits only with a warning naming its waves, where it is refused with the least it would
need; and GRPO on a pod without vLLM, whose generation batch is split until generate()'s KV cache fits.

The GRPO shape is jobspecs/qwen3-0.6b-grpo-gpu.toml's (32 prompts x 8 completions, 512 tokens, 256 of
them completion, max_model_len 768, share "auto") with the model and the length swapped in.
"""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path

import pytest

from autoslm import catalog
from autoslm.controller.placement import judge_offer
from autoslm.providers.base import Offer
from autoslm.spec import load_spec

REPO = Path(__file__).resolve().parents[2]
GRPO_JOBSPEC = REPO / "jobspecs" / "qwen3-0.6b-grpo-gpu.toml"
SFT_JOBSPEC = REPO / "jobspecs" / "qwen3-0.6b-sft-gpu.toml"


def jobspec(
    tmp_path,
    model: str,
    max_length: int = 512,
    path: Path = GRPO_JOBSPEC,
    gpu: str = "H100 80GB",
    extra: str = "",
    roomy: bool = False,
):
    """The GRPO jobspec at another model, length or GPU (``roomy``: limits no estimate here passes, for a
    test of memory alone: a larger model's run would pass the jobspec's own limits and be unusable)."""
    text = path.read_text().replace('model = "Qwen/Qwen3-0.6B"', f'model = "{model}"')
    if roomy:
        text = re.sub(r"(?m)^max_hours = .*$", "max_hours = 300", text)
        text = re.sub(r"(?m)^max_usd = .*$", "max_usd = 1000", text)
    text = text.replace("max_length = 512", f"max_length = {max_length}")
    text = text.replace("max_model_len = 768", f"max_model_len = {max(768, max_length)}")
    text = text.replace('gpu = ["RTX 4090", "RTX 3090", "L4"]', f'gpu = "{gpu}"')
    text = text.replace("[compute]", f"{extra}\n[compute]") if extra else text
    out = tmp_path / f"{model.split('/')[-1]}-{max_length}-{gpu.replace(' ', '_')}.toml"
    out.write_text(text)
    return load_spec(out)


# (model, GPU, method, max_length) -> (fits, decode waves, sleep mode); SFT rows: waves 0.
TABLE = [
    ("Qwen/Qwen3-0.6B", "RTX 4090", "grpo", 512, True, 1, False),
    ("Qwen/Qwen3-0.6B", "L4", "grpo", 2048, True, 4, False),
    ("Qwen/Qwen3-0.6B", "H100 80GB", "grpo", 512, True, 1, False),
    ("Qwen/Qwen3-0.6B", "H200", "grpo", 2048, True, 1, False),
    ("Qwen/Qwen3-1.7B", "RTX 4090", "grpo", 512, True, 2, False),
    ("Qwen/Qwen3-1.7B", "L40S", "grpo", 2048, True, 2, False),
    ("Qwen/Qwen3-1.7B", "H100 80GB", "grpo", 2048, True, 1, False),
    ("Qwen/Qwen3-4B", "L4", "grpo", 512, False, 10, True),  # its share at the floor would eat the headroom
    ("Qwen/Qwen3-4B", "RTX 4090", "grpo", 512, True, 7, False),
    ("Qwen/Qwen3-4B", "L40S", "grpo", 512, True, 1, False),
    ("Qwen/Qwen3-4B", "H100 80GB", "grpo", 2048, True, 2, False),
    ("Qwen/Qwen3-4B", "H200", "grpo", 512, True, 1, False),
    ("Qwen/Qwen3-8B", "L40S", "grpo", 512, True, 4, False),
    ("Qwen/Qwen3-8B", "L40S", "grpo", 2048, False, 10, True),  # as 4B on an L4
    ("Qwen/Qwen3-8B", "H100 80GB", "grpo", 512, True, 1, False),
    ("Qwen/Qwen3-8B", "H200", "grpo", 2048, True, 1, False),
    ("Qwen/Qwen3-8B", "RTX 4090", "grpo", 512, False, 10, True),
    ("Qwen/Qwen3-0.6B", "L4", "sft", 512, True, 0, False),
    ("Qwen/Qwen3-8B", "RTX 4090", "sft", 512, True, 0, False),
]


@pytest.mark.parametrize("model,gpu,method,max_length,fits,waves,sleep", TABLE)
def test_the_plan_table(tmp_path, model, gpu, method, max_length, fits, waves, sleep):
    spec = jobspec(tmp_path, model, max_length, GRPO_JOBSPEC if method == "grpo" else SFT_JOBSPEC)
    g = catalog.gpu_info(gpu)
    fit = catalog.fit_report(spec.model, g, spec.train)
    step = catalog.step_seconds(spec.model, g, spec.train, waves=max(1, fit.waves))
    print(
        f"{model:16} {gpu:10} {method} {max_length:5}: fits {fit.ok}, share {fit.vllm_util}, KV room "
        f"{fit.kv_fraction if fit.kv_fraction is None else round(fit.kv_fraction, 2)} of a step, {fit.waves} waves, "
        f"micro {fit.micro}, sleep {fit.sleep_mode}, step ~{step:.1f} s, peak {fit.need_gb:.1f} GiB"
    )
    assert (fit.ok, fit.waves, fit.sleep_mode) == (fits, waves, sleep), (fit.reason, fit.note)
    have = g.mem_gib * 0.97
    if not fits:
        return
    assert (
        fit.need_gb <= have and fit.micro and spec.train.prompts_per_step * spec.train.group_size % fit.micro == 0
        if method == "grpo"
        else fit.need_gb <= have
    )
    if method == "sft":
        assert fit.vllm_util is None and fit.kv_fraction is None
        return
    est = fit.estimate
    # The share "auto" set: vLLM's need before KV + the KV room it reports, within the 0.01 rounding.
    fixed = est.vllm_gb - est.vllm_kv_gb
    assert fit.share_gb == pytest.approx(g.mem_gib * fit.vllm_util) and fit.vllm_util <= catalog.VLLM_MAX_AUTO_SHARE
    room = fit.share_gb - fixed
    assert fit.kv_fraction == pytest.approx(min(1.0, room / est.vllm_kv_full_gb))
    assert fit.waves == max(1, math.ceil(est.vllm_kv_full_gb / room))
    assert room >= catalog.kv_floor_gb(est) * 0.999  # never under the minimum: 10% of a step, one request
    if fit.kv_fraction < 1:  # short of the whole step: the card is full but for the headroom (and rounding)
        left = (est.static_gb if fit.sleep_mode else est.train_gb) + fit.share_gb
        assert left >= have - catalog.vllm_headroom_gib(g.mem_gib) - 0.011 * g.mem_gib
    # The step time counts generation as its waves: each a full decode of its share of the rollouts.
    one = catalog.step_seconds(spec.model, g, spec.train, waves=1)
    gen = functools.partial(catalog.cost.generation_seconds, catalog.model_info(model), g, spec.train, vllm=True, quant="none")
    assert step == pytest.approx(one - gen(waves=1) + gen(waves=fit.waves))
    assert fit.waves == 1 or gen(waves=fit.waves) > gen(waves=1)
    # A note names the waves exactly where the KV room holds less than a quarter of a step.
    assert (f"~{fit.waves} waves" in fit.note) is (fit.kv_fraction < catalog.VLLM_KV_WARN)


@pytest.mark.parametrize("model", ["Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B", "Qwen/Qwen3-8B"])
@pytest.mark.parametrize("gpu", ["H100 80GB", "H200"])
def test_the_grpo_jobspec_decodes_a_step_in_one_or_two_waves_on_h100_and_h200(tmp_path, model, gpu):
    spec = jobspec(tmp_path, model, gpu=gpu)
    fit = catalog.fit_report(spec.model, gpu, spec.train)
    assert fit.ok and fit.waves in (1, 2) and not fit.sleep_mode, fit


def test_4b_on_a_4090_and_1_7b_at_2k_fit_with_a_warning_naming_their_waves(tmp_path):
    for model, gpu, max_length in (("Qwen/Qwen3-4B", "RTX 4090", 512), ("Qwen/Qwen3-1.7B", "RTX 4090", 2048)):
        spec = jobspec(tmp_path, model, max_length, gpu=gpu, roomy=True)
        offer = judge_offer(spec, Offer("runpod", gpu, 1, catalog.gpu_info(gpu).vram_gb, 0.5))
        assert offer.fits and offer.usable and offer.waves >= 5, offer
        assert f"decodes each step in ~{offer.waves} waves" in offer.note, offer.note
        assert 0.1 <= offer.kv_fraction < 0.25


GRID_MODELS = ["Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B", "Qwen/Qwen3-8B", "Qwen/Qwen3-14B"]
GRID_GPUS = ["L4", "RTX 4090", "RTX 3090", "L40S", "A100 40GB PCIe", "A100 80GB PCIe", "H100 80GB", "H200"]


@pytest.mark.parametrize("max_length", [512, 1024, 2048])
def test_a_fitting_auto_share_keeps_the_headroom_on_every_card(tmp_path, max_length):
    """ "auto" promises ``vllm_headroom_gib`` of the card to nobody. At its floor (one max_model_len request
    and 10% of a step) the share used to take it anyway: 8B on an A100 40GB kept 0.05 GiB of 1.58, 4B
    on an L4 0.13 of 1.00. Either the headroom is left, or the offer is refused with what it would need."""
    for model in GRID_MODELS:
        spec = jobspec(tmp_path, model, max_length)
        for gpu in GRID_GPUS:
            g = catalog.gpu_info(gpu)
            fit = catalog.fit_report(spec.model, g, spec.train)
            if fit.engine != "vllm":
                continue  # the 4-bit tier generates with transformers: no vLLM share
            if not fit.ok:
                assert "headroom" in fit.reason, (model, gpu, fit.reason)
                continue
            est = fit.estimate
            awake = (est.static_gb if fit.sleep_mode else est.train_gb) + fit.share_gb
            margin = g.mem_gib * 0.97 - awake
            assert margin >= catalog.vllm_headroom_gib(g.mem_gib) - 1e-6, (model, gpu, max_length, margin, fit)
    # The two the planner used to pass: now refused, each naming the least card that keeps the headroom.
    for model, gpu, max_length in (("Qwen/Qwen3-8B", "A100 40GB PCIe", 2048), ("Qwen/Qwen3-4B", "L4", 512)):
        spec = jobspec(tmp_path, model, max_length)
        fit = catalog.fit_report(spec.model, gpu, spec.train)
        assert fit.ok is False and "headroom" in fit.reason, (model, gpu, fit)


def test_below_the_minimum_it_is_refused_with_the_least_it_would_need(tmp_path):
    spec = jobspec(tmp_path, "Qwen/Qwen3-4B", 2048, gpu="RTX 4090")
    fit = catalog.fit_report(spec.model, "RTX 4090", spec.train)
    assert fit.ok is False
    least = float(fit.reason.split("needs at least ~")[1].split(" GiB")[0])
    assert least > catalog.gpu_info("RTX 4090").mem_gib * 0.97
    assert "one max_model_len request and 10% of a step's rollouts" in fit.reason and "RTX 4090 has" in fit.reason
    # Give it that much (a card of the size it names): it fits.
    assert catalog.fit_report(spec.model, least / 0.97 + 0.1, spec.train).ok is True


def test_a_hand_set_share_is_taken_as_it_is_and_warns_below_a_quarter(tmp_path):
    spec = jobspec(tmp_path, "Qwen/Qwen3-8B", 512, gpu="L40S")
    train = spec.train.model_copy(update={"vllm": spec.train.vllm.model_copy(update={"gpu_memory_utilization": 0.42})})
    fit = catalog.fit_report(spec.model, "L40S", train)
    assert fit.vllm_util == 0.42 and fit.share_gb == pytest.approx(0.42 * catalog.gpu_info("L40S").mem_gib)
    assert fit.kv_fraction < 0.25 and "raise train.vllm.gpu_memory_utilization" in fit.note


# -- transformers generation: a pod without vLLM -----------------------------------------------------

NO_VLLM = dict(prompts_per_step=16, group_size=8, max_length=2048, max_completion_tokens=1536)


def _no_vllm_spec(tmp_path, model="Qwen/Qwen3-0.6B"):
    spec = jobspec(tmp_path, model, 2048, gpu="RTX 4090")
    return spec.model_copy(update={"train": spec.train.model_copy(update=NO_VLLM)})


@pytest.mark.parametrize("model", ["Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B"])
def test_without_vllm_generates_kv_for_16x8_at_2048_tokens_is_split_until_it_fits_a_4090(tmp_path, model):
    spec = _no_vllm_spec(tmp_path, model)
    info = catalog.model_info(model)
    whole = 128 * 2048 * catalog.kv_bytes_per_token(info) / catalog.GiB
    assert whole > 24  # the whole step's KV cache alone is more than the card
    fit = catalog.fit_report(spec.model, "RTX 4090", spec.train, has_vllm=False)
    assert fit.engine == "transformers" and fit.vllm_util is None and fit.share_gb == 0
    if fit.ok:
        assert fit.generation_rounds > 1 and fit.generation_batch * fit.generation_rounds == 128
        assert fit.generation_batch % 8 == 0 and fit.generation_batch % fit.micro == 0  # whole groups, whole micro-batches
        assert fit.estimate.generate_kv_gb == pytest.approx(whole / fit.generation_rounds)
        assert fit.need_gb <= catalog.gpu_info("RTX 4090").mem_gib * 0.97
        assert fit.waves == fit.generation_rounds and f"in {fit.generation_rounds} rounds" in fit.note
        # One round fewer would not fit: it is split only as far as it must be.
        bigger = catalog.vram_breakdown(
            info,
            spec.train,
            micro=fit.micro,
            checkpointing=fit.checkpointing,
            vllm=False,
            generation_batch=fit.generation_batch * 2,
        )
        assert fit.generation_rounds == 1 or bigger.train_gb > catalog.gpu_info("RTX 4090").mem_gib * 0.97
    else:
        assert "transformers generation needs" in fit.reason and "GiB" in fit.reason
    # The same run with vLLM on the pod is sized for vLLM instead.
    assert catalog.fit_report(spec.model, "RTX 4090", spec.train, has_vllm=True).engine == "vllm"


def test_plan_follows_the_pods_package_set(tmp_path):
    spec = _no_vllm_spec(tmp_path)
    offer = Offer("runpod", "RTX 4090", 1, 24, 0.5)
    without = judge_offer(spec, offer, has_vllm=False)
    with_vllm = judge_offer(spec, offer, has_vllm=True)
    assert without.generation == "transformers" and with_vllm.generation == "vllm"
    assert without.waves > 1 and without.step_s > with_vllm.step_s  # slower decode, in more rounds
    fit = catalog.fit_report(spec.model, "RTX 4090", spec.train, has_vllm=False)
    assert without.vram_need_gb == round(fit.need_gb, 1) and without.generation_batch == fit.generation_batch


def test_the_pods_package_set_decides_vllm_per_provider():
    from autoslm.controller import images

    spec = load_spec(GRPO_JOBSPEC)
    off = spec.model_copy(
        update={"train": spec.train.model_copy(update={"vllm": spec.train.vllm.model_copy(update={"enabled": False})})}
    )
    for provider in ("runpod", "vast"):
        assert images.pod_vllm(spec, provider, exists=lambda ref: False) is images.pod_packages(spec, provider, "bootstrap").vllm
    assert images.pod_vllm(off, "runpod", exists=lambda ref: False) is False
    assert images.pod_vllm(spec, "runpod", exists=lambda ref: True) is True  # the published image has it


def test_the_sampler_term_against_a_hand_computation():
    # vLLM 0.31, processed_logprobs, 256 rows of Qwen3's 151936-entry vocabulary: bf16 logits (2 B), their fp32
    # copy (4 B), log_softmax (4 B), softmax (4 B) and the exponential noise (4 B) per entry, plus the Triton
    # top-k/top-p buffer of min(256, 128) rows x vocab fp32.
    rows, vocab = 256, 151936
    hand = rows * vocab * (2 + 4 + 4 + 4 + 4) + 128 * vocab * 4
    assert catalog.vllm_sampler_bytes(rows, vocab) == hand
    assert hand / 2**30 == pytest.approx(0.72, abs=0.01)  # twice the 0.36 GiB that 10 bytes an entry counted before
    assert catalog.vllm_sampler_bytes(10_000, vocab) == catalog.vllm_sampler_bytes(4096, vocab)  # one profiling batch at most
    info = catalog.model_info("Qwen/Qwen3-0.6B")
    assert catalog.vllm_fixed_bytes(info, 512) - catalog.vllm_fixed_bytes(info, 256) == pytest.approx(18 * 256 * vocab)


def test_without_vllm_a_run_that_cannot_fit_is_refused_before_renting_with_its_numbers(tmp_path):
    from autoslm.controller.placement import choose_offer
    from autoslm.errors import NoCapacity

    spec = _no_vllm_spec(tmp_path, "Qwen/Qwen3-14B")  # bf16: its weights alone are more than the card
    spec = spec.model_copy(update={"train": spec.train.model_copy(update={"quantization": "none"})})
    offer = judge_offer(spec, Offer("runpod", "RTX 4090", 1, 24, 0.5), has_vllm=False)
    assert offer.fits is False and not offer.usable and offer.generation == "transformers"
    assert "transformers generation needs ~" in offer.note and "generate()'s KV cache" in offer.note
    assert "for 8 completions of up to 2048 tokens" in offer.note  # one group: the smallest split there is
    with pytest.raises(NoCapacity, match="transformers generation needs"):
        choose_offer([offer])


def test_the_plan_table_shows_the_waves_beside_the_step_time_and_warns_per_gpu(tmp_path):
    from dataclasses import asdict

    from autoslm.views.plan import plan_table

    spec = jobspec(tmp_path, "Qwen/Qwen3-4B", gpu="RTX 4090", roomy=True)
    rows = [
        asdict(judge_offer(spec, Offer("runpod", gpu, 1, catalog.gpu_info(gpu).vram_gb, price)))
        for gpu, price in (("RTX 4090", 0.4), ("H100 80GB", 2.5))
    ]
    text = plan_table(rows, width=120)
    assert "step (waves)" in text
    small = next(r for r in rows if r["gpu"] == "RTX 4090")
    assert f"{small['step_s']:.0f} s ({small['waves']})" in text
    assert "warning: RTX 4090: vLLM's KV room" in text and f"~{small['waves']} waves" in text
    assert "warning: H100" not in text  # one wave there: nothing to warn about
