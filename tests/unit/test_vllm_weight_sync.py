"""The weights a GRPO run pushes into its colocated vLLM leave the frozen bf16 base weights bit for bit as
they were, and are the base plus the LoRA update computed in float32 and cast once.

TRL's own sync merges the adapter into the base in place and unmerges it, which bf16 cannot undo exactly
(TRL issue 6688). Here TRL's real ``VLLMGeneration.sync_weights`` runs with the worker's walk
(``engine.train.vllm_sync``) on the built-in model in bf16 (the pod's dtype), its vLLM engine a recorder of
what ``load_weights`` receives: the image stack has no vLLM (tests/colocated/test_vllm_sync.py runs the
real engine). Runs on both stacks (``-m worker``: ``make test`` on the image's pins, ``make test-fast`` on the laptop's).
"""

from __future__ import annotations

import pytest

from autoslm.spec import validate_dict

pytestmark = pytest.mark.worker

SYNCS = 50


class Engine:
    """Where TRL's colocated sync puts the weights (``llm.llm_engine.model_executor.driver_worker
    .model_runner.model.load_weights``), recording each sync's tensors."""

    def __init__(self):
        from types import SimpleNamespace

        runner = SimpleNamespace(model=self)
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(driver_worker=SimpleNamespace(model_runner=runner)))
        self.syncs: list[list] = []

    def load_weights(self, weights):
        self.syncs[-1] += [(name, t.clone()) for name, t in weights]

    def reset_prefix_cache(self):
        self.syncs.append([])


def _spec(tmp_path, **lora):
    return validate_dict(
        {
            "name": "sync",
            "model": "autoslm/tiny",
            "thinking": False,
            "environment": {"id": "autoslm/arith", "params": {"n_train": 8, "n_eval": 0}},
            "train": {
                "method": "grpo",
                "max_steps": 1,
                "prompts_per_step": 2,
                "group_size": 2,
                "max_completion_tokens": 4,
                "max_length": 64,
                **lora,
            },
            "artifacts": {"path": str(tmp_path / "store")},
        }
    )


def _bf16_model(spec, tmp_path, *, lora_config=None):
    """The built-in model in bf16 with its LoRA adapter, lora_B made nonzero (a trained adapter)."""
    import torch

    from autoslm.catalog import model_info
    from autoslm.engine.train import models
    from autoslm.engine.train.recipe import Device

    info = model_info(spec.model)
    path = models.resolve_model_path(spec.model, tmp_path / "home")
    model = models.load_model(path, dict(models.load_kwargs(spec, info, Device.detect()), dtype="bfloat16"))
    if lora_config is None:
        model = models.attach_adapter(model, spec, info)
    else:
        from peft import get_peft_model

        model = get_peft_model(model, lora_config)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name or "lora_magnitude" in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.01)
    return model


def _colocated(model):
    """The worker's VLLMGeneration around ``model``, its engine the recorder (its __init__ would start vLLM)."""
    from accelerate import Accelerator
    from trl.distributed import DistributedBackend

    from autoslm.engine.train.trainer import ExactSyncVLLMGeneration

    vg = ExactSyncVLLMGeneration.__new__(ExactSyncVLLMGeneration)
    vg.model, vg.accelerator, vg.mode, vg.enable_sleep_mode = model, Accelerator(), "colocate", False
    vg._dist = DistributedBackend(vg.accelerator)
    vg.llm = Engine()
    vg.llm.syncs.append([])
    return vg


def _trl_fix_name():
    """TRL's own parameter-name fix (``VLLMGeneration._fix_param_name_to_vllm``), bound without an engine."""
    from trl.generation.vllm_generation import VLLMGeneration

    return VLLMGeneration.__new__(VLLMGeneration)._fix_param_name_to_vllm


def _expected(model) -> dict:
    """{vLLM's name of a LoRA layer's weight: W + scale * B @ A, in float32, then cast to W's dtype}."""
    import torch

    out = {}
    with torch.no_grad():
        for name, m in model.named_modules():
            if hasattr(m, "lora_A") and "default" in m.lora_A:
                w = m.base_layer.weight
                delta = (m.lora_B["default"].weight.float() @ m.lora_A["default"].weight.float()) * m.scaling["default"]
                out[name.removeprefix("base_model.model.") + ".weight"] = (w.float() + delta).to(w.dtype)
    return out


def test_syncing_50_times_leaves_the_bf16_base_bit_identical_and_pushes_the_float32_merge(tmp_path):
    import torch
    from trl.generation.vllm_generation import VLLMGeneration

    model = _bf16_model(_spec(tmp_path), tmp_path)
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    assert {str(p.dtype) for p in base.values()} == {"torch.bfloat16"}
    expected = _expected(model)
    assert expected and all(
        not torch.equal(t, dict(model.named_parameters())[f"base_model.model.{n[: -len('.weight')]}.base_layer.weight"])
        for n, t in expected.items()
    )  # the update is big enough to show in bf16

    vg = _colocated(model)
    assert vg.prepare_exact_sync()
    for _ in range(SYNCS):
        vg.sync_weights()
    params = dict(model.named_parameters())
    moved = [n for n, t in base.items() if not torch.equal(t, params[n].detach())]
    assert not moved, f"{len(moved)} base weights changed, e.g. {moved[:3]}"

    syncs = vg.llm.syncs[:-1]
    assert len(syncs) == SYNCS
    first = dict(syncs[0])
    assert all(len(s) == len(syncs[0]) and all(torch.equal(t, first[n]) for n, t in s) for s in syncs)
    for name, want in expected.items():
        got = first[name]
        assert got.dtype == want.dtype
        # Within bf16 rounding: one fused float32 multiply-add against a separate product and sum.
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-6, msg=name)
    for name, t in first.items():
        if name not in expected:
            assert torch.equal(t, base[f"base_model.model.{name}"]), name

    # TRL's own walk yields the same names in the same order, and is what let the base drift.
    trl_names = [n for n, _ in VLLMGeneration._iter_named_params(vg)]
    assert trl_names == [n for n, _ in syncs[0]]
    for _ in range(SYNCS - 1):
        for _ in VLLMGeneration._iter_named_params(vg):
            pass
    params = dict(model.named_parameters())
    assert any(not torch.equal(t, params[n].detach()) for n, t in base.items())


@pytest.mark.parametrize("variant", [{"use_dora": True}, {"lora_bias": True}])
def test_dora_and_lora_bias_adapters_are_merged_as_peft_merges_them(tmp_path, variant):
    """A continued run may load an adapter of another kind: the pushed tensors are peft's own merge."""
    import copy

    import torch
    from peft import LoraConfig

    from autoslm.engine.train.vllm_sync import lora_layers, merged_named_params

    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    model = _bf16_model(_spec(tmp_path), tmp_path, lora_config=LoraConfig(r=4, lora_alpha=8, target_modules=targets, **variant))
    if variant.get("lora_bias"):
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name and name.endswith(".bias"):
                    p.add_(0.05)
            for m in model.modules():  # lora_bias needs a base bias to merge into
                if hasattr(m, "lora_A") and m.base_layer.bias is None:
                    m.base_layer.bias = torch.nn.Parameter(
                        torch.zeros(m.base_layer.out_features, dtype=torch.bfloat16), requires_grad=False
                    )
    assert lora_layers(model)
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    pushed = dict(merged_named_params(model, _trl_fix_name()))
    params = dict(model.named_parameters())
    assert all(torch.equal(t, params[n].detach()) for n, t in base.items())

    merged = copy.deepcopy(model).float().merge_and_unload(safe_merge=True)  # peft's merge, in float32
    reference = dict(merged.named_parameters())
    assert set(pushed) == set(reference)
    for name, got in pushed.items():
        torch.testing.assert_close(got.float(), reference[name].to(got.dtype).float(), rtol=2**-7, atol=1e-6, msg=name)
