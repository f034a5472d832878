"""What building the GPU recipe exposed, fixed: the planner's vLLM term, the micro-batch and sleep mode it
decides, FSDP's loading, settings and refusals, the old-logprob pass, the attention-kernel fallback.

Runs on both stacks (``-m worker``: ``make test`` on the image's pins, ``make test-fast`` on the laptop's): the TRL configs are built for real by ``--print-config``'s code.
"""

from __future__ import annotations

import pytest

from autoslm import catalog
from autoslm.catalog import MODELS, GiB, kv_bytes_per_token, vram_breakdown
from autoslm.engine.train.print_config import build
from autoslm.errors import SpecError
from autoslm.recipes.grpo import GRPOTrain
from autoslm.spec import load_spec, validate_dict

pytestmark = pytest.mark.worker


def _spec(model="Qwen/Qwen3-8B", method="grpo", gpu="H100 80GB", env="autoslm/arith", compute=None, **train):
    raw = {
        "name": "fix",
        "model": model,
        "environment": {"id": env, "params": {"n_train": 64, "n_eval": 8}},
        "train": {"method": method, "max_steps": 10, **train},
        "compute": {"provider": "runpod", "gpu": gpu, **(compute or {})},
        "artifacts": {"store": "hf", "repo": "someone/runs"},
    }
    return validate_dict(raw)


def test_qwen3_8b_grpo_on_an_h100_fits_awake_at_a_micro_batch_above_1(tmp_path):
    """The acceptance check: the GRPO jobspec with Qwen3-8B, as ``--print-config --gpu "H100 80GB"``."""
    text = (load_spec.__globals__["Path"](__file__).resolve().parents[2] / "jobspecs/qwen3-0.6b-grpo-gpu.toml").read_text()
    path = tmp_path / "q8.toml"
    path.write_text(
        text.replace('model = "Qwen/Qwen3-0.6B"', 'model = "Qwen/Qwen3-8B"').replace(
            'gpu = ["RTX 4090", "RTX 3090", "L4"]', 'gpu = "H100 80GB"'
        )
    )
    spec = load_spec(path)
    out = build(spec, device_kind="cuda", gpu="H100 80GB")
    mem, t = out["memory"], out["trainer"]
    assert mem["fits"] is True and mem["sleep_mode"] is False and t["vllm_enable_sleep_mode"] is False, mem
    assert t["per_device_train_batch_size"] > 1
    # vLLM's hard need: its fixed start-up need (weights, profiling, CUDA graphs) + one request of
    # max_model_len tokens of KV (about 17 GiB), not a KV cache for all 256 rollouts (the old 34.8 GiB).
    info = MODELS["Qwen/Qwen3-8B"]
    rollouts = spec.train.prompts_per_step * spec.train.group_size
    want = (catalog.vllm_fixed_bytes(info, rollouts) + spec.train.vllm.max_model_len * kv_bytes_per_token(info)) / GiB
    assert mem["vllm_gb"] == pytest.approx(want, abs=0.01) and 16 < mem["vllm_gb"] < 18
    assert mem["vllm_kv_full_gb"] > mem["vllm_kv_gb"]  # all rollouts at once: a speed hint only


def test_kv_width_comes_from_the_checkpoints_kv_heads():
    # Qwen3-0.6B: 8 KV heads x 128 = 1024 wide (= hidden, not hidden / 4); K and V, 28 layers, bf16.
    assert kv_bytes_per_token(MODELS["Qwen/Qwen3-0.6B"]) == 2 * 28 * 1024 * 2
    assert kv_bytes_per_token(MODELS["Qwen/Qwen3-1.7B"]) == 2 * 28 * 1024 * 2
    assert all(m.kv_heads and m.head_dim for m in MODELS.values())


def test_a_small_vllm_share_fails_the_fit_but_never_shrinks_the_micro_batch():
    with pytest.raises(SpecError, match="vLLM would refuse to start"):  # validate refuses it first
        _spec(prompts_per_step=8, group_size=8, max_length=1024, vllm={"gpu_memory_utilization": 0.1})
    spec = _spec(prompts_per_step=8, group_size=8, max_length=1024)
    train = spec.train.model_copy(update={"vllm": spec.train.vllm.model_copy(update={"gpu_memory_utilization": 0.1})})
    out = build(spec.model_copy(update={"train": train}), device_kind="cuda")
    assert out["memory"]["fits"] is False and "gpu_memory_utilization" in out["memory"]["reason"]
    assert out["trainer"]["per_device_train_batch_size"] > 1


@pytest.mark.parametrize("gpu", ["RTX 4090", "L40S", "A100 80GB SXM", "H100 80GB"])
@pytest.mark.parametrize("model", ["Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B", "Qwen/Qwen3-8B"])
@pytest.mark.parametrize("max_length", [1024, 4096])
def test_sleep_mode_is_decided_at_the_micro_batch_the_step_runs(gpu, model, max_length):
    spec = _spec(model, gpu=gpu, prompts_per_step=16, group_size=8, max_length=max_length, max_completion_tokens=256)
    out = build(spec, device_kind="cuda")
    assert out["trainer"]["vllm_enable_sleep_mode"] is out["memory"]["sleep_mode"], out["memory"]


def test_multi_turn_and_dynamic_sampling_never_choose_sleep_mode():
    tight = dict(prompts_per_step=16, group_size=8, max_length=4096, vllm={"gpu_memory_utilization": 0.5})
    single = build(_spec("Qwen/Qwen3-4B", gpu="L4", **tight), device_kind="cuda")
    assert single["trainer"]["vllm_enable_sleep_mode"] is True  # the single-turn run needs it here
    for spec in (
        _spec("Qwen/Qwen3-4B", gpu="L4", dynamic_sampling=True, **tight),
        _spec("Qwen/Qwen3-4B", gpu="L4", env="autoslm/guess", **tight),
    ):
        out = build(spec, device_kind="cuda")
        assert out["trainer"]["vllm_enable_sleep_mode"] is False and out["memory"]["sleep_mode"] is False
        assert any("re-push every weight" in n for n in out["generation"]["notes"])
        assert out["memory"]["fits"] is False and "sleep_mode = true" in out["memory"]["reason"]
    asked = build(
        _spec("Qwen/Qwen3-4B", gpu="L4", dynamic_sampling=True, **{**tight, "vllm": {**tight["vllm"], "sleep_mode": True}}),
        device_kind="cuda",
    )
    assert asked["trainer"]["vllm_enable_sleep_mode"] is True


def test_fsdp_loads_on_rank_0_checkpoints_itself_and_saves_sharded():
    spec = _spec(
        "Qwen/Qwen3-14B", "sft", gpu="RTX 4090", batch_size=16, quantization="none", compute={"gpu_count": 4, "strategy": "fsdp"}
    )
    out = build(spec, device_kind="cuda")
    m, t = out["model"], out["trainer"]
    assert m["device_map"] is None and m["fsdp_loading"] is True  # never the whole model on every GPU
    assert t["fsdp"] is True  # the boolean form: the string "full_shard auto_wrap" is deprecated
    cfg = t["fsdp_config"]
    assert cfg["activation_checkpointing"] is True and cfg["state_dict_type"] == "SHARDED_STATE_DICT"
    assert cfg["cpu_ram_efficient_loading"] is True
    assert not t.get("gradient_checkpointing") and not t.get("activation_checkpointing")
    # The load peak: one shard per GPU, not 27.6 GiB of bf16 weights on each 24 GB card.
    assert out["memory"]["fits"] is True and out["memory"]["load_gb"] < 12
    ddp = vram_breakdown("Qwen/Qwen3-14B", spec.train, processes=4, strategy="ddp")
    assert ddp.load_gb > 27 and catalog.fit_report("Qwen/Qwen3-14B", "RTX 4090", spec.train, processes=4).ok is False


@pytest.mark.parametrize(
    "train,word",
    [
        ({"method": "sft", "batch_size": 16}, "4-bit"),  # Qwen3-14B's tier is 4-bit
        ({"method": "grpo"}, "4-bit"),
    ],
)
def test_validate_refuses_fsdp_with_4bit(train, word):
    with pytest.raises(SpecError) as e:
        _spec("Qwen/Qwen3-14B", compute={"gpu_count": 2, "strategy": "fsdp"}, **train)
    assert "compute.strategy" in str(e.value) and word in str(e.value)


def test_validate_refuses_fsdp_grpo_with_colocated_vllm(cli, tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text(
        'name = "x"\nmodel = "Qwen/Qwen3-1.7B"\n[environment]\nid = "autoslm/arith"\n'
        '[train]\nmethod = "grpo"\nmax_steps = 5\n[compute]\nprovider = "runpod"\ngpu = "RTX 4090"\n'
        'gpu_count = 2\nstrategy = "fsdp"\n[artifacts]\nstore = "hf"\nrepo = "a/b"\n'
    )
    r = cli("validate", str(spec))
    assert r.code == 2 and "compute.strategy" in r.err and "vLLM" in r.err and "Traceback" not in r.err
    assert len([ln for ln in r.err.splitlines() if "compute.strategy" in ln]) == 1
    ok = _spec("Qwen/Qwen3-1.7B", compute={"gpu_count": 2, "strategy": "ddp"})
    assert ok.compute.strategy == "ddp"


def test_step_time_counts_the_old_logprob_pass_with_vllm():
    base = GRPOTrain(prompts_per_step=8, group_size=8, max_length=1024, max_completion_tokens=256)
    vllm = catalog.step_seconds("Qwen/Qwen3-8B", "H100 SXM", base)
    qlora = catalog.step_seconds("Qwen/Qwen3-8B", "H100 SXM", base.model_copy(update={"quantization": "4bit"}))
    kl = catalog.step_seconds("Qwen/Qwen3-8B", "H100 SXM", base.model_copy(update={"beta": 0.04}))
    assert kl > vllm  # one more forward for the KL term
    # QLoRA generates with transformers (vLLM cannot load 4-bit weights): slower than vLLM's decode even with
    # 4-bit weights to read and no old-logprob pass; so is a bf16 run with vLLM turned off. (By how much is
    # the cost model's calibration: vLLM's floor is fitted to eager vLLM, catalog/cost.py.)
    off = catalog.step_seconds(
        "Qwen/Qwen3-8B", "H100 SXM", base.model_copy(update={"vllm": base.vllm.model_copy(update={"enabled": False})})
    )
    assert qlora > vllm and off > 1.15 * vllm


def test_an_attention_kernel_that_cannot_load_falls_back_and_says_so(tmp_path):
    from autoslm.engine.train import models
    from autoslm.engine.train.tiny import ensure_tiny

    path = ensure_tiny(tmp_path)
    seen = []
    model = models.load_model(
        str(path),
        {
            "auto_class": "AutoModelForCausalLM",
            "dtype": "float32",
            "attn_implementation": "flash_attention_2",
            "device_map": None,
        },
        on_fallback=lambda wanted, reason: seen.append((wanted, reason)),
    )
    assert model.config._attn_implementation == "sdpa"
    assert seen and seen[0][0] == "flash_attention_2" and seen[0][1]


def test_prefetch_fetches_no_kernel_where_the_recipe_uses_none():
    from autoslm.engine.pod.prefetch import attention_kernel

    spec = _spec("Qwen/Qwen3-0.6B", "sft", batch_size=8)
    assert attention_kernel({"AUTOSLM_JOBSPEC": spec.to_json()}) is None  # this CPU: sdpa
