"""vLLM's colocated share against vLLM 0.31's own start-up rule, worked by hand, and what `validate` says
about a share the user set.

vLLM 0.31 (vllm/v1/worker/gpu_worker.py, vllm/v1/core/kv_cache_utils.py) takes total x
gpu_memory_utilization. From it go the bf16 weights, the non-torch memory, the profiling peak -- a forward
of max_num_batched_tokens = 4096 tokens (one MLP's gate/up output, its activation and the residual
stream: tokens x (3 x intermediate + 2 x hidden) bf16 values) plus a sampler pass of 18 bytes x
max_num_seqs x vocab and a Triton buffer of min(max_num_seqs, 128) x vocab fp32 -- and the CUDA-graph
estimate. What is left is KV cache (2 x layers x kv_heads x
head_dim bf16 values per token), and it must hold one max_model_len request. The table below works that
out from each checkpoint's config.json (intermediate_size, not the planner's 3 x hidden) and compares it
with the planner's figures at the share "auto" picks.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autoslm import catalog
from autoslm.recipes.grpo import GRPOTrain, VLLMConfig

GiB = 1024**3
REPO = Path(__file__).resolve().parents[2]

# (model, params, hidden, intermediate_size, layers, kv_heads, head_dim, vocab) from the checkpoints' configs
CONFIGS = {
    "Qwen/Qwen3-0.6B": (0.6e9, 1024, 3072, 28, 8, 128, 151936),
    "Qwen/Qwen3-1.7B": (1.7e9, 2048, 6144, 28, 8, 128, 151936),
    "Qwen/Qwen3-4B": (4.0e9, 2560, 9728, 36, 8, 128, 151936),
    "Qwen/Qwen3-8B": (8.2e9, 4096, 12288, 36, 8, 128, 151936),
}
# (model, GPU, prompts_per_step, group_size, max_length)
PAIRS = [
    ("Qwen/Qwen3-0.6B", "RTX 4090", 32, 8, 512),
    ("Qwen/Qwen3-1.7B", "L4", 16, 4, 1024),
    ("Qwen/Qwen3-4B", "H100 80GB", 32, 8, 1024),
    ("Qwen/Qwen3-8B", "L40S", 32, 8, 512),
    ("Qwen/Qwen3-8B", "H100 80GB", 64, 8, 2048),
]


def by_hand(model: str, util: float, mem_gib: float, rollouts: int, max_len: int) -> tuple[float, float, float]:
    """(vLLM's need before KV, KV room at this share, one request's KV), in GiB, by vLLM 0.31's rule."""
    params, hidden, inter, layers, kv_heads, head_dim, vocab = CONFIGS[model]
    weights = params * 2
    forward = 4096 * (3 * inter + 2 * hidden) * 2
    sampler = 18 * min(rollouts, 4096) * vocab + 4 * min(rollouts, 128) * vocab
    non_torch, graphs = 0.25 * GiB, 0.5 * GiB
    fixed = weights + non_torch + forward + sampler + graphs
    kv_per_token = 2 * layers * kv_heads * head_dim * 2
    return fixed / GiB, mem_gib * util - fixed / GiB, max_len * kv_per_token / GiB


@pytest.mark.parametrize("model,gpu,prompts,group,max_len", PAIRS)
def test_the_auto_share_matches_vllms_own_rule_within_ten_percent(model, gpu, prompts, group, max_len):
    train = GRPOTrain(prompts_per_step=prompts, group_size=group, max_length=max_len, max_completion_tokens=max_len // 2)
    est = catalog.vram_breakdown(model, train)
    mem = catalog.gpu_info(gpu).mem_gib
    util, share = catalog.vllm_share(est, mem)
    fixed, room, one = by_hand(model, util, mem, prompts * group, max_len)
    ours_fixed, ours_room = est.vllm_gb - est.vllm_kv_gb, share - (est.vllm_gb - est.vllm_kv_gb)
    print(
        f"{model:16} {gpu:10} util {util:.2f}  fixed ours {ours_fixed:6.2f} vLLM {fixed:6.2f}  "
        f"KV room ours {ours_room:6.2f} vLLM {room:6.2f}  one request {one:.2f}"
    )
    assert ours_fixed == pytest.approx(fixed, rel=0.10)
    assert ours_room == pytest.approx(room, rel=0.10)
    assert est.vllm_kv_gb == pytest.approx(one, rel=0.01)
    # The share "auto" picks leaves vLLM KV room for at least one request and the stated minimum of a step's
    # rollouts, and either all of them or all the card has beside training (less the headroom).
    assert room >= max(one, catalog.VLLM_KV_MIN * est.vllm_kv_full_gb) * 0.99
    left = mem * 0.97 - catalog.vllm_headroom_gib(mem) - est.train_gb - fixed
    assert room >= min(est.vllm_kv_full_gb, left) - 0.01 * mem


def test_the_share_is_checked_against_memory_times_util_not_a_usable_fraction():
    train = GRPOTrain(prompts_per_step=32, group_size=8, max_length=512, vllm=VLLMConfig(gpu_memory_utilization=0.4))
    est = catalog.vram_breakdown("Qwen/Qwen3-0.6B", train)
    assert catalog.vllm_share(est, 24.0) == (0.4, pytest.approx(9.6))


def test_qwen3_8b_grpo_on_an_l40s_has_kv_room_for_the_minimum_and_warns_with_its_waves_below_a_quarter():
    from autoslm.engine.train.print_config import build
    from autoslm.spec import load_spec

    spec = load_spec(_spec_file("8b-l40s", "Qwen/Qwen3-8B", "L40S", ""))
    out = build(spec, device_kind="cuda")
    mem, gen = out["memory"], out["generation"]
    room = catalog.gpu_info("L40S").mem_gib * gen["vllm_gpu_memory_utilization"] - (mem["vllm_gb"] - mem["vllm_kv_gb"])
    assert mem["fits"] is False or mem["sleep_mode"] or room >= mem["vllm_kv_full_gb"] * catalog.VLLM_KV_MIN * 0.99, (mem, gen)
    if mem["fits"] and room < mem["vllm_kv_full_gb"] / 4:
        assert f"~{mem['waves']} waves" in mem["note"], mem
    if mem["fits"] is False:
        assert not any("side by side" in n for n in gen["notes"]), gen["notes"]


_TMP = {}


def _spec_file(name: str, model: str, gpu: str, vllm: str) -> str:
    import tempfile

    root = _TMP.setdefault("dir", Path(tempfile.mkdtemp(prefix="autoslm-vllm-share-")))
    text = (REPO / "jobspecs" / "qwen3-0.6b-grpo-gpu.toml").read_text()
    text = text.replace("Qwen/Qwen3-0.6B", model).replace('["RTX 4090", "RTX 3090", "L4"]', f'"{gpu}"')
    text = text.replace("vllm = { max_model_len = 768 }", f"vllm = {{ {vllm} }}")
    path = root / f"{name}.toml"
    path.write_text(text)
    return str(path)


def test_validate_warns_of_waves_and_refuses_a_share_below_one_request(tmp_path):
    def validate(path):
        return subprocess.run(
            [sys.executable, "-m", "autoslm", "validate", path],
            capture_output=True,
            text=True,
            cwd=str(tmp_path),
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "AUTOSLM_HOME": str(tmp_path / "home"), "COLUMNS": "300"},
        )

    waves = validate(_spec_file("waves", "Qwen/Qwen3-8B", "L40S", "gpu_memory_utilization = 0.39"))
    assert waves.returncode == 0, waves.stderr
    assert "train.vllm.gpu_memory_utilization: 0.39 of a L40S leaves vLLM" in waves.stderr
    assert "waves" in waves.stderr and '"auto" sizes it to what the card holds' in waves.stderr
    refused = validate(_spec_file("refused", "Qwen/Qwen3-8B", "L40S", "gpu_memory_utilization = 0.3"))
    assert refused.returncode == 2 and "less than one" in refused.stderr and "vLLM would refuse to start" in refused.stderr
    assert "Traceback" not in refused.stderr
    auto = validate(_spec_file("auto", "Qwen/Qwen3-4B", "RTX 4090", ""))  # fits, with fewer than a quarter at once
    assert auto.returncode == 0 and "refuse" not in auto.stderr, auto.stderr
    assert '"auto" on a RTX 4090' in auto.stderr and "waves" in auto.stderr
    fine = validate(_spec_file("auto-h100", "Qwen/Qwen3-8B", "H100 80GB", ""))
    assert fine.returncode == 0 and "warning" not in fine.stderr, fine.stderr


def test_grpo_without_vllm_counts_generates_kv_cache_for_the_generation_batch():
    kv = catalog.kv_bytes_per_token(catalog.model_info("Qwen/Qwen3-8B"))
    off = GRPOTrain(prompts_per_step=32, group_size=8, max_length=1024, vllm=VLLMConfig(enabled=False))
    est = catalog.vram_breakdown("Qwen/Qwen3-8B", off)
    assert est.vllm_gb == 0 and est.generate_kv_gb == pytest.approx(256 * 1024 * kv / GiB)
    assert est.train_gb >= est.static_gb + est.generate_kv_gb
    qlora = catalog.vram_breakdown("Qwen/Qwen3-8B", off.model_copy(update={"quantization": "4bit", "vllm": VLLMConfig()}))
    assert qlora.vllm_gb == 0 and qlora.generate_kv_gb == est.generate_kv_gb  # bf16 KV under 4-bit weights too
    on = catalog.vram_breakdown("Qwen/Qwen3-8B", off.model_copy(update={"vllm": VLLMConfig()}))
    assert on.generate_kv_gb == 0 and on.vllm_gb > 0


def test_the_notes_never_say_side_by_side_where_it_does_not_fit():
    from autoslm.engine.train.gpu import grpo_generation_config
    from autoslm.spec import load_spec

    spec = load_spec(_spec_file("8b-4090", "Qwen/Qwen3-8B", "H100 80GB", ""))
    info = catalog.model_info("Qwen/Qwen3-8B")
    for gib, fits in ((24.0, False), (79.6, True)):
        notes: list[str] = []
        kw = grpo_generation_config(spec, info, True, True, notes=notes, gpu_mem_gib=gib, micro=4)
        report = catalog.fit_report(info, gib, spec.train.model_copy(update={"micro_batch_size": 4}))
        assert bool(report.ok) is fits, report
        assert any("side by side" in n for n in notes) is (fits and not report.sleep_mode), notes
        assert kw["vllm_gpu_memory_utilization"] == report.vllm_util
