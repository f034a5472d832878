"""Set-up time from the image and the model (catalog/setup.py), as `plan` counts and prints it."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoslm import catalog
from autoslm.catalog import setup
from autoslm.controller import images
from autoslm.controller.placement import judge_offer
from autoslm.providers.base import Offer
from autoslm.spec import load_spec

GSM8K = Path(__file__).resolve().parents[2] / "jobspecs" / "qwen2.5-0.5b-gsm8k-grpo-gpu.toml"
SMALL, BIG = "Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct"


def test_the_model_downloads_its_bf16_weights():
    assert catalog.model_download_gb(SMALL) == pytest.approx(0.49 * 2)
    assert catalog.model_download_gb("someone/unknown-model") is None


def test_set_up_grows_with_what_the_pod_pulls_installs_and_downloads():
    image = catalog.setup_estimate(SMALL, image="worker", vllm=True)
    runpod = catalog.setup_estimate(SMALL, image="pytorch", installs=("autoslm", "vllm"), vllm=True)
    vast = catalog.setup_estimate(SMALL, image="vllm", installs=("autoslm",), vllm=True)
    assert image.seconds < vast.seconds < runpod.seconds
    assert runpod.seconds - vast.seconds == pytest.approx(setup.INSTALL_S["vllm"] - (9.0 - 4.0) / setup.PULL_GB_S)
    big = catalog.setup_estimate(BIG, image="worker", vllm=True)
    gb = catalog.model_download_gb(BIG) - catalog.model_download_gb(SMALL)
    assert big.seconds - image.seconds == pytest.approx(gb / setup.HUB_GB_S)
    unknown = catalog.setup_estimate("someone/unknown-model", image="worker", vllm=True)
    assert unknown.seconds == pytest.approx(image.seconds + (14.0 - 0.98) / setup.HUB_GB_S)  # counted as 7B
    assert image.low_min < image.seconds / 60 < image.high_min
    assert runpod.basis == "pull 4.0 GB + install autoslm, vllm + model 1.0 GB + warm-up"


def test_plan_counts_each_providers_set_up_and_prints_its_range():
    spec = load_spec(GSM8K)
    assert images.pod_setup(spec, "runpod", "bootstrap").basis.startswith("pull 4.0 GB + install autoslm, vllm")
    assert images.pod_setup(spec, "vast", "bootstrap").basis.startswith("pull 9.0 GB + install autoslm +")
    on_runpod = judge_offer(spec, Offer("runpod", "L40S", 1, 48, 0.86), image_mode="bootstrap")
    on_vast = judge_offer(spec, Offer("vast", "L40S", 1, 48, 0.86), image_mode="bootstrap")
    published = judge_offer(spec, Offer("vast", "L40S", 1, 48, 0.86), image_mode="image")
    gap = images.pod_setup(spec, "runpod", "bootstrap").hours - images.pod_setup(spec, "vast", "bootstrap").hours
    assert on_runpod.est_hours - on_vast.est_hours == pytest.approx(gap, abs=0.011)
    assert published.est_hours < on_vast.est_hours
    setups = [images.pod_setup(spec, p, "bootstrap") for p in ("runpod", "vast")]
    line = images.describe(spec, exists=lambda ref: False)
    assert f"expected set-up {min(s.low_min for s in setups)}-{max(s.high_min for s in setups)} min" in line
