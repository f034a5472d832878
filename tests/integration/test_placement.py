"""Placement across the fake RunPod and fake Vast: offers in failover order, fit, cost, and the choice.

.venv/bin/python -m pytest tests/integration/test_placement.py -q
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from autoslm.controller.placement import choose_offer, plan_offers, plan_placement
from autoslm.errors import NoCapacity, ProviderAuthError
from autoslm.providers.http import RetryPolicy
from autoslm.providers.runpod.provider import RunPodProvider
from autoslm.providers.vast.provider import VastProvider
from autoslm.spec import validate_dict
from tests.fakes.runpod import fake_runpod  # noqa: F401 - pytest fixture
from tests.fakes.vast import fake_vast  # noqa: F401 - pytest fixture

FAST = RetryPolicy(attempts=2, backoff_s=0.0)


def job(model="Qwen/Qwen3-0.6B", train=None, **compute):
    compute.setdefault("provider", ["runpod", "vast"])
    compute.setdefault("gpu", ["RTX 4090", "L40S"])
    return validate_dict(
        {
            "name": "place",
            "model": model,
            "environment": {"id": "autoslm/arith"},
            "train": train or {"method": "sft", "max_steps": 200},
            "compute": compute,
            "artifacts": {"store": "hf", "repo": "someone/runs"},
            "limits": {"max_hours": 2},
        }
    )


@pytest.fixture
def providers(fake_runpod, fake_vast):  # noqa: F811
    rp = RunPodProvider(fake_runpod.api_key, base_url=fake_runpod.url, timeout=2.0, retry=FAST, sleep=lambda s: None)
    va = VastProvider(fake_vast.api_key, base_url=fake_vast.url, timeout=2.0, retry=FAST, sleep=lambda s: None)
    yield {"runpod": rp, "vast": va}
    rp.close()
    va.close()


def test_offers_come_in_failover_order_with_fit_and_cost(providers, fake_runpod, fake_vast):  # noqa: F811
    planned = plan_offers(job(), providers)
    assert [p.provider for p in planned] == ["runpod", "runpod", "vast", "vast", "vast"]
    assert [(p.gpu, p.price_per_hour) for p in planned[:2]] == [("RTX 4090", 0.69), ("L40S", 0.86)]
    assert [p.price_per_hour for p in planned[2:]] == [0.35, 0.42, 0.65]
    for p in planned:
        assert p.usable and p.fits is True and 0 < p.vram_need_gb < p.vram_gb
        assert 0 < p.estimated_cost_usd <= p.max_cost_usd == pytest.approx(p.price_per_hour * 2, abs=0.01)
        assert p.est_hours is not None and "200 steps" in p.note
    assert choose_offer(planned).provider == "runpod"
    # Planning spends nothing.
    assert fake_runpod.launch_calls == [] and fake_vast.launch_calls == []
    json.dumps([dataclasses.asdict(p) for p in planned])  # what `autoslm plan --json` prints


def test_interruptible_skips_runpod(providers):
    planned = plan_offers(job(interruptible=True), providers)
    runpod = [p for p in planned if p.provider == "runpod"]
    assert runpod and all(not p.usable and "no interruptible" in p.note for p in runpod)
    chosen = choose_offer(planned)
    assert chosen.provider == "vast" and chosen.interruptible and chosen.price_per_hour == pytest.approx(0.198)


def test_a_model_too_big_for_the_card_is_not_usable(providers):
    # Judged at the micro-batch the pod would pick (8B bf16 SFT runs on a 4090 a few sequences a pass):
    # 14B in bf16 is too big for the card at any micro-batch.
    planned = plan_offers(job("Qwen/Qwen3-14B", {"method": "sft", "max_steps": 50, "quantization": "none"}), providers)
    by_gpu = {(p.provider, p.gpu): p for p in planned}
    assert by_gpu[("runpod", "RTX 4090")].fits is False and "needs ~" in by_gpu[("runpod", "RTX 4090")].note
    assert by_gpu[("runpod", "L40S")].fits is True
    assert choose_offer(planned).gpu == "L40S"


def test_grpo_counts_the_vllm_share(providers):
    # Qwen3-8B GRPO: a 24 GB card cannot hold training beside vLLM's share; an L40S can, with vLLM's
    # share sized by its start-up rule and grown into what training leaves (docs/worker-image.md).
    planned = plan_offers(
        job("Qwen/Qwen3-8B", {"method": "grpo", "max_steps": 20}, gpu=["RTX 4090", "L40S", "H100 SXM"]), providers
    )
    fits = {p.gpu: p.fits for p in planned if p.provider == "runpod"}
    assert fits == {"RTX 4090": False, "L40S": True, "H100 SXM": True}
    need = {p.gpu: p.vram_need_gb for p in planned if p.provider == "runpod"}
    assert need["RTX 4090"] > 24 and need["L40S"] <= 48
    assert choose_offer(planned).gpu == "L40S"


def test_a_money_limit_below_the_estimate_is_not_usable(providers):
    spec = validate_dict(
        {
            "name": "place",
            "model": "Qwen/Qwen3-0.6B",
            "environment": {"id": "autoslm/arith"},
            "train": {"method": "sft", "max_steps": 100000},
            "compute": {"provider": "vast", "gpu": "RTX 4090"},
            "artifacts": {"store": "hf", "repo": "someone/runs"},
            "limits": {"max_hours": 100, "max_usd": 1.0},
        }
    )
    planned = plan_offers(spec, providers)
    assert planned and all(not p.usable and "max_usd" in p.note for p in planned)
    assert all(p.max_cost_usd <= 1.0 for p in planned)
    with pytest.raises(NoCapacity, match="max_usd"):
        choose_offer(planned)


def test_a_provider_that_cannot_be_asked_does_not_hide_the_others(fake_runpod, providers):  # noqa: F811
    broken = dict(providers, runpod=RunPodProvider("wrong-key-123456789", base_url=fake_runpod.url, timeout=2.0, retry=FAST))
    placement = plan_placement(job(), broken)
    assert {p.provider for p in placement.offers} == {"vast"}
    assert isinstance(placement.problems["runpod"], ProviderAuthError)
    assert choose_offer(placement.offers, placement.problems).provider == "vast"


def test_when_no_provider_answers_its_error_is_raised(fake_runpod, fake_vast):  # noqa: F811
    broken = {
        "runpod": RunPodProvider("wrong-key-123456789", base_url=fake_runpod.url, timeout=2.0, retry=FAST),
        "vast": VastProvider("wrong-key-123456789", base_url=fake_vast.url, timeout=2.0, retry=FAST),
    }
    with pytest.raises(ProviderAuthError, match="RUNPOD_API_KEY"):
        plan_offers(job(), broken)


def test_no_capacity_anywhere(providers, fake_runpod, fake_vast):  # noqa: F811
    fake_runpod.no_capacity(True)
    fake_vast.no_capacity(True)
    assert plan_offers(job(), providers) == []
    with pytest.raises(NoCapacity):
        choose_offer([])


def test_n_gpu_offers_are_priced_per_pod_and_memory_is_checked_per_gpu(providers, fake_runpod, fake_vast):  # noqa: F811
    sft8b = {"method": "sft", "max_steps": 50, "max_length": 2048, "quantization": "none"}
    ddp = plan_offers(job("Qwen/Qwen3-14B", sft8b, gpu="RTX 4090", gpu_count=2), providers)
    # RunPod prices gpuCount x the GPU's price; Vast lists whole machines with num_gpus = 2.
    assert [(p.provider, p.gpu_count, p.price_per_hour) for p in ddp] == [("runpod", 2, 1.38), ("vast", 2, 0.70)]
    # DDP holds the whole 14B model on each 24 GB card: it does not fit, and the note says what would.
    assert all(p.fits is False and "per GPU" in p.note and "fsdp" in p.note for p in ddp)
    fsdp = plan_offers(job("Qwen/Qwen3-14B", sft8b, gpu="RTX 4090", gpu_count=2, strategy="fsdp"), providers)
    assert all(p.fits is True and p.usable for p in fsdp)
    assert all(p.vram_need_gb < q.vram_need_gb for p, q in zip(fsdp, ddp))
    assert choose_offer(fsdp).provider == "runpod"
    assert fake_runpod.launch_calls == [] and fake_vast.launch_calls == []


def test_host_ram_is_checked_where_the_provider_says_it(providers, fake_vast):  # noqa: F811
    from tests.fakes.vast import _offer

    # Two 4 x H100 machines on Vast, one with 24 GB of host RAM for the pod, one with 256 GB.
    fake_vast.offers[201] = _offer(201, "H100 SXM", 4, 81559, 7.20, 4.0, 0.99, "Finland, FI", cpu_ram=24 * 1024)
    fake_vast.offers[202] = _offer(202, "H100 SXM", 4, 81559, 7.60, 4.2, 0.99, "Finland, FI", cpu_ram=256 * 1024)
    sft = {"method": "sft", "max_steps": 50, "max_length": 2048, "quantization": "none"}
    fsdp = plan_offers(job("Qwen/Qwen3-14B", sft, provider=["vast"], gpu="H100 SXM", gpu_count=4, strategy="fsdp"), providers)
    small, big = sorted(fsdp, key=lambda p: p.ram_gb)
    # FSDP: rank 0 reads the whole bf16 model (~27.5 GiB) into host RAM, beside 4 processes' own memory.
    assert 35 < small.ram_need_gb == big.ram_need_gb < 45
    assert small.fits is True and not small.usable
    assert "host RAM" in small.note and "rank 0 of 4 FSDP processes" in small.note and "24 GB" in small.note
    assert big.usable and choose_offer(fsdp).offer_id == "202"
    # DDP (one process per GPU, each streaming its own copy onto its GPU a shard at a time) needs less.
    ddp = plan_offers(job("Qwen/Qwen3-0.6B", sft, provider=["vast"], gpu="H100 SXM", gpu_count=4), providers)
    assert all(p.usable and p.ram_need_gb < 24 for p in ddp)
    # RunPod says nothing of host RAM: the need is shown, nothing is refused for it.
    rp = plan_offers(job("Qwen/Qwen3-14B", sft, provider=["runpod"], gpu="H100 SXM", gpu_count=4, strategy="fsdp"), providers)
    assert rp and all(p.ram_gb is None and p.ram_need_gb == small.ram_need_gb for p in rp)


def test_launch_when_every_offer_is_over_the_money_limit_says_which_limit_in_one_hint(cli, tmp_path, fake_runpod):  # noqa: F811
    spec = tmp_path / "over.toml"
    spec.write_text(
        'name = "over"\nmodel = "Qwen/Qwen3-0.6B"\n[environment]\nid = "autoslm/arith"\n[train]\n'
        'method = "sft"\nmax_steps = 100000\n[compute]\nprovider = "runpod"\ngpu = ["RTX 4090", "L40S"]\n'
        '[artifacts]\nstore = "hf"\nrepo = "someone/runs"\n[limits]\nmax_hours = 100\nmax_usd = 1\n'
    )
    r = cli("launch", str(spec), "--yes", env=fake_runpod.env())
    assert r.code == 3, r.out + r.err
    last = r.out.strip().splitlines()[-1]
    assert last.startswith("no offer is usable: ") and "raise limits.max_usd" in last, r.out
    assert fake_runpod.launch_calls == []
